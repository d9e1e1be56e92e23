"""A stream micro-batch's tasks and every micro-batch's results as plain columns: optional byte
strings in one buffer each, numbers in numpy arrays.

The compute contract's tables (``contract.py``) are what a Spark job reads and writes. A stream
micro-batch at a trickle is a few groups, where making, sending and reading Arrow tables cost
the agent and its resident worker more than the points' own work (pyarrow's calls cost several
times as much between micro-batches as in a loop: docs/hot-path.md). Here, a column is one
buffer and its lengths, packed for the resident link as lengths then bytes (the links'
little-endian eight-byte integers, ``wire/links.py``), and read back without a copy. Either
form converts to the other, row for row (``StreamTasks.table``, ``ResultColumns.of_table``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from udf_agent.compute.contract import RESULT_SCHEMA, TASK_SCHEMA, Result, Task

# Lengths and numbers on the link: the links' byte order and width.
INTEGERS = np.dtype("<i8")
NONE = -1  # the length of a missing item
# Up to this many items, a column's lengths are walked in Python: a trickle's slice has a few,
# where numpy's or a compiled call's overhead costs more than the walk (and past a few dozen,
# the walk costs more: checking 4,096 lengths so took 0.9 ms more than the compiled call).
FEW_ROWS = 16


class Blobs:
    """Optional byte strings one after another in ``data``: item ``i`` is the ``lengths[i]``
    bytes ending at ``ends[i]``, or None where ``lengths[i]`` is ``NONE``."""

    __slots__ = ("data", "lengths", "_ends")

    def __init__(self, data: Any, lengths: np.ndarray):
        self.data = memoryview(data).cast("B")
        self.lengths = lengths
        self._ends: np.ndarray | None = None

    @classmethod
    def of(cls, items: Sequence[bytes | None]) -> Blobs:
        lengths = np.array([NONE if item is None else len(item) for item in items], INTEGERS)
        return cls(b"".join(item for item in items if item), lengths)

    @classmethod
    def of_texts(cls, items: Sequence[str | None]) -> Blobs:
        return cls.of([None if item is None else item.encode() for item in items])

    @classmethod
    def missing(cls, count: int) -> Blobs:
        return cls(b"", _NONE_LENGTHS[:count] if count <= len(_NONE_LENGTHS) else np.full(count, NONE, INTEGERS))

    @classmethod
    def of_arrow(cls, column: pa.Array | pa.ChunkedArray) -> Blobs:
        """A binary or string column's items, its data buffer shared, not copied."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        count = len(column)
        if count == 0:
            return cls.missing(0)
        _, offsets_buffer, data_buffer = column.buffers()
        offset_type = np.int64 if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type) else np.int32
        offsets = np.frombuffer(offsets_buffer, offset_type)[column.offset : column.offset + count + 1].astype(INTEGERS)
        lengths = np.diff(offsets)
        if column.null_count:
            lengths[column.is_null().to_numpy(zero_copy_only=False)] = NONE
        first, last = int(offsets[0]), int(offsets[-1])
        return cls(memoryview(data_buffer)[first:last] if data_buffer is not None else b"", lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def ends(self) -> np.ndarray:
        """Where each item ends in ``data`` (a missing one takes no bytes)."""
        if self._ends is None:
            if len(self.lengths) <= FEW_ROWS:  # a trickle's few: a walk costs less than numpy's two calls
                ends, end = [], 0
                for length in self.lengths.tolist():
                    end += max(length, 0)
                    ends.append(end)
                self._ends = np.array(ends, INTEGERS)
            else:
                self._ends = np.cumsum(np.maximum(self.lengths, 0), dtype=INTEGERS)
        return self._ends

    def all_missing(self) -> bool:
        if len(self.lengths) <= FEW_ROWS:
            return all(length == NONE for length in self.lengths.tolist())
        return bool((self.lengths == NONE).all())

    def tolist(self) -> list[bytes | None]:
        # Walked in Python: a micro-batch at a trickle has a few items, where numpy's calls
        # (a cumulative sum, a test for all missing) cost more than the walk.
        items: list[bytes | None] = []
        data, end = self.data, 0
        for length in self.lengths.tolist():
            if length == NONE:
                items.append(None)
            else:
                items.append(data[end : end + length].tobytes())
                end += length
        return items

    def texts(self) -> list[str | None]:
        return [None if item is None else item.decode() for item in self.tolist()]

    def slice(self, first: int, count: int) -> Blobs:
        if first == 0 and count == len(self):  # a micro-batch in one slice
            return self
        start = int(self.ends[first - 1]) if first else 0
        stop = int(self.ends[first + count - 1]) if count else start
        return Blobs(self.data[start:stop], self.lengths[first : first + count])

    @classmethod
    def concat(cls, columns: Sequence[Blobs]) -> Blobs:
        return cls(b"".join(column.data for column in columns), np.concatenate([column.lengths for column in columns]))

    def without(self, rows: Sequence[int]) -> Blobs:
        """These items with ``rows`` made missing (their bytes dropped)."""
        items = self.tolist()
        for row in rows:
            items[row] = None
        return Blobs.of(items)

    def arrow(self, kind: pa.DataType) -> pa.Array:
        """As an Arrow column of ``kind`` (binary or string), sharing ``data``."""
        valid = self.lengths != NONE
        bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little"))
        offsets = np.concatenate(([0], self.ends)).astype(np.int32)
        return pa.Array.from_buffers(kind, len(self), [bitmap, pa.py_buffer(offsets), pa.py_buffer(self.data)])


# A few missing items' lengths, shared (read-only) by every Blobs.missing of a few rows:
# ``np.full`` costs more than a slice's other bookkeeping at a trickle.
_NONE_LENGTHS = np.full(64, NONE, INTEGERS)
_NONE_LENGTHS.flags.writeable = False


def pack(numbers: Sequence[np.ndarray], blobs: Sequence[Blobs]) -> list[Any]:
    """Columns of one length as a message's parts: the row count, each number column, each
    blob column's lengths, then each blob column's bytes (handed on, never joined here)."""
    count = len(blobs[0]) if blobs else len(numbers[0])
    # The integers as one part: a part costs the link a buffer to gather (and Python a
    # conversion), six of them a trickle's slice.
    integers = np.concatenate(([count], *numbers, *(column.lengths for column in blobs)), dtype=INTEGERS)
    return [integers.tobytes()] + [column.data for column in blobs]


def unpack(payload: Any, number_columns: int, blob_columns: int) -> tuple[list[np.ndarray], list[Blobs]]:
    """``pack``'s columns from its joined parts, over ``payload`` (no copy); ValueError if the
    payload does not hold them exactly."""
    view = memoryview(payload).cast("B")
    if len(view) < INTEGERS.itemsize:
        raise ValueError(f"a packed message of {len(view)} bytes holds no row count")
    count = int.from_bytes(view[: INTEGERS.itemsize], "little", signed=True)
    columns = number_columns + blob_columns
    header = INTEGERS.itemsize * (1 + count * columns)
    if count < 0 or len(view) < header:
        raise ValueError(f"a packed message of {len(view)} bytes cannot hold {columns} columns of {count} rows")
    integers = np.frombuffer(view, INTEGERS, count * columns, INTEGERS.itemsize)
    # Each column a view of its own stretch (cheaper than the rows of a 2-D view).
    numbers = [integers[column * count : (column + 1) * count] for column in range(number_columns)]
    lengths_at = number_columns * count
    if count <= FEW_ROWS:
        sizes = _blob_sizes_of_few(integers[lengths_at:].tolist(), blob_columns, count, len(view))
    else:
        sizes = blob_sizes(integers[lengths_at:].reshape(blob_columns, count), len(view)).tolist()
    if (sizes and sizes[0] < 0) or header + sum(sizes) > len(view):
        raise ValueError("a packed message's lengths run past its bytes")
    blobs, pos = [], header
    for column, size in enumerate(sizes):
        start = lengths_at + column * count
        blobs.append(Blobs(view[pos : pos + size], integers[start : start + count]))
        pos += size
    if pos != len(view):
        raise ValueError(f"a packed message has {len(view) - pos} bytes past its columns")
    return numbers, blobs


def _blob_sizes_of_few(lengths: list[int], columns: int, count: int, limit: int) -> list[int]:
    """``blob_sizes`` of lengths given as one list, ``columns`` columns of ``count`` each."""
    sizes = []
    for start in range(0, columns * count, count) if count else ():
        size = 0
        for length in lengths[start : start + count]:
            if length < NONE or length > limit:
                return [-1] * columns
            if length > 0:
                size += length
        sizes.append(size)
    return sizes or [0] * columns


@njit(cache=True, nogil=True)
def blob_sizes(lengths: Any, limit: int) -> Any:
    """The bytes of each blob column (a row of ``lengths``; a missing item has none), or -1 for
    every column if a length is below ``NONE`` or above ``limit``: each length is checked
    before it is summed, so huge ones cannot wrap the sums around. One compiled pass for the
    three numpy reductions it replaced (each cost more than a trickle's few lengths; twin:
    ``tests/test_packed.py``)."""
    columns, count = lengths.shape
    sizes = np.zeros(columns, np.int64)
    for column in range(columns):
        for row in range(count):
            length = lengths[column, row]
            if length < NONE or length > limit:
                sizes[:] = -1
                return sizes
            if length > 0:
                sizes[column] += length
    return sizes


def alternated(first: Blobs, second: Blobs) -> tuple[bytes, np.ndarray]:
    """Item 0 of ``first`` then of ``second``, item 1 of each, and so on, in one buffer (a
    missing item as empty); and where each item begins in it, then the end."""
    if len(first) > FEW_ROWS:
        joined, bounds = _alternated(*(_read_only(array) for array in (np.frombuffer(first.data, np.uint8), first.lengths, np.frombuffer(second.data, np.uint8), second.lengths)))
        return joined.tobytes(), bounds
    # A trickle's few groups: one walk over the lengths as Python ints costs less than the
    # compiled call's arguments.
    parts: list[memoryview] = []
    bounds = [0]
    first_at = second_at = joined_at = 0
    for first_length, second_length in zip(first.lengths.tolist(), second.lengths.tolist()):
        first_length, second_length = max(first_length, 0), max(second_length, 0)
        parts.append(first.data[first_at : first_at + first_length])
        parts.append(second.data[second_at : second_at + second_length])
        first_at += first_length
        second_at += second_length
        bounds.append(joined_at + first_length)
        joined_at += first_length + second_length
        bounds.append(joined_at)
    return b"".join(parts), np.array(bounds, np.int64)


@njit(cache=True, nogil=True)
def _alternated(first: Any, first_lengths: Any, second: Any, second_lengths: Any) -> tuple[Any, Any]:
    """``alternated`` for many items: a Python walk took 2 µs an item (100 groups of a burst, 0.2 ms)."""
    count = first_lengths.shape[0]
    joined = np.empty(first.shape[0] + second.shape[0], np.uint8)
    bounds = np.empty(2 * count + 1, np.int64)
    bounds[0] = 0
    first_at = second_at = pos = 0
    for i in range(count):
        length = max(first_lengths[i], 0)
        joined[pos : pos + length] = first[first_at : first_at + length]
        first_at += length
        pos += length
        bounds[2 * i + 1] = pos
        length = max(second_lengths[i], 0)
        joined[pos : pos + length] = second[second_at : second_at + length]
        second_at += length
        pos += length
        bounds[2 * i + 2] = pos
    return joined[:pos], bounds


def _read_only(array: np.ndarray) -> np.ndarray:
    """A read-only view: numba compiles a function once for read-only arrays and once more for
    writable ones, and what a link receives may be either."""
    view = array.view()
    view.flags.writeable = False
    return view


def warm_up() -> None:
    """Compiles (or loads from numba's cache) ``blob_sizes`` and ``_alternated``, off the path of the first micro-batch."""
    lengths = np.frombuffer(bytes(INTEGERS.itemsize), INTEGERS)
    blob_sizes(lengths.reshape(1, 1), 0)
    none = np.frombuffer(b"", np.uint8)
    _alternated(none, lengths, none, lengths)


@dataclass
class StreamTasks:
    """A stream micro-batch's slice of groups: task ``i`` is group ``keys[i]`` (its number in
    the micro-batch ``seq[i]``), its new points ``data[i]`` (length-prefixed, as Kapacitor sent
    them), its kept history and state. The packed twin of a stream task table."""

    seq: np.ndarray
    keys: list[str]
    data: Blobs
    histories: Blobs
    states: Blobs

    def __len__(self) -> int:
        return len(self.keys)

    @property
    def num_rows(self) -> int:
        return len(self.keys)

    def sizes(self) -> np.ndarray:
        """Each group's bytes of new points."""
        sizes: np.ndarray = np.maximum(self.data.lengths, 0)
        return sizes

    def payload_bytes(self) -> int:
        """Bytes of new points, histories and states it carries: about its weight on the wire."""
        return int(sum(np.maximum(blobs.lengths, 0).sum() for blobs in (self.data, self.histories, self.states)))

    def slice(self, first: int, count: int) -> StreamTasks:
        end = first + count
        return StreamTasks(self.seq[first:end], self.keys[first:end], self.data.slice(first, count), self.histories.slice(first, count), self.states.slice(first, count))

    def tasks(self) -> list[Task]:
        """Each group's task, one by one (a UDF called per group, or a group at fault)."""
        rows = zip(self.keys, self.data.tolist(), self.histories.tolist(), self.states.texts())
        return [Task(seq, key, data or b"", history, state) for seq, (key, data, history, state) in zip(self.seq.tolist(), rows)]

    def pack(self) -> list[Any]:
        return pack([self.seq], [Blobs.of_texts(self.keys), self.data, self.histories, self.states])

    @classmethod
    def unpack(cls, payload: Any) -> StreamTasks:
        (seq,), (keys, data, histories, states) = unpack(payload, 1, 4)
        texts = keys.texts()
        if any(key is None for key in texts):
            raise ValueError("a packed stream task has no group key")
        return cls(seq, [key or "" for key in texts], data, histories, states)

    def table(self) -> pa.Table:
        """As a task table (``contract.TASK_SCHEMA``), for an engine that runs Spark jobs."""
        blobs = [self.data, self.histories, self.states]
        columns = _arrow_columns(self, TASK_SCHEMA, blobs)
        return pa.Table.from_arrays(columns + [pa.nulls(len(self), kind) for kind in TASK_SCHEMA.types[len(columns) :]], schema=TASK_SCHEMA)

    @classmethod
    def of_table(cls, table: pa.Table) -> StreamTasks:
        seq = table.column("seq").to_numpy().astype(INTEGERS)
        blobs = (Blobs.of_arrow(table.column(name)) for name in ("data", "history", "state"))
        return cls(seq, table.column("key").to_pylist(), *blobs)


@dataclass
class ResultColumns:
    """What each task of a micro-batch's slice gave, row for row with its tasks: its output
    frames (missing: none), new history and state, error, and how many points it emitted. The
    packed twin of a result table, whatever the edge."""

    output: Blobs
    histories: Blobs
    states: Blobs
    errors: Blobs
    emitted: np.ndarray

    def __len__(self) -> int:
        return len(self.emitted)

    def pack(self) -> list[Any]:
        return pack([self.emitted], [self.output, self.histories, self.states, self.errors])

    @classmethod
    def unpack(cls, payload: Any) -> ResultColumns:
        (emitted,), (output, histories, states, errors) = unpack(payload, 1, 4)
        return cls(output, histories, states, errors, emitted)

    @classmethod
    def concat(cls, parts: Sequence[ResultColumns]) -> ResultColumns:
        """The results of consecutive slices, one after another."""
        output, histories, states, errors = (Blobs.concat([getattr(part, name) for part in parts]) for name in ("output", "histories", "states", "errors"))
        return cls(output, histories, states, errors, np.concatenate([part.emitted for part in parts]))

    @classmethod
    def of_results(cls, results: Sequence[Result]) -> ResultColumns:
        return cls(
            Blobs.of([result.output for result in results]),
            Blobs.of([result.history for result in results]),
            Blobs.of_texts([result.state for result in results]),
            Blobs.of_texts([result.error for result in results]),
            np.fromiter((result.emitted for result in results), INTEGERS, len(results)),
        )

    @classmethod
    def of_table(cls, table: pa.Table) -> ResultColumns:
        output, histories, states, errors = (Blobs.of_arrow(table.column(name)) for name in ("output", "history", "state", "error"))
        return cls(output, histories, states, errors, table.column("emitted").to_numpy().astype(INTEGERS))

    def table(self, tasks: StreamTasks) -> pa.Table:
        """As the result table of ``tasks`` (``contract.RESULT_SCHEMA``)."""
        columns = _arrow_columns(tasks, RESULT_SCHEMA, [self.output, self.histories, self.states, self.errors])
        return pa.Table.from_arrays(columns + [pa.array(self.emitted, pa.int64())], schema=RESULT_SCHEMA)


def _arrow_columns(tasks: StreamTasks, schema: pa.Schema, blobs: Sequence[Blobs]) -> list[pa.Array]:
    """A contract table's first columns: each task's seq and key, then ``blobs`` as the
    schema's next columns' types."""
    kinds = schema.types[2 : 2 + len(blobs)]
    return [pa.array(tasks.seq, pa.int64()), pa.array(tasks.keys, pa.string()), *(column.arrow(kind) for column, kind in zip(blobs, kinds))]
