"""A compute engine backed by a SparkSession.

A micro-batch is a list of tasks, one per group (or Kapacitor batch): its
points as the bytes Kapacitor sent, its kept history the same way. Two ways
to hand them to Spark (``SparkSettings.dispatch``):

- ``resident`` (default): Spark's resident workers (``resident.py``), one
  long-running ``mapInPandas`` task per slot, fed over a socket: a micro-batch
  costs milliseconds beyond its computation.
- ``jobs``: one Spark job per micro-batch (``spark_jobs.py``), a DataFrame with a row per task
  computed by ``mapInPandas``. Nothing but Spark connects anywhere, for clusters
  whose executors cannot reach the agent, at 0.2-0.5 s per micro-batch.

Either way one row per group means a group is never split across partitions,
and Spark calls Python once per partition rather than once per group: the
measured per-group cost of ``applyInPandas`` (5-7 s for 1,000 groups) rules it
out for Kapacitor, where many small groups are the normal case.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Generator, Iterator

import pandas as pd
import pyarrow as pa

from spark_backend.growth import CoreGrowth
from spark_backend.resident import ResidentWorkers, Results, Tasks
from spark_backend.resident_slots import FIRST_WORKER_WAIT, START_TIMEOUT, NoResidentWorker
from spark_backend.sessions import SparkSession, SparkSessionLost, SparkStartError, open_session
from spark_backend.settings import SparkSettings
from spark_backend.spark_jobs import run_as_job, run_until_resident
from udf_agent.api import UDFSpec
from udf_agent.collector import freeze_startup_objects
from udf_agent.compute.contract import Job
from udf_agent.compute.engine import EngineStartError, Tenant
from udf_agent.compute.handlers import HandlerCall, HandlerOutcome
from udf_agent.compute.packed import ResultColumns, StreamTasks
from udf_agent.errors import first_line
from udf_agent.redaction import redacted_url

log = logging.getLogger(__name__)

# How often the log says how long Spark has been starting.
START_REPORT_INTERVAL = 5.0

# How often a micro-batch whose Spark Connect session was lost tries to open a new one.
REOPEN_INTERVAL = 1.0
# A micro-batch asks whether Spark's JVM died (a waitpid) when the last one asked this long
# ago or more, or when it failed: not a system call every micro-batch at a trickle.
JVM_CHECK_INTERVAL = 0.1


class SparkEngine:
    """Starts a SparkSession in the background on first use and runs jobs on it.

    One engine may serve many agent sessions at once (the socket server):
    Spark accepts jobs from several threads.
    """

    def __init__(self, settings: SparkSettings | None = None, session: SparkSession | None = None):
        self.settings = settings or SparkSettings()
        self._session = session
        self._error: BaseException | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._resident: ResidentWorkers | None = None
        self._fell_back = False
        self._jvm_checked_at = float("-inf")
        self._fallbacks = itertools.count()
        if session is not None:
            self._start_dispatch(session)
            self._ready.set()

    @property
    def name(self) -> str:
        return "on Spark's resident workers" if self.settings.dispatch == "resident" else "on Spark, a job per micro-batch"

    @property
    def resident(self) -> ResidentWorkers | None:
        return self._resident

    @property
    def session(self) -> SparkSession | None:
        """The Spark session, once started."""
        return self._session

    def start(self) -> None:
        with self._lock:
            if self._thread is not None or self._ready.is_set():
                return
            self._thread = threading.Thread(target=self._start_session, name="spark-start", daemon=True)
            self._thread.start()

    def ready(self) -> bool:
        # A Spark that failed to start is ready too: its run fails at once, saying why
        # (no Java, master unreachable), rather than micro-batches quietly staying local.
        return self._ready.is_set()

    def wait_ready(self) -> None:
        self.start()
        self._ready.wait()
        if isinstance(self._error, SparkStartError):
            raise self._error
        if self._error is not None:
            raise SparkStartError(f"Spark did not start ({redacted_url(self.settings.url)}): {first_line(self._error)}") from self._error

    def run(self, job: Job, tasks: pa.Table, tenant: Tenant | None = None) -> pa.Table:
        """Tasks of ``compute.TASK_SCHEMA`` in, results of ``compute.RESULT_SCHEMA`` out, in task
        order; the resident slots are shared fairly between tenants (tasks)."""
        results = self._run_on_session(job, tasks, tenant)
        assert isinstance(results, pa.Table)
        return results

    def run_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None = None) -> ResultColumns:
        """``run`` packed: so they travel to the resident workers; a Spark job reads its table."""
        results = self._run_on_session(job, tasks, tenant)
        assert isinstance(results, ResultColumns)
        return results

    def chain_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None, follow: Callable[[], StreamTasks | None]) -> Generator[ResultColumns, None, None]:
        """``ResidentWorkers.chain_stream`` while the resident workers serve and the session is
        sound; else ``run_stream`` of ``tasks`` alone (it reopens, relaunches or falls back to a
        Spark job as a micro-batch needs). An error mid-chain ends it: the caller computes
        what it did not answer with ``run_stream``."""
        resident, session = self._resident, self._session
        # No worker connected: run_stream waits for one, or falls back to a Spark job, once.
        if (
            not self._ready.is_set() or resident is None or session is None or self._fell_back or not resident.connected()
            or self._jvm_exit_code() is not None or session.lost(ask=False) is not None
        ):
            yield self.run_stream(job, tasks, tenant)
            return
        ship_by_value(job.spec)
        with session.in_use(on_lost=resident.stop):
            yield from resident.chain_stream(job, tasks, tenant, follow)

    def _run_on_session(self, job: Job, tasks: Tasks, tenant: Tenant | None) -> Results:
        exit_code = self._jvm_exit_code() if self._ready.is_set() else None
        if exit_code is not None:
            # Resident workers may outlive their JVM, but nothing supervises them any more.
            self._replace_dead_jvm(exit_code)
        self.wait_ready()
        # Once Spark is up: importing pyspark here while the thread starting Spark imports it
        # can leave this one a partly initialised pyspark.sql (a circular-import error).
        ship_by_value(job.spec)
        deadline = time.monotonic() + self.settings.batch_timeout
        while True:
            session, resident = self._session, self._resident
            assert session is not None  # ready
            cause = session.lost(ask=False)
            if cause is None:
                try:
                    # A session found lost meanwhile ends the wait for its resident workers.
                    with session.in_use(on_lost=resident.stop if resident is not None else None):
                        return self._run(job, tasks, tenant)
                except Exception:
                    exit_code = self._jvm_exit_code(now=True)
                    if exit_code is not None:
                        self._replace_dead_jvm(exit_code)
                        raise
                    cause = session.lost()
                    if cause is None:
                        raise
            # The windows live in the agent: the same micro-batch on a new session is enough.
            self._open_new_session(session, cause, deadline)

    def run_handler(self, call: HandlerCall, tenant: Tenant | None = None) -> HandlerOutcome:
        """A Handler script's requests, on the resident worker its handler lives on."""
        exit_code = self._jvm_exit_code() if self._ready.is_set() else None
        if exit_code is not None:
            self._replace_dead_jvm(exit_code)
        self.wait_ready()
        session, resident = self._session, self._resident
        assert session is not None  # ready
        if resident is None:
            raise EngineStartError("a Kapacitor Handler script's handler lives on a resident worker: it cannot run with --spark-dispatch jobs")
        with session.in_use(on_lost=resident.stop):
            return resident.run_handler(call, tenant)

    def forget_handler(self, task: str) -> None:
        resident = self._resident
        if resident is not None:
            resident.forget_handler(task)

    def _open_new_session(self, lost: SparkSession, cause: str, deadline: float) -> None:
        """Replaces ``lost``, a Spark Connect session its server closed (after its session
        timeout without a request) or forgot (it restarted), and relaunches the resident
        workers on the new one; tries until ``deadline`` (the micro-batch's --batch-timeout),
        then SparkSessionLost says what was tried. One micro-batch replaces it; the others
        wait for the engine's lock and use the new session."""
        with self._lock:
            if self._session is not lost:
                return  # replaced meanwhile
            started = time.monotonic()
            if started >= deadline:
                raise SparkSessionLost(f"the Spark Connect session on {lost.url} was lost ({cause}) and the micro-batch is past its --batch-timeout ({self.settings.batch_timeout:g} s)")
            log.warning("the Spark Connect session on %s was lost (%s): opening a new one and computing the micro-batch again", lost.url, cause)
            # Ending the old resident workers and closing the lost session wait for their last
            # requests to give up (seconds, when the server is gone): in the background.
            retired, self._resident = self._resident, None
            threading.Thread(target=_retire_session, args=(retired, lost), name="spark-session-retire", daemon=True).start()
            attempts = 0
            while True:
                attempts += 1
                try:
                    session = open_session(self.settings)
                    break
                except SparkStartError as exc:
                    failure = first_line(exc)
                if time.monotonic() + REOPEN_INTERVAL >= deadline:
                    raise SparkSessionLost(
                        f"the Spark Connect session on {lost.url} was lost ({cause}); no new one could be opened within the micro-batch's "
                        f"--batch-timeout ({self.settings.batch_timeout:g} s): {attempts} attempt(s) over {time.monotonic() - started:.0f} s, the last: {failure}"
                    )
                time.sleep(REOPEN_INTERVAL)
            try:
                self._start_dispatch(session)
            except BaseException:
                session.stop()
                raise
            self._session = session
            log.info("a new Spark Connect session after %.1f s (%d attempt(s)): micro-batches run %s", time.monotonic() - started, attempts, self.name)

    def _jvm_exit_code(self, now: bool = False) -> int | None:
        """Spark's JVM's exit code if it died, asked ``JVM_CHECK_INTERVAL`` after the last time or ``now``; else None."""
        at = time.monotonic()
        if not now and at - self._jvm_checked_at < JVM_CHECK_INTERVAL:
            return None
        self._jvm_checked_at = at
        session = self._session
        return None if session is None else session.jvm_exit_code()

    def _run(self, job: Job, tasks: Tasks, tenant: Tenant | None) -> Results:
        resident = self._resident
        if resident is None:
            assert self._session is not None  # ready
            return _as_given(tasks, run_as_job(self._session, job, _table_of(tasks)))
        while True:
            try:
                results = resident.run(job, tasks, tenant)
            except NoResidentWorker as exc:
                if not self._fell_back:  # each switch is logged, not every micro-batch
                    log.info("%s: micro-batches run as Spark jobs until one connects", exc)
                self._fell_back = True
                assert self._session is not None  # ready
                tag = f"udf-agent-fallback-{os.getpid()}-{id(self)}-{next(self._fallbacks)}"
                fallback = run_until_resident(self._session, resident, job, _table_of(tasks), self.settings.batch_timeout, tag)
                if fallback is None:
                    continue  # a worker connected: the micro-batch goes to it
                return _as_given(tasks, fallback)
            if self._fell_back:
                log.info("micro-batches run on Spark's resident workers again")
            self._fell_back = False
            return results

    def stop(self) -> None:
        if self._resident is not None:
            self._resident.stop()
        if self._ready.is_set() and self._session is not None and self._error is None:
            try:
                self._session.stop()
            except Exception as exc:  # a JVM that died meanwhile: nothing left to stop
                log.warning("stopping Spark failed: %s", first_line(exc))

    def _start_session(self) -> None:
        started = time.monotonic()
        threading.Thread(target=self._report_start, args=(started,), name="spark-start-clock", daemon=True).start()
        try:
            session = open_session(self.settings)
            self._start_dispatch(session)
            self._session = session
            log.info("compute engine ready in %.1f s: micro-batches run %s", time.monotonic() - started, self.name)
            freeze_startup_objects("Spark ready")
        except BaseException as exc:  # reported to whoever waits for the engine
            log.error("Spark failed to start after %.1f s: %s", time.monotonic() - started, exc)
            self._error = exc
        finally:
            self._ready.set()

    def _report_start(self, started: float) -> None:
        """Logs the time spent so far every few seconds while Spark starts (it can take 30 s)."""
        while not self._ready.wait(START_REPORT_INTERVAL):
            log.info("waiting for Spark to start: %.0f s so far", time.monotonic() - started)

    def _replace_dead_jvm(self, exit_code: int) -> None:
        """The JVM died (killed, out of memory): a new Spark starts in the background; the
        micro-batch under way fails if it needed the old one, the next ones wait for the new."""
        from pyspark import SparkContext
        from pyspark.sql import SparkSession as ClassicSparkSession

        with self._lock:
            if not self._ready.is_set():
                return  # already being replaced
            log.error("Spark's JVM exited (code %s): starting a new Spark for the next micro-batches", exit_code)
            self._ready.clear()
            if self._resident is not None:
                self._resident.stop()
            self._resident = None
            self._session = None
            self._error = None
            self._thread = None
            # PySpark keeps the dead gateway in class attributes; a new session needs them cleared.
            SparkContext._gateway = None
            SparkContext._jvm = None
            SparkContext._active_spark_context = None
            ClassicSparkSession._instantiatedSession = None
            ClassicSparkSession._activeSession = None
        self.start()

    def _start_dispatch(self, session: SparkSession) -> None:
        if self.settings.dispatch == "resident":
            growth = CoreGrowth(self.settings.max_cores, time.monotonic()) if self.settings.grows() else None
            slots = self.settings.resident_slots or (growth.wanted if growth is not None else session.cores())
            # An embedded Spark's cores are this process's own, so its workers are sure to
            # come: wait for them. A cluster or Connect server may have no core free for one
            # yet; micro-batches then run as Spark jobs, which its scheduler shares.
            first_worker_wait = START_TIMEOUT if session.url.startswith("local") else FIRST_WORKER_WAIT
            memory = self.settings.worker_memory_bytes(self.settings.max_cores or slots)
            resident = ResidentWorkers(session, slots, session.agent_host(), self.settings.batch_timeout, self.settings.resident_idle, first_worker_wait, memory, growth)
            resident.start()
            resident.wait_for_workers(1, first_worker_wait)
            self._resident = resident
        else:
            try:
                _warm_workers(session)
            except Exception as exc:  # only an optimisation: the first micro-batch will start workers itself
                log.warning("warming Spark's Python workers failed: %s", first_line(exc))


def _table_of(tasks: Tasks) -> pa.Table:
    """The task table a Spark job reads."""
    return tasks.table() if isinstance(tasks, StreamTasks) else tasks


def _as_given(tasks: Tasks, results: pa.Table) -> Results:
    """A Spark job's result table, in the form ``tasks`` came in."""
    return ResultColumns.of_table(results) if isinstance(tasks, StreamTasks) else results


def _retire_session(resident: ResidentWorkers | None, session: SparkSession) -> None:
    if resident is not None:
        resident.stop()
    session.stop()


_SHIPPED: set[str] = set()
# The UDF modules whose shipping is decided (shipped or not): asked every micro-batch.
_DECIDED: set[str] = set()


def ship_by_value(spec: UDFSpec) -> None:
    """The UDF's own code (its top-level package or module, unless installed in
    site-packages) travels inside the pickled job, as the function's source would:
    executors of a cluster need not have it, only the libraries it imports."""
    from pyspark import cloudpickle

    name = getattr(spec.function, "__module__", None) or ""
    if name in _DECIDED:
        return
    module = sys.modules.get(name)
    if module is None:
        return
    _DECIDED.add(name)
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    path = os.path.abspath(getattr(top, "__file__", None) or "")
    installed = any(part in ("site-packages", "dist-packages") for part in path.split(os.sep))
    if top.__name__ in _SHIPPED or top.__name__ in ("udf_agent", "spark_backend", "__main__") or installed or not path:
        return
    _SHIPPED.add(top.__name__)
    cloudpickle.register_pickle_by_value(top)
    log.info("the UDF's module %s is shipped to Spark's workers with each job (%s)", top.__name__, path)


def _warm_workers(session: SparkSession) -> None:
    """Runs one tiny job so the first micro-batch does not pay for starting Python workers."""
    frame = session.dataframes.createDataFrame(pd.DataFrame({"n": range(session.cores())}), schema="n long")
    frame.mapInPandas(_import_compute, schema="n long").count()


def _import_compute(frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    import udf_agent.compute.run  # noqa: F401  (pandas, pyarrow and protobuf, loaded once per worker)
    from udf_agent.compute import packed
    from udf_agent.wire import pointcodec

    pointcodec.warm_up()  # numba's compiled decoder, from its cache
    packed.warm_up()
    yield from frames
