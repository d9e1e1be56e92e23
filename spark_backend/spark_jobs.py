"""Micro-batches as Spark jobs: ``--spark-dispatch jobs``, and the resident dispatch's stand-in
while no resident worker is connected (cancelled as soon as one is).

A job per micro-batch is a DataFrame with a row per task computed by ``mapInPandas``; nothing
but Spark connects anywhere, at 0.2-0.5 s per micro-batch.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa

from spark_backend.resident import ResidentWorkers
from spark_backend.sessions import SparkSession
from udf_agent.compute.contract import RESULT_SCHEMA, TASK_SCHEMA, Job, spark_ddl
from udf_agent.compute.run import run_partition
from udf_agent.errors import first_line

if TYPE_CHECKING:
    import pandas as pd

# What a Spark job per micro-batch declares: the compute contract's own schemas, the results'
# text as UTF-8 bytes: Spark 4's Python workers fail to convert a string column of mapInPandas
# output for a Spark 3.5 Connect client, and bytes cross every pairing of client and server.
TASK_DDL = spark_ddl(TASK_SCHEMA)
TEXT_COLUMNS = tuple(f.name for f in RESULT_SCHEMA if pa.types.is_string(f.type))
RESULT_DDL = spark_ddl(pa.schema([pa.field(f.name, pa.binary()) if f.name in TEXT_COLUMNS else f for f in RESULT_SCHEMA]))

# How often a micro-batch running as a Spark job checks whether a resident worker connected.
CANCEL_CHECK_INTERVAL = 0.5


def run_partition_text_as_bytes(job: Job, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """``run_partition`` on an executor, its results' text columns encoded (RESULT_DDL)."""
    for results in run_partition(job, frames):
        for column in TEXT_COLUMNS:
            results[column] = [value.encode() if isinstance(value, str) else None for value in results[column]]
        yield results


def run_as_job(session: SparkSession, job: Job, tasks: pa.Table) -> pa.Table:
    """The micro-batch's results, in task order, from one Spark job."""
    frame = session.dataframes.createDataFrame(tasks.to_pandas(), schema=TASK_DDL)
    results = frame.mapInPandas(functools.partial(run_partition_text_as_bytes, job), schema=RESULT_DDL).toPandas()
    results = results.sort_values("seq", kind="stable").reset_index(drop=True)
    for column in ("output", "history"):
        results[column] = [bytes(v) if v is not None else None for v in results[column]]
    for column in TEXT_COLUMNS:
        results[column] = [bytes(v).decode() if v is not None else None for v in results[column]]
    return pa.Table.from_pandas(results[RESULT_SCHEMA.names], schema=RESULT_SCHEMA, preserve_index=False)


def run_until_resident(session: SparkSession, resident: ResidentWorkers, job: Job, tasks: pa.Table, batch_timeout: float, tag: str) -> pa.Table | None:
    """The micro-batch as a Spark job (its jobs tagged ``tag``), cancelled (None) as soon as a
    resident worker connects: the job may be waiting for the very cores the resident tasks now
    hold. Past ``batch_timeout`` it is cancelled and fails (a cluster that forgot the
    application, a master restarted without recovery, gives it no core ever)."""
    done = threading.Event()
    cancelled = threading.Event()
    timed_out = threading.Event()
    deadline = time.monotonic() + batch_timeout

    def cancel_once_resident_or_late() -> None:
        while not done.wait(CANCEL_CHECK_INTERVAL):
            late = time.monotonic() >= deadline
            if late:
                timed_out.set()
            elif resident.connected():
                cancelled.set()
            if late or cancelled.is_set():
                session.cancel(tag)  # again until the job ends: it may not be submitted yet

    threading.Thread(target=cancel_once_resident_or_late, name="spark-fallback-cancel", daemon=True).start()
    session.tag_jobs(tag)
    try:
        return run_as_job(session, job, tasks)
    except Exception as exc:
        if cancelled.is_set():
            return None
        if timed_out.is_set():
            raise RuntimeError(
                f"the micro-batch ran as a Spark job (no resident worker connected) for longer than --batch-timeout ({batch_timeout:g} s): "
                f"Spark gave it no core or did not finish it; cancelled ({first_line(exc)})"
            ) from exc
        raise
    finally:
        done.set()
        session.untag_jobs(tag)
