"""The runners: a task table in, a result table out (``compute.contract``), wherever it runs.

The same functions run inside Spark's pandas UDF, on the resident workers and in-process,
so results are identical by construction.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from udf_agent.api import Context
from udf_agent.compute.contract import TASK_SCHEMA, Job, Result, Task, results_table, tasks_of
from udf_agent.compute.frame import read_sources, user_frame
from udf_agent.compute.packed import Blobs, ResultColumns, StreamTasks, alternated
from udf_agent.compute.results import encode_rows_of, output_points
from udf_agent.wire import columns as cols
from udf_agent.wire import pointcodec
from udf_agent.wire.frames import ProtocolError
from udf_agent.wire.guard import encode_batch, encode_points
from udf_agent.wire.pointcodec import DecodedPoints

log = logging.getLogger(__name__)

_ZERO = np.zeros(1, np.int64)



def run_partition(job: Job, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The body of the pandas UDF of a Spark job per micro-batch: task rows in, result rows out."""
    for frame in frames:
        tasks = pa.Table.from_pandas(frame[TASK_SCHEMA.names], schema=TASK_SCHEMA, preserve_index=False)
        yield compute_tasks(job, tasks).to_pandas()


def compute_tasks(job: Job, tasks: pa.Table) -> pa.Table:
    """Every engine's work: a table of ``TASK_SCHEMA`` in, one of ``RESULT_SCHEMA`` out, row for row."""
    if job.spec.wants == "stream" and tasks.num_rows:
        stream = StreamTasks.of_table(tasks)
        return compute_stream(job, stream).table(stream)
    return results_table([run_task(job, task) for task in tasks_of(tasks)])


@dataclass
class _Groups:
    """Where each group's rows lie in a partition decoded as one table."""

    starts: np.ndarray  # first row of each group, then the number of rows
    new_from: np.ndarray  # first new row of each group (the rows before it are its history)


def compute_stream(job: Job, tasks: StreamTasks) -> ResultColumns:
    """A stream slice's groups decoded at once (history, then new points, group after group),
    its results row for row; ``compute_tasks`` of its task table, in packed form."""
    if not len(tasks):
        return ResultColumns.of_results([])
    joined, part_bounds = alternated(tasks.histories, tasks.data)  # each group's kept history, then its new points
    try:
        points, headers = pointcodec.decode_with_headers(joined)
        # Where each group's history and new points begin, as point numbers.
        bounds = headers.points_at(part_bounds)
    except ProtocolError:
        return ResultColumns.of_results([run_task(job, task) for task in tasks.tasks()])  # one by one, to name the group at fault
    starts = bounds[0::2]
    groups = _Groups(starts, bounds[1::2])
    window = job.history_window
    if job.spec.vectorized:
        return _run_vectorized(job, tasks, points, headers, groups, window)
    table = points.table
    return ResultColumns.of_results([
        _run_group(job, task, points, DecodedPoints(table.slice(start, end - start)), headers, int(start), history_rows, window)
        for task, start, end, history_rows in zip(tasks.tasks(), starts[:-1], starts[1:], (groups.new_from - starts[:-1]).tolist())
    ])


def _run_group(
    job: Job, task: Task, partition: DecodedPoints, points: DecodedPoints, headers: pointcodec.Headers, first: int, history_rows: int, window: dict[str, int] | None
) -> Result:
    """One group's call; ``points`` are its rows, from row ``first`` of the partition's."""
    where = f"group {task.key!r}" if task.key else "the ungrouped data"
    try:
        output, emitted, state = _call_group(job, task, points, headers, first, history_rows)
        history = _keep_history(job, partition, headers, first, points.times, window)
        return Result(task.seq, task.key, output, history, state, None, emitted)
    except Exception:
        error = f"UDF {job.spec.name!r} failed on {where}:\n{traceback.format_exc()}"
    return Result(task.seq, task.key, None, None, None, error, 0)


def _run_vectorized(
    job: Job, tasks: StreamTasks, points: DecodedPoints, headers: pointcodec.Headers, groups: _Groups, window: dict[str, int] | None
) -> ResultColumns:
    """One call for every group of the partition; its per-row result is cut back into groups."""
    keys = tasks.keys
    try:
        output, offsets, emitted = _call_vectorized(job, keys, points, headers, groups)
    except Exception:
        error = f"UDF {job.spec.name!r} failed on a partition of {len(keys)} group(s):\n{traceback.format_exc()}"
        return ResultColumns.of_results([Result(task.seq, task.key, None, None, None, error, 0) for task in tasks.tasks()])
    histories = _keep_histories(job, points, headers, groups.starts, window)
    nothing = Blobs.missing(len(keys))
    return ResultColumns(Blobs(output, offsets[1:] - offsets[:-1]), histories, nothing, nothing, emitted)


def _keep_histories(job: Job, points: DecodedPoints, headers: pointcodec.Headers, starts: np.ndarray, window: dict[str, int] | None) -> Blobs:
    """``_keep_history`` for every group at once: group ``i`` is rows ``starts[i]:starts[i + 1]``."""
    count = len(starts) - 1
    if not window:
        return Blobs.missing(count)
    if "rows" not in window:
        times = points.times
        return Blobs.of([_keep_history(job, points, headers, a, times[a:b], window) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())])
    columns = _history_columns(job, points)
    if columns is not None:
        # Each group's last rows: the stretch from max(start, end - rows) to its end.
        firsts = np.maximum(starts[:-1], starts[1:] - window["rows"])
        counts = starts[1:] - firsts
        group_ends = np.cumsum(counts)
        rows = np.arange(int(group_ends[-1]) if count else 0) + np.repeat(firsts - (group_ends - counts), counts)
        compacted = points.compacted(rows, group_ends, columns)
        if compacted is not None:
            return Blobs(*compacted)
    data, lengths = headers.last_points(starts, window["rows"])
    return Blobs(data, lengths)


def _call_vectorized(job: Job, keys: list[str], points: DecodedPoints, headers: pointcodec.Headers, groups: _Groups) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The output frames of every group, group after group; where each group's begin
    (and the end), and how many points each group emitted."""
    frame, layout = user_frame(points, job.frame_columns)
    ctx = Context(
        options=job.option_values(),
        group="",
        tags={},
        groups=tuple(keys),
        group_starts=groups.starts,
        **_task_context(job, points, frame),
    )
    result = job.spec.function(frame, ctx)
    if ctx.state:
        raise TypeError("a vectorized UDF keeps no ctx.state")
    # Rows each group had before this micro-batch: their results are dropped.
    starts = groups.starts
    one_group = len(starts) == 2  # a trickle's usual slice: no per-row floors, no cutting
    seen = int(groups.new_from[0]) if one_group else np.repeat(groups.new_from, starts[1:] - starts[:-1])
    encoded = encode_rows_of(result, headers, layout, points.num_rows, seen)
    if encoded is None:
        raise TypeError(
            "a vectorized UDF must return one row per input row (keep df's index) with float, int or bool "
            f"field columns, no 'time' or tag columns; got {type(result).__name__} "
            f"with columns {list(getattr(result, 'columns', []))!r}"
        )
    output, out_rows, ends = encoded
    if one_group:
        return output, np.array([0, len(output)], np.int64), np.array([len(out_rows)], np.int64)
    # Output rows are in input order, so each group's frames are one stretch of the output.
    cuts = np.searchsorted(out_rows, starts)
    offsets = np.concatenate((_ZERO, ends))[cuts]
    return output, offsets, cuts[1:] - cuts[:-1]


def run_task(job: Job, task: Task) -> Result:
    """One result row; a failure is reported in its ``error`` column, never raised into Spark."""
    where = f"group {task.key!r}" if task.key else "the ungrouped data"
    try:
        if job.spec.wants == "stream":
            output, history, state, emitted = _run_stream_task(job, task)
        else:
            output, history, state, emitted = _run_batch_task(job, task)
        return Result(task.seq, task.key, output, history, state, None, emitted)
    except ProtocolError as exc:
        error = f"protocol error: a point of {where} is malformed: {exc}"
    except Exception:
        error = f"UDF {job.spec.name!r} failed on {where}:\n{traceback.format_exc()}"
    return Result(task.seq, task.key, None, None, None, error, 0)


def _run_stream_task(job: Job, task: Task) -> tuple[bytes, bytes | None, str | None, int]:
    # The kept history is the group's last points as received: decoded with the new ones.
    history = task.history or b""
    history_rows = pointcodec.count_points(history)
    points, headers = pointcodec.decode_with_headers(history + task.data)
    output, emitted, state = _call_group(job, task, points, headers, 0, history_rows)
    return output, _keep_history(job, points, headers, 0, points.times, job.history_window), state, emitted


def _call_group(job: Job, task: Task, points: DecodedPoints, headers: pointcodec.Headers, first: int, history_rows: int) -> tuple[bytes, int, str | None]:
    """Calls the UDF on one group's rows (row ``first`` on in ``headers``): (output, points, state)."""
    frame, layout = user_frame(points, job.frame_columns)
    data = points.table
    last = data.num_rows - 1
    dims = data.column(cols.DIMENSIONS)[last].as_py()
    tags = {d: _tag_value(data, d, last) for d in dims}
    ctx = Context(
        options=job.option_values(),
        group=task.key,
        tags={k: v for k, v in tags.items() if v is not None},
        name=data.column(cols.NAME)[last].as_py(),
        state=_load_state(task.state),
        history_rows=history_rows,
        **_task_context(job, points, frame),
    )
    result = job.spec.function(frame, ctx)
    if job.spec.provides == "stream":
        encoded = encode_rows_of(result, headers, layout, data.num_rows, history_rows, offset=first)
        if encoded is not None:
            output, rows, _ = encoded
            return output, len(rows), _dump_state(ctx.state)
    output_rows = output_points(result, data, layout, ctx, first_row=history_rows)
    if job.spec.provides == "stream":
        output = encode_points(output_rows)
    elif output_rows:
        output = encode_batch(
            name=ctx.name,
            group=task.key,
            tags=ctx.tags,
            tmax=max(p.time for p in output_rows),
            by_name=bool(data.column(cols.BY_NAME)[last].as_py()),
            points=output_rows,
        )
    else:
        output = b""
    return output, len(output_rows), _dump_state(ctx.state)


def _run_batch_task(job: Job, task: Task) -> tuple[bytes, None, str | None, int]:
    decoded, _ = pointcodec.decode_with_headers(task.data)
    frame, layout = user_frame(decoded, job.frame_columns)
    data = decoded.table
    ctx = Context(
        options=job.option_values(),
        group=task.key,
        tags=task.batch_tags(),
        name=task.batch_name or "",
        tmax=pd.Timestamp(task.batch_tmax or 0, unit="ns", tz="UTC"),
        state=_load_state(task.state),
        **_task_context(job, decoded, frame),
    )
    result = job.spec.function(frame, ctx)
    if job.spec.provides == "batch":
        points = output_points(result, data, layout, ctx, first_row=0, in_batch=True)
        output = encode_batch(
            name=task.batch_name or "",
            group=task.key,
            tags=ctx.tags,
            tmax=task.batch_tmax or 0,
            by_name=bool(task.batch_by_name),
            points=points,
        )
    else:
        points = output_points(result, data, layout, ctx, first_row=0, dimensions=tuple(ctx.tags))
        output = encode_points(points)
    return output, None, _dump_state(ctx.state), len(points)


def _task_context(job: Job, points: DecodedPoints, frame: pd.DataFrame) -> dict[str, Any]:
    """Context fields naming Kapacitor's task, and each row's database and retention policy
    (built only if the UDF reads them: strings per row cost)."""

    def per_row(column: str) -> Callable[[], pd.Series]:
        return lambda: pd.Series(points.values(column)[0], index=frame.index, dtype="object")

    return {
        "task_id": job.task_id,
        "node_id": job.node_id,
        "row_databases": per_row(cols.DATABASE),
        "row_retention_policies": per_row(cols.RETENTION_POLICY),
    }


def _tag_value(data: pa.Table, key: str, row: int) -> str | None:
    name = cols.TAG + key
    if name not in data.column_names:
        return None
    value: str | None = data.column(name)[row].as_py()
    return value


def _load_state(state: str | None) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(state) if state else {}
    return loaded


def _dump_state(state: Any) -> str | None:
    if not isinstance(state, dict):
        raise TypeError(f"ctx.state must stay a dict, got {type(state).__name__}")
    if not state:
        return None
    try:
        return json.dumps(state, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ctx.state must hold JSON values only (str, int, float, bool, None, lists, dicts): {exc}") from None


def _keep_history(job: Job, partition: DecodedPoints, headers: pointcodec.Headers, first: int, times: np.ndarray, window: dict[str, int] | None) -> bytes | None:
    """The group's points to prepend to its next frame, as length-prefixed point bytes.

    ``times`` are the group's rows, row ``first`` on in ``partition`` (and ``headers``).
    """
    if not window or len(times) == 0:
        return None
    if "rows" in window:
        rows = np.arange(max(0, len(times) - window["rows"]), len(times))
    else:
        rows = np.flatnonzero(times >= times.max() - window["ns"])
    if not len(rows):
        return None
    columns = _history_columns(job, partition)
    compacted = None if columns is None else partition.compacted(rows + first, np.array([len(rows)]), columns)
    return headers.points_bytes(rows + first) if compacted is None else compacted[0].tobytes()


def _history_columns(job: Job, points: DecodedPoints) -> frozenset[str] | None:
    """What a group's kept points need besides their time, name, database and retention
    policy (``DecodedPoints.compacted``): the tags and fields its frames are made of, when the
    UDF declares what it reads; None keeps the points whole. Kept compact, a group's history
    is a fraction of the points as received: less state to hold and checkpoint, and less to
    ship to the worker with each micro-batch."""
    reads = job.frame_columns
    return None if reads is None else read_sources(tuple(points.names), reads)


