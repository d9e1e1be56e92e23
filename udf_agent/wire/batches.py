"""Incoming points, grouped, and the Arrow tables they become.

The reader keeps each point as the bytes Kapacitor sent: stream points as the
scanner's runs (``StreamMicroBatch``, grouped once per micro-batch into
``GroupedPoints``), a Kapacitor batch's points in ``GroupRows``; no protobuf
object per point on its path. Where the group is computed (a Spark
worker), ``decode_points`` turns those bytes into one Arrow table whose
column names carry a prefix, so tags and fields can never collide with each
other or with the point's metadata:

    __time __name __db __rp __dims __byname   point metadata
    t:KEY                                     tags
    fd:KEY fi:KEY fs:KEY fb:KEY               double/int/string/bool fields
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from udf_agent import udf_pb2
from udf_agent.wire.frames import FrameSplitter, ProtocolError, encode_varint

TIME = "__time"
NAME = "__name"
DATABASE = "__db"
RETENTION_POLICY = "__rp"
DIMENSIONS = "__dims"
BY_NAME = "__byname"
TAG = "t:"
FIELD_DOUBLE = "fd:"
FIELD_INT = "fi:"
FIELD_STRING = "fs:"
FIELD_BOOL = "fb:"
FIELD_PREFIXES = (FIELD_DOUBLE, FIELD_INT, FIELD_STRING, FIELD_BOOL)

_SparseColumn = tuple[list[int], list[Any]]


class GroupRows:
    """The points of one group (or one Kapacitor batch), as length-prefixed Point bytes."""

    __slots__ = ("count", "_chunks")

    def __init__(self) -> None:
        self.count = 0
        self._chunks: list[bytes] = []

    def append(self, point: bytes) -> None:
        self._chunks.append(encode_varint(len(point)))
        self._chunks.append(point)
        self.count += 1

    def append_prefixed(self, point: bytes, count: int = 1) -> None:
        """Points that already carry their length varints (as inside Request frames)."""
        self._chunks.append(point)
        self.count += count

    def encoded(self) -> bytes:
        return b"".join(self._chunks)


def table_to_ipc(table: Any) -> bytes:
    """An Arrow table as an IPC stream: typed, compact, and never executable."""
    data: bytes = table_to_ipc_buffer(table).to_pybytes()
    return data


def table_to_ipc_buffer(table: Any) -> Any:
    """``table_to_ipc`` as an Arrow buffer (bytes-like), for a socket: no copy into bytes."""
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def ipc_to_table(data: bytes | bytearray | memoryview) -> Any:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def decode_points(data: bytes) -> Any:
    """The Arrow table of the points ``GroupRows.encoded`` holds."""
    columns = PointColumns()
    for number, body in enumerate(FrameSplitter(max_frame_size=len(data)).feed(data), 1):
        try:
            columns.append(udf_pb2.Point.FromString(body))
        except DecodeError as exc:
            raise ProtocolError(f"point {number} of this micro-batch's group is not a valid Point: {exc}") from None
    return columns.to_arrow()


class PointColumns:
    """Points, column by column: one list per column, sparse tags and fields."""

    __slots__ = ("count", "time", "name", "database", "retention_policy", "dimensions", "by_name", "sparse")

    def __init__(self) -> None:
        self.count = 0
        self.time: list[int] = []
        self.name: list[str] = []
        self.database: list[str] = []
        self.retention_policy: list[str] = []
        self.dimensions: list[tuple[str, ...]] = []
        self.by_name: list[bool] = []
        # column name -> (row numbers, values); most columns are dense, some are not
        self.sparse: dict[str, _SparseColumn] = {}

    def append(self, point: Any) -> None:
        row = self.count
        self.count = row + 1
        self.time.append(point.time)
        self.name.append(point.name)
        self.database.append(point.database)
        self.retention_policy.append(point.retentionPolicy)
        self.dimensions.append(tuple(point.dimensions))
        self.by_name.append(point.byName)
        sparse = self.sparse
        # Once per point: plain loops, no work for absent maps.
        for prefix, mapping in (
            (TAG, point.tags),
            (FIELD_DOUBLE, point.fieldsDouble),
            (FIELD_INT, point.fieldsInt),
            (FIELD_STRING, point.fieldsString),
            (FIELD_BOOL, point.fieldsBool),
        ):
            if not mapping:
                continue
            for key, value in mapping.items():
                column = sparse.get(prefix + key)
                if column is None:
                    column = sparse[prefix + key] = ([], [])
                column[0].append(row)
                column[1].append(value)

    def to_arrow(self) -> Any:
        import pyarrow as pa

        arrays: dict[str, Any] = {
            TIME: pa.array(self.time, pa.int64()),
            NAME: pa.array(self.name, pa.string()),
            DATABASE: pa.array(self.database, pa.string()),
            RETENTION_POLICY: pa.array(self.retention_policy, pa.string()),
            DIMENSIONS: pa.array(self.dimensions, pa.list_(pa.string())),
            BY_NAME: pa.array(self.by_name, pa.bool_()),
        }
        types = {
            TAG: pa.string(),
            FIELD_DOUBLE: pa.float64(),
            FIELD_INT: pa.int64(),
            FIELD_STRING: pa.string(),
            FIELD_BOOL: pa.bool_(),
        }
        # Sorted: map order differs between processes, the table must not.
        for column_name, (rows, values) in sorted(self.sparse.items()):
            if len(rows) != self.count:
                dense: list[Any] = [None] * self.count
                for row, value in zip(rows, values):
                    dense[row] = value
                values = dense
            arrays[column_name] = pa.array(values, types[column_prefix(column_name)])
        return pa.table(arrays)


def column_prefix(column_name: str) -> str:
    """The kind prefix of a tag or field column ("t:", "fd:", ...)."""
    return column_name[: column_name.index(":") + 1]


class StreamMicroBatch:
    """Stream points waiting to be computed, as they arrived: runs of frames, each with
    its points' and groups' offsets (``codec.PointRun``). Grouping waits for ``grouped``,
    once per micro-batch, on the compute thread: the reader only appends."""

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0
        self._runs: list[tuple[bytes, Any, Any]] = []
        self._compiled = True  # every run came from the compiled scanner

    def append(self, group: str, point: bytes) -> None:
        """One point from the reference path: a run of one, its group bytes after it."""
        import numpy as np

        self._compiled = False
        framed = encode_varint(len(point)) + point
        key = group.encode()
        self.append_run(framed + key, np.array([[0, len(framed)]]), np.array([[len(framed), len(framed) + len(key)]]))

    def append_run(self, frames: bytes, points: Any, groups: Any) -> None:
        """Points at ``points`` offsets of ``frames``, with their groups at ``groups`` ((-1, -1): none)."""
        self._runs.append((frames, points, groups))
        self.count += len(points)

    def grouped(self) -> GroupedPoints:
        """The points by group, groups in order of first arrival (group bytes were
        checked to be UTF-8 when they arrived)."""
        import numpy as np

        if not self._runs:
            return GroupedPoints([], np.zeros(0, np.uint8), np.zeros(1, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
        if len(self._runs) == 1:
            frames, points, groups = self._runs[0]
        else:
            shifts = np.cumsum([0] + [len(run[0]) for run in self._runs[:-1]])
            frames = b"".join(run[0] for run in self._runs)
            points = np.concatenate([run[1] + shift for run, shift in zip(self._runs, shifts)])
            groups = np.concatenate([np.where(run[2] >= 0, run[2] + shift, -1) for run, shift in zip(self._runs, shifts)])
        if self._compiled:
            from udf_agent.wire.scanner import group_points
        else:  # the compiled code may not have loaded
            group_points = group_points_by_key
        return group_points(frames, points, groups)


class GroupedPoints:
    """A micro-batch's points by group: group ``i`` is ``keys[i]``, and its ``counts[i]``
    points, length-prefixed and in arrival order, are ``data[bounds[i]:bounds[i + 1]]``.
    ``arrival[j]`` is when the j-th point so ordered arrived (0: first in the micro-batch)."""

    def __init__(self, keys: list[bytes], data: Any, bounds: Any, counts: Any, arrival: Any):
        self.keys = [key.decode() for key in keys]
        self.data = data
        self.bounds = bounds
        self.counts = counts
        self.arrival = arrival

    def __len__(self) -> int:
        return len(self.keys)

    def points(self, index: int) -> bytes:
        data: bytes = self.data[self.bounds[index] : self.bounds[index + 1]].tobytes()
        return data

    def arrow(self) -> Any:
        """Every group's points as one Arrow binary array, without copying them."""
        import numpy as np
        import pyarrow as pa

        offsets = np.ascontiguousarray(self.bounds, dtype=np.int32)
        return pa.Array.from_buffers(pa.binary(), len(self.keys), [None, pa.py_buffer(offsets), pa.py_buffer(self.data)])


def in_arrival_order(output: bytes, arrival: Any, compiled: bool) -> tuple[bytes, Any] | None:
    """Output frames, one per point in grouped order (``GroupedPoints.arrival``), put back in
    the order the points arrived, with where each frame ends; None unless ``output`` holds
    exactly one whole frame per point."""
    import numpy as np

    if compiled:
        from udf_agent.wire.scanner import _gather, frame_ends

        ends = frame_ends(output)
    else:
        ends = prefixed_ends(output)
    if ends is None or len(ends) != len(arrival):
        return None
    back = np.empty_like(arrival)
    back[arrival] = np.arange(len(arrival))
    starts = np.concatenate(([0], ends[:-1]))
    if compiled:
        data, offsets = _gather(np.frombuffer(output, dtype=np.uint8), np.stack([starts, ends], axis=1)[back])
        return data.tobytes(), offsets[1:]
    pieces = [output[starts[i] : ends[i]] for i in back.tolist()]
    return b"".join(pieces), np.cumsum([len(piece) for piece in pieces])


def prefixed_ends(data: bytes) -> Any:
    """Where each length-prefixed item (a frame, or a point as the reader keeps it) of
    ``data`` ends, walked in plain Python; None unless ``data`` is whole items only."""
    import numpy as np

    from udf_agent.wire.frames import read_varint

    ends, pos = [], 0
    while pos < len(data):
        length, body = read_varint(data, pos)
        pos = body + length
        ends.append(pos)
    return np.array(ends, np.int64) if pos == len(data) else None


def group_points_by_key(frames: bytes, points: Any, groups: Any) -> GroupedPoints:
    """``scan.group_points`` in plain Python, point by point."""
    import numpy as np

    chunks: dict[bytes, list[bytes]] = {}
    arrivals: dict[bytes, list[int]] = {}
    for number, ((start, end), (group_start, group_end)) in enumerate(zip(points.tolist(), groups.tolist())):
        key = frames[group_start:group_end] if group_start >= 0 else b""
        chunks.setdefault(key, []).append(frames[start:end])
        arrivals.setdefault(key, []).append(number)
    data = [b"".join(parts) for parts in chunks.values()]
    bounds = np.cumsum([0] + [len(d) for d in data], dtype=np.int64)
    arrival = np.array([n for numbers in arrivals.values() for n in numbers], np.int64)
    counts = np.array([len(p) for p in chunks.values()])
    return GroupedPoints(list(chunks), np.frombuffer(b"".join(data), np.uint8), bounds, counts, arrival)


class KapacitorBatch:
    """One complete batch as Kapacitor sent it, BeginBatch to EndBatch."""

    __slots__ = ("group", "name", "tags", "by_name", "tmax", "rows")

    def __init__(self, begin: Any):
        self.group: str = begin.group
        self.name: str = begin.name
        self.tags: dict[str, str] = dict(begin.tags)
        self.by_name: bool = begin.byName
        self.tmax: int = 0
        self.rows = GroupRows()

    def close(self, end: Any) -> None:
        # EndBatch defines the batch: its name, tags and tmax win over BeginBatch's.
        self.name = end.name or self.name
        if end.tags:
            self.tags = dict(end.tags)
        self.tmax = end.tmax


class BatchMicroBatch:
    """Complete Kapacitor batches waiting to be computed, in arrival order."""

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0
        self.batches: list[KapacitorBatch] = []

    def add(self, batch: KapacitorBatch) -> None:
        self.batches.append(batch)
        self.count += batch.rows.count
