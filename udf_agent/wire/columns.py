"""The Arrow table a group's points become where they are computed.

Column names carry a prefix, so tags and fields can never collide with each other or with
the point's metadata:

    __time __name __db __rp __dims __byname   point metadata
    t:KEY                                     tags
    fd:KEY fi:KEY fs:KEY fb:KEY               double/int/string/bool fields

``decode_points`` is the plain-Python reference; the compiled decoder is ``pointcodec``.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from udf_agent import udf_pb2
from udf_agent.wire.frames import FrameSplitter, ProtocolError

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


def table_message(table: Any) -> Any:
    """A table as one Arrow IPC record batch message, its schema left out: for a link whose
    ends both know it (the compute contract's task and result tables, a micro-batch each way),
    where a stream's schema message and set-up cost more than a small table's data."""
    import pyarrow as pa

    batches = table.to_batches()
    if len(batches) != 1:
        batches = table.combine_chunks().to_batches() or [pa.RecordBatch.from_pylist([], schema=table.schema)]
    return batches[0].serialize()


def message_table(data: bytes | bytearray | memoryview, schema: Any) -> Any:
    """The table ``table_message`` sent, read with the ``schema`` it was sent with."""
    import pyarrow as pa

    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(data), schema)])


def decode_points(data: bytes) -> Any:
    """The Arrow table of the points ``batches.GroupRows.encoded`` holds."""
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
