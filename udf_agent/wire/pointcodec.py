"""Points to Arrow columns and back, compiled with numba.

``table.decode_points`` is the reference: protobuf parses each point and Python
appends its values to columns, about 5 µs a point. Here compiled code walks the
points' bytes once, recording every value as a number or a byte span, and the
columns are built from those arrays by numpy and Arrow: no Python object per
point. The table is the reference's, column for column (tests compare them).
``encode_rows`` goes the other way for the common result shape (one output
point per input point, numeric fields): each output point is the input point's
leading fields (time to tags), copied, followed by the new fields.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
from numba import njit

from udf_agent.wire import columns as cols
from udf_agent.wire.frames import ProtocolError
from udf_agent.wire.kernels import gather, invalid_utf8, skip_field, varint

# Map fields of a Point and the column prefix of each.
_TAGS, _DOUBLES, _INTS, _STRINGS, _BOOLS = 7, 8, 9, 10, 12
_KINDS = (_TAGS, _DOUBLES, _INTS, _STRINGS, _BOOLS)
_PREFIX = {_TAGS: cols.TAG, _DOUBLES: cols.FIELD_DOUBLE, _INTS: cols.FIELD_INT, _STRINGS: cols.FIELD_STRING, _BOOLS: cols.FIELD_BOOL}
_FIRST_FIELD_MAP = 8  # fields 1-7 (time to tags) lead a point as Kapacitor writes it


@njit(cache=True, nogil=True)
def _count(buf: Any) -> tuple[int, int, int, int]:
    """(points, dimensions, map entries, bad point number or -1) of length-prefixed points."""
    size = buf.shape[0]
    pos = 0
    points = dims = entries = 0
    while pos < size:
        length, pos = varint(buf, pos, size)
        if pos < 0 or length < 0 or length > size - pos:
            return points, dims, entries, points
        end = pos + length
        while pos < end:
            key, pos = varint(buf, pos, end)
            if pos < 0:
                return points, dims, entries, points
            pos, value_start, _ = skip_field(buf, key, pos, end)
            if pos < 0:
                return points, dims, entries, points
            field = key >> 3
            if value_start >= 0:
                if field == 6:
                    dims += 1
                elif field == 7 or field == 8 or field == 9 or field == 10 or field == 12:
                    entries += 1
        points += 1
    return points, dims, entries, -1


@njit(cache=True, nogil=True)
def _decode(
    buf: Any,
    time: Any, strings: Any, by_name: Any, header: Any, span: Any,
    dim_point: Any, dim_span: Any,
    entry_point: Any, entry_field: Any, entry_key: Any, entry_value: Any, entry_number: Any, entry_hash: Any,
) -> int:
    """Fills the arrays (sized by ``_count``); returns the number of a bad point, or -1.

    ``strings`` holds name, database and retention policy spans; ``header`` the span of
    each point's leading fields (1-7), end -1 when one of them follows a field map;
    ``span`` each point's bytes, its length varint included.
    """
    size = buf.shape[0]
    pos = 0
    point = dim = entry = 0
    while pos < size:
        span[point, 0] = pos
        length, pos = varint(buf, pos, size)
        end = pos + length
        span[point, 1] = end
        time[point] = 0
        by_name[point] = False
        for k in range(6):
            strings[point, k] = 0
        header[point, 0] = pos
        header[point, 1] = end
        seen_map = False
        while pos < end:
            key, pos = varint(buf, pos, end)
            field = key >> 3
            if field >= 8 and not seen_map:
                seen_map = True
                header[point, 1] = pos - 1 if key < 128 else -1
            elif field < 8 and seen_map:
                header[point, 1] = -1
            if field == 1 and key & 7 == 0:
                time[point], pos = varint(buf, pos, end)
                continue
            if field == 11 and key & 7 == 0:
                value, pos = varint(buf, pos, end)
                by_name[point] = value != 0
                continue
            pos, value_start, value_end = skip_field(buf, key, pos, end)
            if value_start < 0:
                continue
            if 2 <= field <= 4:
                strings[point, 2 * (field - 2)] = value_start
                strings[point, 2 * (field - 2) + 1] = value_end
            elif field == 6:
                dim_point[dim] = point
                dim_span[dim, 0] = value_start
                dim_span[dim, 1] = value_end
                dim += 1
            elif field == 7 or field == 8 or field == 9 or field == 10 or field == 12:
                entry_point[entry] = point
                entry_field[entry] = field
                entry_key[entry, 0] = entry_key[entry, 1] = 0
                entry_value[entry, 0] = entry_value[entry, 1] = 0
                entry_number[entry] = 0
                cursor = value_start
                while cursor < value_end:
                    inner, cursor = varint(buf, cursor, value_end)
                    if cursor < 0:
                        return point
                    inner_field, wire_type = inner >> 3, inner & 7
                    if wire_type == 0 and inner_field == 2:
                        entry_number[entry], cursor = varint(buf, cursor, value_end)
                        if cursor < 0:
                            return point
                        continue
                    if wire_type == 1 and inner_field == 2:
                        if cursor + 8 > value_end:
                            return point
                        bits = np.int64(0)
                        for b in range(8):
                            bits |= np.int64(buf[cursor + b]) << (8 * b)
                        entry_number[entry] = bits
                        cursor += 8
                        continue
                    cursor, span_start, span_end = skip_field(buf, inner, cursor, value_end)
                    if cursor < 0:
                        return point
                    if span_start >= 0 and inner_field == 1:
                        entry_key[entry, 0] = span_start
                        entry_key[entry, 1] = span_end
                    elif span_start >= 0 and inner_field == 2:
                        entry_value[entry, 0] = span_start
                        entry_value[entry, 1] = span_end
                # FNV-1a over the map's number and the key: names the column.
                digest = np.uint64(14695981039346656037) ^ np.uint64(field)
                for b in range(entry_key[entry, 0], entry_key[entry, 1]):
                    digest = (digest ^ np.uint64(buf[b])) * np.uint64(1099511628211)
                entry_hash[entry] = digest
                entry += 1
        point += 1
    return -1


# Distinct map keys a micro-batch's points usually carry (tags and fields): found by
# a linear search that starts where the previous point's key was, as points of one
# measurement list their keys in the same order. Past this many, np.unique sorts them.
_FEW_COLUMNS = 64


@njit(cache=True, nogil=True)
def _assign_columns(entry_hash: Any, limit: int) -> tuple[int, Any, Any]:
    """Each entry's column (the index of its key hash in order of first appearance), and
    each column's first entry; the count is -1 when there are more than ``limit`` keys."""
    column_of_entry = np.empty(entry_hash.shape[0], np.int64)
    distinct = np.empty(limit, np.uint64)
    first = np.empty(limit, np.int64)
    found = 0
    guess = 0
    for entry in range(entry_hash.shape[0]):
        digest = entry_hash[entry]
        column = -1
        for step in range(found):
            candidate = guess + step
            if candidate >= found:
                candidate -= found
            if distinct[candidate] == digest:
                column = candidate
                break
        if column < 0:
            if found == limit:
                return -1, column_of_entry, first
            distinct[found] = digest
            first[found] = entry
            column = found
            found += 1
        column_of_entry[entry] = column
        guess = column + 1
        if guess >= found:
            guess = 0
    return found, column_of_entry, first[:found].copy()


@njit(cache=True, nogil=True)
def _entries_by_column(column_of_entry: Any, columns: int) -> tuple[Any, Any]:
    """Entries grouped by column, in entry order within each (a counting sort), and
    where each column's entries begin (``columns + 1`` bounds)."""
    bounds = np.zeros(columns + 1, np.int64)
    for column in column_of_entry:
        bounds[column + 1] += 1
    for column in range(columns):
        bounds[column + 1] += bounds[column]
    cursor = bounds[:-1].copy()
    order = np.empty(column_of_entry.shape[0], np.int64)
    for entry in range(column_of_entry.shape[0]):
        column = column_of_entry[entry]
        order[cursor[column]] = entry
        cursor[column] += 1
    return order, bounds


@njit(cache=True, nogil=True)
def _scatter_spans(entry_point: Any, entry_value: Any, entries: Any, count: int) -> tuple[Any, Any, Any]:
    """One string column: each point's value span ((0, 0) where absent), which points
    have one, and whether all do."""
    spans = np.zeros((count, 2), np.int64)
    valid = np.zeros(count, np.bool_)
    for entry in entries:
        point = entry_point[entry]
        spans[point, 0] = entry_value[entry, 0]
        spans[point, 1] = entry_value[entry, 1]
        valid[point] = True
    return spans, valid, valid.all()


@njit(cache=True, nogil=True)
def _scatter_numbers(entry_point: Any, entry_number: Any, entries: Any, count: int) -> tuple[Any, Any, Any]:
    """One numeric column: each point's 64 bits (0 where absent), which points have one,
    and whether all do."""
    numbers = np.zeros(count, np.int64)
    valid = np.zeros(count, np.bool_)
    for entry in entries:
        point = entry_point[entry]
        numbers[point] = entry_number[entry]
        valid[point] = True
    return numbers, valid, valid.all()


@njit(cache=True, nogil=True)
def _same_keys(buf: Any, entry_key: Any, representative: Any) -> bool:
    """Whether every entry's key bytes equal those of its column's representative entry."""
    for entry in range(entry_key.shape[0]):
        other = representative[entry]
        start, end = entry_key[entry, 0], entry_key[entry, 1]
        other_start = entry_key[other, 0]
        if end - start != entry_key[other, 1] - other_start:
            return False
        for b in range(end - start):
            if buf[start + b] != buf[other_start + b]:
                return False
    return True



@njit(cache=True, nogil=True)
def _first_invalid_text(buf: Any, strings: Any, dim_point: Any, dim_span: Any, entry_point: Any, entry_field: Any, entry_key: Any, entry_value: Any) -> int:
    """The first point with a name, database, retention policy, dimension, map key or string
    value that is not valid UTF-8, or -1."""
    bad = -1
    for point in range(strings.shape[0]):
        if invalid_utf8(buf, strings[point, 0], strings[point, 1]) or invalid_utf8(buf, strings[point, 2], strings[point, 3]) or invalid_utf8(buf, strings[point, 4], strings[point, 5]):
            bad = point
            break
    for dim in range(dim_span.shape[0]):
        if (bad < 0 or dim_point[dim] < bad) and invalid_utf8(buf, dim_span[dim, 0], dim_span[dim, 1]):
            bad = dim_point[dim]
    for entry in range(entry_key.shape[0]):
        point = entry_point[entry]
        if bad >= 0 and point >= bad:
            continue
        text = entry_field[entry] == _TAGS or entry_field[entry] == _STRINGS
        if invalid_utf8(buf, entry_key[entry, 0], entry_key[entry, 1]) or (text and invalid_utf8(buf, entry_value[entry, 0], entry_value[entry, 1])):
            bad = point
    return bad


@njit(cache=True, nogil=True)
def _decode_all(buf: Any, few_columns: int) -> tuple[Any, ...]:
    """Everything ``_Columns`` keeps, from one compiled call: the counts, the arrays
    ``_decode`` fills, the UTF-8 check, and the entries by column when there are at most
    ``few_columns`` (found -1 otherwise). Each was a numpy or compiled call of its own, 73 µs
    a slice of moving_avg's micro-batch at a trickle; the first failure is
    (bad point, -1) or (-1, point with invalid text)."""
    points, dims, entries, bad = _count(buf)
    time = np.empty(points, np.int64)
    strings = np.zeros((points, 6), np.int64)
    by_name = np.empty(points, np.bool_)
    header = np.empty((points, 2), np.int64)
    span = np.empty((points, 2), np.int64)
    dim_point = np.empty(dims, np.int64)
    dim_span = np.empty((dims, 2), np.int64)
    entry_point = np.empty(entries, np.int64)
    entry_field = np.empty(entries, np.int64)
    entry_key = np.empty((entries, 2), np.int64)
    entry_value = np.empty((entries, 2), np.int64)
    entry_number = np.empty(entries, np.int64)
    entry_hash = np.empty(entries, np.uint64)
    bad_text = -1
    found = -1
    column_of_entry = np.empty(0, np.int64)
    first = np.empty(0, np.int64)
    order = np.empty(0, np.int64)
    bounds = np.zeros(1, np.int64)
    same = True
    if bad < 0:
        bad = _decode(buf, time, strings, by_name, header, span, dim_point, dim_span, entry_point, entry_field, entry_key, entry_value, entry_number, entry_hash)
    if bad < 0:
        bad_text = _first_invalid_text(buf, strings, dim_point, dim_span, entry_point, entry_field, entry_key, entry_value)
    if bad < 0 and bad_text < 0:
        found, column_of_entry, first = _assign_columns(entry_hash, few_columns)
        if found >= 0:
            order, bounds = _entries_by_column(column_of_entry, found)
            same = _same_keys(buf, entry_key, first[column_of_entry])
    named = strings[:, 1] > strings[:, 0]
    return (
        bad, bad_text, found, time, strings, by_name, header, span, named, dim_point, dim_span,
        entry_point, entry_field, entry_key, entry_value, entry_number, entry_hash, first, order, bounds, same,
    )


def _strings(buf: np.ndarray, spans: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    data, offsets = gather(buf, spans)
    bitmap = None if valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))
    null_count = -1 if valid is None else int(len(valid) - valid.sum())
    # Valid UTF-8: every string span was checked when the points were decoded.
    return pa.StringArray.from_buffers(len(spans), pa.py_buffer(offsets), pa.py_buffer(data), bitmap, null_count)


class Headers:
    """Where each decoded point lies in its bytes: whole (``points``, length varint
    included) and its leading fields, time to tags (``spans``, for ``encode_rows``)."""

    def __init__(self, raw: bytes, buf: np.ndarray, points: np.ndarray, spans: np.ndarray, by_name: np.ndarray, named: np.ndarray):
        self.raw = raw
        self.buf = buf
        self.points = points
        self.spans = spans
        self.by_name = by_name
        self.named = named  # the point has a name (else the output takes the group's)

    def points_at(self, offsets: np.ndarray) -> np.ndarray:
        """For byte offsets that fall between points, how many points precede each."""
        return np.searchsorted(self.points[:, 0], offsets, side="left") if len(self.points) else np.zeros(len(offsets), np.int64)

    def last_points(self, starts: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """For groups of consecutive points (group ``i`` is points ``starts[i]:starts[i + 1]``),
        the bytes of each one's last ``rows`` points, one group after another, and how many
        bytes each group has (-1 for a group with none)."""
        return _last_points(self.buf, self.points, np.ascontiguousarray(starts, np.int64), rows)

    def points_bytes(self, rows: np.ndarray) -> bytes:
        """The length-prefixed bytes of the points at ``rows``, in that order."""
        spans = self.points[rows]
        if len(rows) and (np.diff(rows) == 1).all():
            return self.buf[spans[0, 0] : spans[-1, 1]].tobytes()
        data, _ = gather(self.buf, spans)
        return data.tobytes()


@njit(cache=True, nogil=True)
def _last_points(buf: Any, points: Any, starts: Any, rows: int) -> tuple[Any, Any]:
    """``Headers.last_points``: a group's last points are one stretch of bytes. One call for
    what took eight numpy calls a micro-batch (twin: ``tests/test_pointcodec.py``)."""
    groups = starts.shape[0] - 1
    lengths = np.empty(groups, np.int64)
    total = 0
    for g in range(groups):
        first = max(starts[g], starts[g + 1] - rows)
        if first >= starts[g + 1]:
            lengths[g] = -1
        else:
            lengths[g] = points[starts[g + 1] - 1, 1] - points[first, 0]
            total += lengths[g]
    data = np.empty(total, np.uint8)
    pos = 0
    for g in range(groups):
        if lengths[g] > 0:
            start = points[max(starts[g], starts[g + 1] - rows), 0]
            data[pos : pos + lengths[g]] = buf[start : start + lengths[g]]
            pos += lengths[g]
    return data, lengths


@njit(cache=True, nogil=True)
def _compact_size(time: Any, strings: Any, entry_field: Any, entry_key: Any, entry_value: Any, entry_number: Any, keep: Any, first_entry: Any, point: int) -> int:
    """The body size of ``point`` as ``_compact`` writes it."""
    size = 1 + _varint_size(time[point])
    for k in range(3):
        length = strings[point, 2 * k + 1] - strings[point, 2 * k]
        if length > 0:
            size += 1 + _varint_size(length) + length
    for entry in range(first_entry[point], first_entry[point + 1]):
        if keep[entry]:
            body = _compact_entry_body(entry_field, entry_key, entry_value, entry_number, entry)
            size += 1 + _varint_size(body) + body
    return size


@njit(cache=True, nogil=True)
def _compact_entry_body(entry_field: Any, entry_key: Any, entry_value: Any, entry_number: Any, entry: int) -> int:
    key_size = entry_key[entry, 1] - entry_key[entry, 0]
    body = 1 + _varint_size(key_size) + key_size
    field = entry_field[entry]
    if field == _DOUBLES or field == _INTS or field == _BOOLS:
        return body + _number_size(field, entry_number[entry])
    value_size = entry_value[entry, 1] - entry_value[entry, 0]
    return body + 1 + _varint_size(value_size) + value_size


@njit(cache=True, nogil=True)
def _put_bytes(out: Any, pos: int, buf: Any, start: int, end: int) -> int:
    """A length-delimited value: its length, then ``buf[start:end]``."""
    pos = _put_varint(out, pos, end - start)
    out[pos : pos + end - start] = buf[start:end]
    return pos + end - start


@njit(cache=True, nogil=True)
def _compact(
    buf: Any, time: Any, strings: Any, entry_field: Any, entry_key: Any, entry_value: Any, entry_number: Any, keep: Any, first_entry: Any, rows: Any, group_ends: Any
) -> tuple[Any, Any]:
    """``DecodedPoints.compacted``: each point of ``rows`` re-encoded with its time, name,
    database, retention policy and ``keep``'s map entries, length-prefixed; and each group's
    bytes (-1 for a group of no rows)."""
    sizes = np.empty(rows.shape[0], np.int64)
    total = 0
    for i in range(rows.shape[0]):
        sizes[i] = _compact_size(time, strings, entry_field, entry_key, entry_value, entry_number, keep, first_entry, rows[i])
        total += _varint_size(sizes[i]) + sizes[i]
    out = np.empty(total, np.uint8)
    lengths = np.empty(group_ends.shape[0], np.int64)
    pos = 0
    row = 0
    for group in range(group_ends.shape[0]):
        group_start = pos
        lengths[group] = -1 if row == group_ends[group] else 0
        while row < group_ends[group]:
            point = rows[row]
            pos = _put_varint(out, pos, sizes[row])
            out[pos] = 0x08  # time
            pos = _put_varint(out, pos + 1, time[point])
            for k in range(3):  # name, database, retention policy: fields 2-4
                if strings[point, 2 * k + 1] > strings[point, 2 * k]:
                    out[pos] = ((k + 2) << 3) | 2
                    pos = _put_bytes(out, pos + 1, buf, strings[point, 2 * k], strings[point, 2 * k + 1])
            for entry in range(first_entry[point], first_entry[point + 1]):
                if not keep[entry]:
                    continue
                field = entry_field[entry]
                out[pos] = (field << 3) | 2
                pos = _put_varint(out, pos + 1, _compact_entry_body(entry_field, entry_key, entry_value, entry_number, entry))
                out[pos] = 0x0A  # the key
                pos = _put_bytes(out, pos + 1, buf, entry_key[entry, 0], entry_key[entry, 1])
                if field == _DOUBLES or field == _INTS or field == _BOOLS:
                    pos = _put_number(out, pos, field, entry_number[entry])
                else:
                    out[pos] = 0x12
                    pos = _put_bytes(out, pos + 1, buf, entry_value[entry, 0], entry_value[entry, 1])
            row += 1
        if lengths[group] == 0:
            lengths[group] = pos - group_start
    return out, lengths


def count_points(data: bytes) -> int:
    """How many length-prefixed points ``data`` holds; ProtocolError if one does not parse."""
    points, _, _, bad = _count(np.frombuffer(data, dtype=np.uint8))
    if bad >= 0:
        raise ProtocolError(f"point {bad + 1} is not a valid Point")
    return int(points)


def decode_points(data: bytes) -> pa.Table:
    """The Arrow table of length-prefixed points; the same as ``table.decode_points``."""
    return decode_with_headers(data)[0].table


def decode_with_headers(data: bytes) -> tuple[DecodedPoints, Headers]:
    """The points, and where each lies in ``data``."""
    buf = np.frombuffer(data, dtype=np.uint8)
    columns = _Columns(data, buf)
    headers = Headers(data, buf, columns.span, columns.header, columns.by_name, columns.named)
    if not columns.same_keys:
        return DecodedPoints(cols.decode_points(data)), headers  # two keys share a 64-bit hash: the reference sorts them out
    return DecodedPoints(columns=columns), headers


class DecodedPoints:
    """Decoded points: a column's values as numpy arrays (``values``), and the Arrow table
    (``table``, the reference's), built only when first asked for. A vectorized UDF's
    frame needs no table, and on a small micro-batch building it cost more than the UDF."""

    def __init__(self, table: pa.Table | None = None, columns: _Columns | None = None):
        assert (table is None) != (columns is None)
        self._table = table
        self._columns = columns

    @property
    def num_rows(self) -> int:
        return self._columns.count if self._columns is not None else self.table.num_rows

    @property
    def names(self) -> list[str]:
        """The table's column names, in its order."""
        return self._columns.names() if self._columns is not None else self.table.column_names

    @property
    def times(self) -> np.ndarray:
        if self._columns is not None:
            return self._columns.time
        times: np.ndarray = self.table.column(cols.TIME).to_numpy(zero_copy_only=False)
        return times

    def compacted(self, rows: np.ndarray, group_ends: np.ndarray, columns: frozenset[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """The points at ``rows`` with only their time, name, database, retention policy and
        the tags and fields among ``columns`` (decoded column names), re-encoded and
        length-prefixed, group after group (group ``g`` is ``rows[group_ends[g - 1]:group_ends[g]]``);
        and each group's bytes (-1 for a group of no rows). None when these points were
        decoded by the reference (``decode_points``): their map entries are not at hand."""
        found = self._columns
        if found is None:
            return None
        keep, first_entry = found.kept_entries(columns)
        return _compact(
            found.buf, found.time, found.strings, found.entry_field, found.entry_key, found.entry_value, found.entry_number,
            keep, first_entry, np.ascontiguousarray(rows, np.int64), np.ascontiguousarray(group_ends, np.int64),
        )

    @property
    def table(self) -> pa.Table:
        if self._table is None:
            assert self._columns is not None
            self._table = self._columns.table()
        return self._table

    def values(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """Column ``name`` (any but the dimensions): its values, strings as Python objects
        (None where absent), numbers as int64, float64 or bool (anything where absent); and
        which rows have one, or None if all do."""
        if self._columns is not None:
            return self._columns.values(name)
        column = self.table.column(name)
        valid = None if column.null_count == 0 else np.asarray(column.is_valid())
        if pa.types.is_string(column.type):
            return column.to_numpy(zero_copy_only=False), valid
        if valid is not None:
            column = column.fill_null(pa.scalar(False if pa.types.is_boolean(column.type) else 0, column.type))
        # Arrow's own memory is read-only; the UDF may write into its frame.
        return np.array(column.to_numpy(zero_copy_only=False)), valid


# Result columns that encode_rows writes, by pandas dtype kind, and their map field.
_ENCODED = {"f": _DOUBLES, "i": _INTS, "u": _INTS, "b": _BOOLS}


@njit(cache=True, nogil=True)
def _varint_size(value: Any) -> int:
    value = np.uint64(value)
    size = 1
    while value >= 0x80:
        value >>= np.uint64(7)
        size += 1
    return size


@njit(cache=True, nogil=True)
def _put_varint(out: Any, pos: int, value: Any) -> int:
    value = np.uint64(value)
    while value >= 0x80:
        out[pos] = np.uint8((value & np.uint64(0x7F)) | np.uint64(0x80))
        value >>= np.uint64(7)
        pos += 1
    out[pos] = np.uint8(value)
    return pos + 1


@njit(cache=True, nogil=True)
def _entry_size(field: int, key_size: int, number: Any) -> int:
    """A map entry with its field key and length: key 1 (the name), value 2."""
    body = 1 + _varint_size(key_size) + key_size + _number_size(field, number)
    return 1 + _varint_size(body) + body


@njit(cache=True, nogil=True)
def _number_size(field: int, number: Any) -> int:
    """A numeric map entry's value (2) with its key: a double's 8 bytes, else a varint."""
    return 9 if field == _DOUBLES else 1 + _varint_size(number)


@njit(cache=True, nogil=True)
def _put_number(out: Any, pos: int, field: int, number: Any) -> int:
    """``_number_size``'s bytes: a double's 64 bits little-endian, an int's or bool's varint."""
    if field == _DOUBLES:
        out[pos] = 0x11
        bits = np.uint64(number)
        for b in range(8):
            out[pos + 1 + b] = np.uint8((bits >> np.uint64(8 * b)) & np.uint64(0xFF))
        return pos + 9
    out[pos] = 0x10
    return _put_varint(out, pos + 1, number)


@njit(cache=True, nogil=True)
def _encode(
    buf: Any, spans: Any, by_name: Any, named: Any, rows: Any, fields: Any, keys: Any, key_offsets: Any, numbers: Any
) -> tuple[Any, Any, bool]:
    """Response frames: per row, the point's header bytes, its new fields, byName; where each
    ends; and False (nothing encoded) if a row's point has no name or its leading fields are
    not one stretch (``Headers.spans`` end -1)."""
    count = rows.shape[0]
    sizes = np.empty(count, np.int64)
    total = 0
    for i in range(count):
        row = rows[i]
        if spans[row, 1] < 0 or not named[row]:
            return np.empty(0, np.uint8), sizes, False
        size = spans[row, 1] - spans[row, 0]
        for c in range(fields.shape[0]):
            size += _entry_size(fields[c], key_offsets[c + 1] - key_offsets[c], numbers[i, c])
        if by_name[row]:
            size += 2
        sizes[i] = size
        body = 2 + _varint_size(size) + size
        total += _varint_size(body) + body
    out = np.empty(total, np.uint8)
    ends = np.empty(count, np.int64)
    pos = 0
    for i in range(count):
        row = rows[i]
        size = sizes[i]
        pos = _put_varint(out, pos, 2 + _varint_size(size) + size)
        out[pos] = 0x8A
        out[pos + 1] = 0x01
        pos = _put_varint(out, pos + 2, size)
        start, end = spans[row, 0], spans[row, 1]
        out[pos : pos + end - start] = buf[start:end]
        pos += end - start
        # Kapacitor's field order: doubles (8), ints (9), byName (11), bools (12).
        for stage in range(3):
            if stage == 2 and by_name[row]:
                out[pos] = 0x58
                out[pos + 1] = 0x01
                pos += 2
            for c in range(fields.shape[0]):
                field = fields[c]
                if (stage == 0) != (field == 8) or (stage == 1) != (field == 9) or (stage == 2) != (field == 12):
                    continue
                key_size = key_offsets[c + 1] - key_offsets[c]
                number = numbers[i, c]
                body = 1 + _varint_size(key_size) + key_size + _number_size(field, number)
                out[pos] = (field << 3) | 2
                pos = _put_varint(out, pos + 1, body)
                out[pos] = 0x0A
                pos = _put_varint(out, pos + 1, key_size)
                out[pos : pos + key_size] = keys[key_offsets[c] : key_offsets[c + 1]]
                pos = _put_number(out, pos + key_size, field, number)
        ends[i] = pos
    return out, ends, True


def encode_rows(headers: Headers, rows: np.ndarray, fields: list[tuple[str, np.ndarray]]) -> tuple[bytes, np.ndarray] | None:
    """Stream Response frames: for each entry of ``rows`` (a decoded point), that point
    with ``fields`` (name, one value per row) as its fields.

    Each output point is its input point's leading fields (time to tags) byte for
    byte, then the new fields: the point the reference path builds. NaN and ±Inf are
    written as values, as there. None when a column's type or a point's layout is not one
    this writes (a nullable or string column, a nameless point): the caller then
    builds the points one by one. With the frames comes where each one ends.
    """
    plan = _fields_plan(tuple((name, array.dtype.kind) for name, array in fields))
    if plan is None:
        return None
    kinds, keys, key_offsets = plan
    numbers = [array.astype(np.float64, copy=False).view(np.int64) if kind == _DOUBLES else array.astype(np.int64, copy=False) for (_, array), kind in zip(fields, kinds.tolist())]
    if len(numbers) == 1:
        table = numbers[0].reshape(-1, 1)
    else:
        table = np.column_stack(numbers) if numbers else np.zeros((len(rows), 0), np.int64)
    out, ends, encoded = _encode(headers.buf, headers.spans, headers.by_name, headers.named, np.ascontiguousarray(rows, np.int64), kinds, keys, key_offsets, table)
    return (out.tobytes(), ends) if encoded else None


@lru_cache(maxsize=256)
def _fields_plan(fields: tuple[tuple[str, str], ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For result columns (name, dtype kind): each one's map field, the names' bytes one after
    another and where each begins; None if a kind is not one ``encode_rows`` writes. One per
    set of columns (a UDF returns the same few): the arrays took a fifth of a small encode."""
    kinds = [_ENCODED.get(kind) for _, kind in fields]
    if None in kinds:
        return None
    keys = [name.encode() for name, _ in fields]
    key_offsets = np.zeros(len(keys) + 1, np.int64)
    np.cumsum([len(k) for k in keys], out=key_offsets[1:])
    return np.array(kinds, np.int64), np.frombuffer(b"".join(keys), np.uint8).copy(), key_offsets


class _Columns:
    """The decoded arrays of one buffer of points, and the table built from them."""

    def __init__(self, raw: bytes, buf: np.ndarray):
        self.raw = raw
        self.buf = buf
        (
            bad, bad_text, found, self.time, self.strings, self.by_name, self.header, self.span, self.named, self.dim_point, self.dim_span,
            self.entry_point, self.entry_field, self.entry_key, self.entry_value, self.entry_number, entry_hash, first, order, bounds, self.same_keys,
        ) = _decode_all(buf, _FEW_COLUMNS)
        if bad >= 0:
            raise ProtocolError(f"point {bad + 1} of this micro-batch's group is not a valid Point")
        if bad_text >= 0:
            raise ProtocolError(f"point {bad_text + 1} of this micro-batch's group has a string, tag or field name that is not valid UTF-8")
        self.count = len(self.time)
        if found < 0:  # many distinct keys: sort them instead
            _, first, column_of_entry = np.unique(entry_hash, return_index=True, return_inverse=True)
            order, bounds = _entries_by_column(column_of_entry, len(first))
            self.same_keys = _same_keys(buf, self.entry_key, first[column_of_entry])
        # Each tag and field column by name, sorted (map order differs between processes,
        # the table must not): its map field and its entries, in point order.
        fields, keys, bounds = self.entry_field[first].tolist(), self.entry_key[first].tolist(), bounds.tolist()
        sparse = {_PREFIX[field] + raw[start:end].decode(): (field, order[bounds[column] : bounds[column + 1]]) for column, (field, (start, end)) in enumerate(zip(fields, keys))}
        self.sparse = dict(sorted(sparse.items()))
        self._kept: tuple[frozenset[str], np.ndarray, np.ndarray] | None = None

    def names(self) -> list[str]:
        return [*_FIXED_COLUMNS, *self.sparse]

    def kept_entries(self, columns: frozenset[str]) -> tuple[np.ndarray, np.ndarray]:
        """Which map entries belong to ``columns``, and where each point's entries begin (then
        the end). Worked out once per set of columns: a time window's histories are compacted
        group by group, and each call over the whole slice made that quadratic."""
        if self._kept is None or self._kept[0] != columns:
            keep = np.zeros(len(self.entry_point), np.bool_)
            for name in columns:
                column = self.sparse.get(name)
                if column is not None:
                    keep[column[1]] = True
            self._kept = (columns, keep, np.searchsorted(self.entry_point, np.arange(self.count + 1)))
        return self._kept[1], self._kept[2]

    def table(self) -> pa.Table:
        buf, n = self.buf, self.count
        dim_offsets = np.zeros(n + 1, np.int32)
        np.cumsum(np.bincount(self.dim_point, minlength=n), out=dim_offsets[1:])
        arrays: dict[str, Any] = {
            cols.TIME: pa.array(self.time, pa.int64()),
            cols.NAME: _strings(buf, self.strings[:, 0:2]),
            cols.DATABASE: _strings(buf, self.strings[:, 2:4]),
            cols.RETENTION_POLICY: _strings(buf, self.strings[:, 4:6]),
            cols.DIMENSIONS: pa.ListArray.from_arrays(pa.array(dim_offsets), _strings(buf, self.dim_span)),
            cols.BY_NAME: pa.array(self.by_name, pa.bool_()),
        }
        for name, (field, entries) in self.sparse.items():
            arrays[name] = self._column(field, entries)
        return pa.table(arrays)

    def values(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``DecodedPoints.values`` from the decoded arrays."""
        fixed = _FIXED_STRINGS.get(name)
        if fixed is not None:
            return self._objects(self.strings[:, fixed : fixed + 2], None), None
        if name == cols.TIME:
            return self.time, None
        if name == cols.BY_NAME:
            return self.by_name, None
        field, entries = self.sparse[name]
        scattered, valid = self._scatter(field, entries)
        if field in (_TAGS, _STRINGS):
            return self._objects(scattered, valid), valid
        return _typed(field, scattered), valid

    def _objects(self, spans: np.ndarray, valid: np.ndarray | None) -> np.ndarray:
        """The strings at ``spans`` as Python objects, None where not ``valid`` (made by
        Arrow: a Python loop costs more from a few hundred strings on)."""
        strings: np.ndarray = _strings(self.buf, spans, valid).to_numpy(zero_copy_only=False)
        return strings

    def _column(self, field: int, entries: np.ndarray) -> pa.Array:
        scattered, valid = self._scatter(field, entries)
        if field in (_TAGS, _STRINGS):
            return _strings(self.buf, scattered, valid)
        return pa.array(_typed(field, scattered), mask=None if valid is None else ~valid)

    def _scatter(self, field: int, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """A tag or field column, one row per point: its value spans (strings) or 64 bits
        (numbers), and which points have one (None if all do)."""
        if field in (_TAGS, _STRINGS):
            scattered, valid, complete = _scatter_spans(self.entry_point, self.entry_value, entries, self.count)
        else:
            scattered, valid, complete = _scatter_numbers(self.entry_point, self.entry_number, entries, self.count)
        return scattered, None if complete else valid


def _typed(field: int, numbers: np.ndarray) -> np.ndarray:
    """A numeric map field's 64 bits per point as its type: float64, int64 or bool."""
    if field == _DOUBLES:
        return numbers.view(np.float64)
    if field == _INTS:
        return numbers
    return numbers != 0


# The columns every table has, and where each string one's span lies in ``_Columns.strings``.
_FIXED_COLUMNS = (cols.TIME, cols.NAME, cols.DATABASE, cols.RETENTION_POLICY, cols.DIMENSIONS, cols.BY_NAME)
_FIXED_STRINGS = {cols.NAME: 0, cols.DATABASE: 2, cols.RETENTION_POLICY: 4}


def warm_up() -> None:
    """Compiles (or loads from numba's cache) the decoder, off the path of the first micro-batch."""
    from udf_agent import udf_pb2
    from udf_agent.wire.frames import encode_varint

    point = udf_pb2.Point(time=1, name="m", dimensions=["d"], tags={"d": "x"}, fieldsDouble={"f": 1.0}).SerializeToString()
    points, headers = decode_with_headers(encode_varint(len(point)) + point)
    points.values(cols.TAG + "d")
    import pandas as pd

    sample = pd.DataFrame({"f": [1.0], "n": [1], "b": [True]})
    encode_rows(headers, np.zeros(1, np.int64), [(name, sample[name].to_numpy()) for name in sample.columns])
    headers.last_points(np.array([0, 1], np.int64), 1)
    points.compacted(np.zeros(1, np.int64), np.ones(1, np.int64), frozenset({cols.FIELD_DOUBLE + "f"}))
