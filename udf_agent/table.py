"""Incoming points, grouped, and the Arrow tables they become.

The reader keeps each point as the bytes Kapacitor sent (``GroupRows``): no
protobuf object per point on its path. Where the group is computed (a Spark
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
from udf_agent.codec import FrameSplitter, ProtocolError, encode_varint

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
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def ipc_to_table(data: bytes) -> Any:
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
    """Stream points waiting to be computed, grouped by Kapacitor group id."""

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0
        self.groups: dict[str, GroupRows] = {}

    def append(self, group: str, point: bytes) -> None:
        self.rows(group).append(point)
        self.count += 1

    def rows(self, group: str) -> GroupRows:
        rows = self.groups.get(group)
        if rows is None:
            rows = self.groups[group] = GroupRows()
        return rows


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
