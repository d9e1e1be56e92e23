"""The work done for one group or one Kapacitor batch, wherever it runs.

A micro-batch reaches a compute engine as tasks, one per group (stream) or
per Kapacitor batch: the group's new points as the bytes Kapacitor sent, its
kept history as the bytes of its last points (the same form), its UDF state as JSON. A task's result carries the encoded output
frames, the new history and state. The same functions run inside Spark's
pandas UDF and in-process, so results are identical by construction.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa

from udf_agent import udf_pb2
from udf_agent.api import Context, UDFSpec
from udf_agent.options import OptionValues, duration_positions
from udf_agent.wire import columns as cols
from udf_agent.wire import pointcodec
from udf_agent.wire.frames import ProtocolError
from udf_agent.wire.guard import encode_batch, encode_points

log = logging.getLogger(__name__)



class Task(NamedTuple):
    """One group's (or one Kapacitor batch's) work in a micro-batch."""

    seq: int
    key: str
    meta: str  # JSON: the history window (stream) or the batch's name, tags, tmax, byName
    data: bytes  # its new points, length-prefixed, as Kapacitor sent them
    history: bytes | None  # its kept last points, the same way
    state: str | None  # its UDF state, JSON


TASK_COLUMNS = Task._fields
RESULT_COLUMNS = ("seq", "key", "output", "history", "state", "error", "emitted")
RESULT_DDL = "seq long, key string, output binary, history binary, state string, error string, emitted long"
# A micro-batch's tasks reach an engine as an Arrow table of this schema.
TASK_SCHEMA = pa.schema(
    [("seq", pa.int64()), ("key", pa.string()), ("meta", pa.string()), ("data", pa.binary()), ("history", pa.binary()), ("state", pa.string())]
)
RESULT_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()), ("key", pa.string()), ("output", pa.binary()), ("history", pa.binary()),
        ("state", pa.string()), ("error", pa.string()), ("emitted", pa.int64()),
    ]
)


def tasks_from_rows(rows: list[tuple[Any, ...]]) -> pa.Table:
    """The task table of rows in ``TASK_COLUMNS`` order."""
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(TASK_COLUMNS)}, schema=TASK_SCHEMA)

TIME_COLUMN = "time"
TAG_COLUMN_PREFIX = "tag:"
FIELD_COLUMN_PREFIX = "field:"
# The index name that marks a result's rows as input rows (see output_points).
INPUT_ROW = "input_row"


@dataclass
class Job:
    """What a worker needs besides the tasks: the UDF and its parsed options."""

    spec: UDFSpec
    options: dict[str, Any]
    task_id: str = ""
    node_id: str = ""

    def option_values(self) -> OptionValues:
        return OptionValues(self.options, duration_positions(self.spec.options))


def run_partition(job: Job, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The body of the pandas UDF of a Spark job per micro-batch: task rows in, result rows out."""
    for frame in frames:
        tasks = pa.Table.from_pandas(frame[list(TASK_COLUMNS)], schema=TASK_SCHEMA, preserve_index=False)
        yield compute_tasks(job, tasks).to_pandas()


def compute_tasks(job: Job, tasks: pa.Table) -> pa.Table:
    """Every engine's work: a table of ``TASK_SCHEMA`` in, one of ``RESULT_SCHEMA`` out, row for row."""
    rows = [Task(*values) for values in zip(*(tasks.column(name).to_pylist() for name in TASK_COLUMNS))]
    if job.spec.wants == "stream" and rows:
        return _run_stream_partition(job, tasks, rows)
    return results_from_rows([run_task(job, task) for task in rows])


def results_from_rows(rows: list[tuple[Any, ...]]) -> pa.Table:
    """The result table of rows in ``RESULT_COLUMNS`` order."""
    return pa.table({name: [row[i] for row in rows] for i, name in enumerate(RESULT_COLUMNS)}, schema=RESULT_SCHEMA)


@dataclass
class _Groups:
    """Where each group's rows lie in a partition decoded as one table."""

    starts: np.ndarray  # first row of each group, then the number of rows
    history_rows: list[int]


def _run_stream_partition(job: Job, tasks: pa.Table, rows: list[Task]) -> pa.Table:
    """Every group of a partition decoded at once: history, then new points, group after group."""
    parts = [part for task in rows for part in (task.history or b"", task.data)]
    try:
        data, headers = pointcodec.decode_with_headers(b"".join(parts))
        # Where each group's history and new points begin, as point numbers.
        bounds = headers.points_at(np.cumsum([0] + [len(part) for part in parts]))
    except ProtocolError:
        return results_from_rows([run_task(job, task) for task in rows])  # one by one, to name the group at fault
    starts = bounds[0::2]
    groups = _Groups(starts, (bounds[1::2] - starts[:-1]).tolist())
    window = json.loads(rows[0].meta).get("history")
    if job.spec.vectorized:
        return _run_vectorized(job, tasks, rows, data, headers, groups, window)
    return results_from_rows([
        _run_group(job, task, data.slice(start, end - start), headers, int(start), history_rows, window)
        for task, start, end, history_rows in zip(rows, starts[:-1], starts[1:], groups.history_rows)
    ])


def _run_group(job: Job, task: Any, data: pa.Table, headers: pointcodec.Headers, first: int, history_rows: int, window: dict[str, int] | None) -> tuple[Any, ...]:
    """One group's call; ``data`` is its rows, from row ``first`` of the partition."""
    where = f"group {task.key!r}" if task.key else "the ungrouped data"
    try:
        output, emitted, state = _call_group(job, task, data, headers, first, history_rows)
        history = _keep_history(data.column(cols.TIME).to_numpy(), headers, first, window)
        return (task.seq, task.key, output, history, state, None, emitted)
    except Exception:
        error = f"UDF {job.spec.name!r} failed on {where}:\n{traceback.format_exc()}"
    return (task.seq, task.key, None, None, None, error, 0)


def _run_vectorized(
    job: Job, tasks: pa.Table, rows: list[Task], data: pa.Table, headers: pointcodec.Headers, groups: _Groups, window: dict[str, int] | None
) -> pa.Table:
    """One call for every group of the partition; its per-row result is cut back into groups."""
    try:
        output, offsets, emitted = _call_vectorized(job, rows, data, headers, groups)
    except Exception:
        error = f"UDF {job.spec.name!r} failed on a partition of {len(rows)} group(s):\n{traceback.format_exc()}"
        return results_from_rows([(task.seq, task.key, None, None, None, error, 0) for task in rows])
    count = len(rows)
    nothing = pa.nulls(count, pa.string())
    return pa.table(
        {
            "seq": tasks.column("seq"),
            "key": tasks.column("key"),
            "output": _binary(np.frombuffer(output, np.uint8), offsets),
            "history": _keep_histories(data.column(cols.TIME).to_numpy(), headers, groups.starts, window),
            "state": nothing,
            "error": nothing,
            "emitted": pa.array(emitted, pa.int64()),
        },
        schema=RESULT_SCHEMA,
    )


def _binary(data: np.ndarray, offsets: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A binary array over ``data`` (item i: ``data[offsets[i]:offsets[i + 1]]``), without copying it."""
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [bitmap, pa.py_buffer(np.ascontiguousarray(offsets, np.int32)), pa.py_buffer(data)]
    )


def _keep_histories(times: np.ndarray, headers: pointcodec.Headers, starts: np.ndarray, window: dict[str, int] | None) -> pa.Array:
    """``_keep_history`` for every group at once: group ``i`` is rows ``starts[i]:starts[i + 1]``."""
    count = len(starts) - 1
    if not window:
        return pa.nulls(count, pa.binary())
    if "rows" not in window:
        kept = [_keep_history(times[a:b], headers, a, window) for a, b in zip(starts[:-1].tolist(), starts[1:].tolist())]
        return pa.array(kept, pa.binary())
    # The last rows of a group are one stretch of bytes.
    first = np.maximum(starts[:-1], starts[1:] - window["rows"])
    data, offsets = headers.gather_stretches(first, starts[1:])
    return _binary(data, offsets, first < starts[1:])


def _call_vectorized(job: Job, rows: list[Task], data: pa.Table, headers: pointcodec.Headers, groups: _Groups) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The output frames of every group, group after group; where each group's begin
    (and the end), and how many points each group emitted."""
    frame, layout = user_frame(data)
    ctx = Context(
        options=job.option_values(),
        group="",
        tags={},
        groups=tuple(task.key for task in rows),
        group_starts=groups.starts,
        **_task_context(job, data, frame),
    )
    result = job.spec.function(frame, ctx)
    if ctx.state:
        raise TypeError("a vectorized UDF keeps no ctx.state")
    # Rows each group had before this micro-batch: their results are dropped.
    group_of_row = np.repeat(np.arange(len(rows)), np.diff(groups.starts))
    seen = groups.starts[:-1] + np.asarray(groups.history_rows, np.int64)
    encoded = _encode_rows_of(result, headers, layout, data.num_rows, seen[group_of_row])
    if encoded is None:
        raise TypeError(
            "a vectorized UDF must return one row per input row (keep df's index) with float, int or bool "
            f"field columns, no 'time' or tag columns; got {type(result).__name__} "
            f"with columns {list(getattr(result, 'columns', []))!r}"
        )
    output, out_rows, ends = encoded
    # Output rows are in input order, so each group's frames are one stretch of the output.
    cuts = np.searchsorted(out_rows, groups.starts)
    offsets = np.concatenate(([0], ends))[cuts]
    return output, offsets, np.diff(cuts)


def run_task(job: Job, task: Any) -> tuple[Any, ...]:
    """One result row; a failure is reported in its ``error`` column, never raised into Spark."""
    meta = json.loads(task.meta)
    where = f"group {task.key!r}" if task.key else "the ungrouped data"
    try:
        if job.spec.wants == "stream":
            output, history, state, emitted = _run_stream_task(job, task, meta)
        else:
            output, history, state, emitted = _run_batch_task(job, task, meta)
        return (task.seq, task.key, output, history, state, None, emitted)
    except ProtocolError as exc:
        error = f"protocol error: a point of {where} is malformed: {exc}"
    except Exception:
        error = f"UDF {job.spec.name!r} failed on {where}:\n{traceback.format_exc()}"
    return (task.seq, task.key, None, None, None, error, 0)


def _run_stream_task(job: Job, task: Any, meta: dict[str, Any]) -> tuple[bytes, bytes | None, str | None, int]:
    # The kept history is the group's last points as received: decoded with the new ones.
    history = task.history or b""
    history_rows = pointcodec.count_points(history)
    data, headers = pointcodec.decode_with_headers(history + task.data)
    output, emitted, state = _call_group(job, task, data, headers, 0, history_rows)
    return output, _keep_history(data.column(cols.TIME).to_numpy(), headers, 0, meta.get("history")), state, emitted


def _call_group(job: Job, task: Any, data: pa.Table, headers: pointcodec.Headers, first: int, history_rows: int) -> tuple[bytes, int, str | None]:
    """Calls the UDF on one group's rows (row ``first`` on in ``headers``): (output, points, state)."""
    frame, layout = user_frame(data)
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
        **_task_context(job, data, frame),
    )
    result = job.spec.function(frame, ctx)
    if job.spec.provides == "stream":
        encoded = _encode_rows_of(result, headers, layout, data.num_rows, history_rows, offset=first)
        if encoded is not None:
            output, rows, _ = encoded
            return output, len(rows), _dump_state(ctx.state)
    points = output_points(result, data, layout, ctx, first_row=history_rows)
    if job.spec.provides == "stream":
        output = encode_points(points)
    elif points:
        output = encode_batch(
            name=ctx.name,
            group=task.key,
            tags=ctx.tags,
            tmax=max(p.time for p in points),
            by_name=bool(data.column(cols.BY_NAME)[last].as_py()),
            points=points,
        )
    else:
        output = b""
    return output, len(points), _dump_state(ctx.state)


def _run_batch_task(job: Job, task: Any, meta: dict[str, Any]) -> tuple[bytes, None, str | None, int]:
    data = pointcodec.decode_points(task.data)
    frame, layout = user_frame(data)
    ctx = Context(
        options=job.option_values(),
        group=task.key,
        tags=dict(meta["tags"]),
        name=meta["name"],
        tmax=pd.Timestamp(meta["tmax"], unit="ns", tz="UTC"),
        state=_load_state(task.state),
        **_task_context(job, data, frame),
    )
    result = job.spec.function(frame, ctx)
    if job.spec.provides == "batch":
        points = output_points(result, data, layout, ctx, first_row=0, in_batch=True)
        output = encode_batch(
            name=meta["name"],
            group=task.key,
            tags=ctx.tags,
            tmax=meta["tmax"],
            by_name=meta["by_name"],
            points=points,
        )
    else:
        points = output_points(result, data, layout, ctx, first_row=0, dimensions=tuple(ctx.tags))
        output = encode_points(points)
    return output, None, _dump_state(ctx.state), len(points)


def _task_context(job: Job, data: pa.Table, frame: pd.DataFrame) -> dict[str, Any]:
    """Context fields naming Kapacitor's task, and each row's database and retention policy
    (built only if the UDF reads them: strings per row cost)."""

    def per_row(column: str) -> Callable[[], pd.Series]:
        return lambda: pd.Series(_to_pandas(data.column(column)), index=frame.index, dtype="object")

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


def _keep_history(times: np.ndarray, headers: pointcodec.Headers, first: int, window: dict[str, int] | None) -> bytes | None:
    """The group's points to prepend to its next frame, as length-prefixed point bytes.

    ``times`` are the group's rows, row ``first`` on in ``headers``.
    """
    if not window or len(times) == 0:
        return None
    if "rows" in window:
        rows = np.arange(max(0, len(times) - window["rows"]), len(times))
    else:
        rows = np.flatnonzero(times >= times.max() - window["ns"])
    return headers.points_bytes(rows + first) if len(rows) else None


# ---- internal table <-> the DataFrame a UDF sees ----


@dataclass
class Layout:
    """How the UDF's column names map back to tags and fields."""

    tag_columns: dict[str, str]  # user column -> tag key


def user_frame(data: pa.Table) -> tuple[pd.DataFrame, Layout]:
    """``time`` (UTC timestamps), one column per tag, one per field.

    A tag that shares its name with a field (or with ``time``) is shown as
    ``tag:NAME``, a field called ``time`` as ``field:time``. The index, named
    ``input_row``, numbers the rows. A field sent with different types in one frame becomes one
    object column holding each point's own value.
    """
    names = data.column_names
    field_kinds: dict[str, list[str]] = {}
    for name in names:
        prefix = cols.column_prefix(name) if ":" in name else ""
        if prefix in cols.FIELD_PREFIXES:
            field_kinds.setdefault(name[len(prefix) :], []).append(name)
    columns: dict[str, Any] = {
        TIME_COLUMN: pd.DatetimeIndex(data.column(cols.TIME).to_numpy().view("M8[ns]")).tz_localize("UTC")
    }
    layout = Layout(tag_columns={})
    for name in sorted(n for n in names if n.startswith(cols.TAG)):
        key = name[len(cols.TAG) :]
        user_name = TAG_COLUMN_PREFIX + key if key in field_kinds or key == TIME_COLUMN else key
        columns[user_name] = _to_pandas(data.column(name))
        layout.tag_columns[user_name] = key
    for key, sources in sorted(field_kinds.items()):
        # A field may be called "time" (Kapacitor allows it); the time column keeps the name.
        column = FIELD_COLUMN_PREFIX + key if key == TIME_COLUMN else key
        if len(sources) == 1:
            columns[column] = _to_pandas(data.column(sources[0]))
        else:
            merged = [None] * data.num_rows
            for source in sources:
                for row, value in enumerate(data.column(source).to_pylist()):
                    if value is not None and merged[row] is None:
                        merged[row] = value
            columns[column] = pd.Series(merged, dtype=object)
    # numpy arrays in, no copies: a Series per column would cost more than most UDFs.
    frame = pd.DataFrame(columns, index=pd.RangeIndex(data.num_rows, name=INPUT_ROW), copy=False)
    return frame, layout


# Sparse columns: pandas' nullable dtypes tell a missing value (NA) from a NaN.
_NULLABLE = {pa.int64(): pd.Int64Dtype(), pa.float64(): pd.Float64Dtype(), pa.bool_(): pd.BooleanDtype()}


def _to_pandas(column: pa.ChunkedArray) -> Any:
    if column.null_count and column.type in _NULLABLE:
        return column.to_pandas(types_mapper=_NULLABLE.get)
    return column.to_numpy(zero_copy_only=False)


def output_points(
    result: Any,
    data: pa.Table,
    layout: Layout,
    ctx: Context,
    *,
    first_row: int,
    in_batch: bool = False,
    dimensions: tuple[str, ...] | None = None,
) -> list[udf_pb2.Point]:
    """Turns a UDF's result into points.

    Rows of a result whose index is still ``input_row`` carry that input row's
    time, metadata and tags; results for history rows (labels below
    ``first_row``) are dropped. Any other result is new rows: it must carry a
    ``time`` column and takes the group's metadata and tags. Columns that were tags, or are named ``tag:KEY``, are
    tags; ``time`` is the time; every other column is a field.
    """
    if result is None:
        return []
    if not isinstance(result, pd.DataFrame):
        raise TypeError(f"the UDF must return a pandas DataFrame or None, got {type(result).__name__}")
    if len(result) == 0:
        return []
    source = _source_rows(result, data.num_rows)
    if source is not None:
        keep = source >= first_row
        result, source = result[keep], source[keep]
        order = np.argsort(source, kind="stable")
        result, source = result.iloc[order], source[order]
    elif TIME_COLUMN in result.columns:
        result = result.iloc[np.argsort(_times(result[TIME_COLUMN]), kind="stable")]
    else:
        raise ValueError(
            "result rows must keep the input's index labels, or carry a 'time' column "
            f"(got index {result.index[:5].tolist()!r}...)"
        )
    count = len(result)
    if count == 0:
        return []
    last = data.num_rows - 1
    rows = source if source is not None else np.full(count, last, dtype=np.int64)
    times = _times(result[TIME_COLUMN]) if TIME_COLUMN in result.columns else data.column(cols.TIME).to_numpy()[rows]

    def meta(name: str) -> list[Any]:
        if last < 0:
            return [None] * count
        values: list[Any] = data.column(name).take(pa.array(rows)).to_pylist()
        return values

    names, databases, policies = meta(cols.NAME), meta(cols.DATABASE), meta(cols.RETENTION_POLICY)
    dims, by_names = meta(cols.DIMENSIONS), meta(cols.BY_NAME)
    tag_values: dict[str, list[Any]] = {}
    if source is not None:
        for name in data.column_names:
            if name.startswith(cols.TAG):
                tag_values[name[len(cols.TAG) :]] = data.column(name).take(pa.array(rows)).to_pylist()
    else:
        for tag, value in ctx.tags.items():
            tag_values[tag] = [value] * count
    fields: list[tuple[str, str, list[Any]]] = []
    for column in result.columns:
        if column == TIME_COLUMN:
            continue
        key: str | None = layout.tag_columns.get(column)
        if key is None and isinstance(column, str) and column.startswith(TAG_COLUMN_PREFIX):
            key = column[len(TAG_COLUMN_PREFIX) :]
        name = TIME_COLUMN if column == FIELD_COLUMN_PREFIX + TIME_COLUMN else str(column)
        values = result[column]
        if key is not None:
            override = [None if _missing(v) else str(v) for v in values.tolist()]
            base = tag_values.get(key, [None] * count)
            tag_values[key] = [o if o is not None else b for o, b in zip(override, base)]
        else:
            fields.append((name, _field_kind(column, values), values.tolist()))

    points = []
    for i in range(count):
        point = udf_pb2.Point(time=int(times[i]), group=ctx.group)
        if not in_batch:
            point.name = names[i] or ctx.name
            point.database = databases[i] or ""
            point.retentionPolicy = policies[i] or ""
            point.byName = bool(by_names[i])
            point.dimensions.extend(dimensions if dimensions is not None else (dims[i] or ()))
        for key, values in tag_values.items():
            value = values[i]
            if value is not None:
                point.tags[key] = value
        for key, kind, values in fields:
            _set_field(point, key, kind, values[i])
        points.append(point)
    return points


def _encode_rows_of(
    result: Any, headers: pointcodec.Headers, layout: Layout, input_rows: int, seen: Any, offset: int = 0
) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """The compiled encoder's frames for the common result, or None for ``output_points``.

    The common result: one row per input row (index ``input_row``), field columns of
    float, int or bool dtype, no time or tag columns. Results for rows below ``seen``
    (a row number, or one per input row) were sent before and are dropped; the rest
    leave in input order. Returns the frames, the input rows they stand for (plus
    ``offset``: rows of ``headers``) and where each frame ends.
    """
    if not isinstance(result, pd.DataFrame) or TIME_COLUMN in result.columns:
        return None
    source = _source_rows(result, input_rows)
    if source is None:
        return None
    fields = []
    for column in result.columns:
        dtype = result[column].dtype
        if not isinstance(column, str) or column in layout.tag_columns or column.startswith(TAG_COLUMN_PREFIX) or not isinstance(dtype, np.dtype):
            return None
        fields.append((TIME_COLUMN if column == FIELD_COLUMN_PREFIX + TIME_COLUMN else column, result[column].to_numpy()))
    floor = seen[source] if isinstance(seen, np.ndarray) else seen
    picked = np.flatnonzero(source >= floor)
    picked = picked[np.argsort(source[picked], kind="stable")]
    rows = source[picked]
    encoded = pointcodec.encode_rows(headers, rows + offset, [(name, values[picked]) for name, values in fields])
    if encoded is None:
        return None
    output, ends = encoded
    return output, rows, ends


def _source_rows(result: pd.DataFrame, input_rows: int) -> np.ndarray | None:
    """The input rows a result's rows stand for, or None for a result of new rows.

    Only an index still named ``input_row`` (kept by selections, ``assign``,
    ``DataFrame(index=df.index)``...) counts: a fresh ``pd.DataFrame({...})``
    numbered 0..k-1 is new rows, never mistaken for the first input rows.
    """
    index = result.index
    if index.name != INPUT_ROW:
        return None
    labels = index.to_numpy()
    if not pd.api.types.is_integer_dtype(labels.dtype) or (len(labels) and (labels.min() < 0 or labels.max() >= input_rows)):
        raise ValueError(
            f"the result's index is named {INPUT_ROW!r} but holds labels that are not input rows "
            f"(0..{input_rows - 1}); keep the input's index, or build new rows with a 'time' column and a fresh index"
        )
    rows: np.ndarray = labels.astype(np.int64)
    return rows


def _times(series: pd.Series) -> np.ndarray:
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        stamps = pd.DatetimeIndex(series)
        if stamps.tz is None:
            stamps = stamps.tz_localize("UTC")
        nanoseconds: np.ndarray = stamps.as_unit("ns").asi8
        return nanoseconds
    if pd.api.types.is_integer_dtype(series.dtype):
        integers: np.ndarray = series.to_numpy(dtype=np.int64)
        return integers
    raise TypeError(f"the 'time' column must hold timestamps or int64 nanoseconds, got {series.dtype}")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _field_kind(column: Any, values: pd.Series) -> str:
    dtype = values.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "double"
    if pd.api.types.is_string_dtype(dtype) or pd.api.types.is_object_dtype(dtype):
        return "value"
    raise TypeError(
        f"result column {column!r} has dtype {dtype}; fields must be float, int, bool or str"
    )


def _set_field(point: udf_pb2.Point, key: str, kind: str, value: Any) -> None:
    if value is None or value is pd.NA:  # no value; a NaN is a value
        return
    if kind == "value":
        kind = _value_kind(key, value)
    if kind == "double":
        point.fieldsDouble[key] = value
    elif kind == "int":
        point.fieldsInt[key] = value
    elif kind == "bool":
        point.fieldsBool[key] = value
    else:
        point.fieldsString[key] = value


def _value_kind(key: str, value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "double"
    if isinstance(value, str):
        return "string"
    raise TypeError(f"field {key!r} holds a {type(value).__name__}; fields must be float, int, bool or str")
