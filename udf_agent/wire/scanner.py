"""Frame scanning over the raw input bytes, compiled with numba.

``FrameSplitter`` in ``frames`` is the reference: plain Python, about 1 M frames/s
here. The reader's hot path needs far more (points are nearly all of the traffic,
and Python must stay free for everything else), so this module walks the same
bytes in compiled code: each frame's length and body span, whether it holds a
point and nothing else, and that point's group span, checking every field of the
point on the way (a malformed point is caught here, before anything is forwarded).
Compiled once per machine into numba's cache; ``warm_up`` loads it off the Info path.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
from numba import njit

from udf_agent.wire.frames import BEGIN_KEY, END_KEY, POINT_KEY, FrameSplitter, Piece, PointRun, ProtocolError, RequestRun
from udf_agent.wire.grouped import GroupedPoints, group_points_by_key
from udf_agent.wire.kernels import first_invalid_utf8, gather, skip_field, varint

# Frame kinds.
OTHER = 0  # any other Request: parsed by protobuf
POINT = 1  # a Request holding only a well-formed point
BAD_POINT = 2  # a Request holding only a point whose fields do not parse

# Scan outcomes.
OK = 0
TOO_LONG = 1  # a frame length above the limit
BAD_VARINT = 2  # a frame length varint longer than ten bytes

_POINT_KEY_0, _POINT_KEY_1 = POINT_KEY  # Request.point: field 17, wire type 2
_GROUP_FIELD = 5  # map fields (tags 7, fieldsDouble/Int/String 8-10, fieldsBool 12) are walked too


@njit(cache=True, nogil=True)
def _entry_ok(buf: Any, pos: int, end: int) -> bool:
    """Whether a map entry (a tag or a field: key 1, value 2) is made of whole fields."""
    while pos < end:
        key, pos = varint(buf, pos, end)
        if pos < 0:
            return False
        pos, _, _ = skip_field(buf, key, pos, end)
        if pos < 0:
            return False
    return pos == end


@njit(cache=True, nogil=True)
def _point_group(buf: Any, pos: int, end: int) -> tuple[bool, int, int]:
    """Walks a serialised Point, map entries included: (well-formed, group start, group end).

    The group is (-1, -1) when absent.
    """
    group_start, group_end = -1, -1
    while pos < end:
        key, pos = varint(buf, pos, end)
        if pos < 0:
            return False, -1, -1
        pos, value_start, value_end = skip_field(buf, key, pos, end)
        if pos < 0:
            return False, -1, -1
        field = key >> 3
        if value_start >= 0:
            if field == _GROUP_FIELD:
                group_start, group_end = value_start, value_end
            elif 7 <= field <= 10 or field == 12:
                if not _entry_ok(buf, value_start, value_end):
                    return False, -1, -1
    return pos == end, group_start, group_end


@njit(cache=True, nogil=True)
def _scan(
    buf: Any,
    limit: int,
    body_start: Any,
    body_end: Any,
    kind: Any,
    group_start: Any,
    group_end: Any,
) -> tuple[int, int, int]:
    """Fills the arrays for the whole frames at the start of ``buf``.

    Returns (frames found, bytes consumed, outcome); stops early when the arrays are full.
    """
    size = buf.shape[0]
    capacity = body_start.shape[0]
    pos = 0
    count = 0
    while pos < size and count < capacity:
        length = 0
        shift = 0
        cursor = pos
        complete = False
        while cursor < size and cursor - pos < 10:
            byte = buf[cursor]
            cursor += 1
            length |= (byte & 0x7F) << shift
            if length < 0 or length > limit:  # negative: bits past 2**63, far over any limit
                return count, pos, TOO_LONG
            if byte < 0x80:
                complete = True
                break
            shift += 7
        if not complete:
            if cursor - pos >= 10:
                return count, pos, BAD_VARINT
            break  # the length itself is still arriving
        end = cursor + length
        if end > size:
            break
        frame_kind = OTHER
        first, second = -1, -1
        if length >= 3 and buf[cursor] == _POINT_KEY_0 and buf[cursor + 1] == _POINT_KEY_1:
            inner, point_start = varint(buf, cursor + 2, end)
            if point_start >= 0 and inner >= 0 and point_start + inner == end:
                well_formed, first, second = _point_group(buf, point_start, end)
                frame_kind = POINT if well_formed else BAD_POINT
        body_start[count] = cursor
        body_end[count] = end
        kind[count] = frame_kind
        group_start[count] = first
        group_end[count] = second
        count += 1
        pos = end
    return count, pos, OK


# Request.begin and end, like point: keys of two bytes, the second 0x01.
_BEGIN_KEY_0 = BEGIN_KEY[0]
_END_KEY_0 = END_KEY[0]


@njit(cache=True, nogil=True)
def _handler_run(buf: Any, pos: int, limit: int) -> tuple[int, int]:
    """From ``pos``, the leading run of whole frames that a Handler script's handler takes as
    they came (a Request whose first field is begin, point or end): (where the run ends,
    frames in it). It stops at any other frame, one not whole yet, or a length over ``limit``
    or malformed, for ``FrameSplitter`` to deal with."""
    size = buf.shape[0]
    count = 0
    while pos < size:
        length, cursor = varint(buf, pos, size)
        if cursor < 0 or length < 2 or length > limit or cursor + length > size:
            return pos, count
        first = buf[cursor]
        if buf[cursor + 1] != 0x01 or (first != _BEGIN_KEY_0 and first != _POINT_KEY_0 and first != _END_KEY_0):
            return pos, count
        pos = cursor + length
        count += 1
    return pos, count


@njit(cache=True, nogil=True)
def _group_hashes(buf: Any, groups: Any) -> Any:
    """FNV-1a of each point's group bytes ((-1, -1): no group, hashed as empty)."""
    hashes = np.empty(groups.shape[0], np.uint64)
    for i in range(groups.shape[0]):
        digest = np.uint64(14695981039346656037)
        for b in range(max(groups[i, 0], 0), max(groups[i, 1], 0)):
            digest = (digest ^ np.uint64(buf[b])) * np.uint64(1099511628211)
        hashes[i] = digest
    return hashes


@njit(cache=True, nogil=True)
def _same_groups(buf: Any, groups: Any, representative: Any) -> bool:
    """Whether each point's group bytes equal those of its representative point."""
    for i in range(groups.shape[0]):
        start, end = max(groups[i, 0], 0), max(groups[i, 1], 0)
        other = representative[i]
        other_start, other_end = max(groups[other, 0], 0), max(groups[other, 1], 0)
        if end - start != other_end - other_start:
            return False
        for b in range(end - start):
            if buf[start + b] != buf[other_start + b]:
                return False
    return True


def first_invalid_group(frames: bytes, groups: np.ndarray) -> int:
    """The index of the first point whose group is not valid UTF-8, or -1."""
    return int(first_invalid_utf8(np.frombuffer(frames, dtype=np.uint8), groups))


def group_points(frames: bytes, points: np.ndarray, groups: np.ndarray) -> GroupedPoints:
    """Points (``points`` and ``groups``: offsets into ``frames``) by group, groups in order
    of first arrival, each group's points in arrival order. Compiled but for one step per group."""
    buf = np.frombuffer(frames, dtype=np.uint8)
    hashes = _group_hashes(buf, groups)
    _, first, column = np.unique(hashes, return_index=True, return_inverse=True)
    if not _same_groups(buf, groups, first[column]):
        return group_points_by_key(frames, points, groups)  # two groups share a 64-bit hash
    # Groups numbered by first arrival, then the points sorted by group, stably.
    arrival = np.argsort(first, kind="stable")
    rank = np.empty_like(arrival)
    rank[arrival] = np.arange(len(arrival))
    order = np.argsort(rank[column], kind="stable")
    data, offsets = gather(buf, points[order])
    counts = np.bincount(column, minlength=len(first))[arrival]
    bounds = offsets[np.concatenate(([0], np.cumsum(counts)))]
    keys = [frames[start:end] if start >= 0 else b"" for start, end in groups[first[arrival]].tolist()]
    return GroupedPoints(keys, data, bounds, counts, order)


@njit(cache=True, nogil=True)
def _count_frames(buf: Any, uncounted_key: int) -> int:
    size = buf.shape[0]
    pos = 0
    count = 0
    while pos < size:
        length, pos = varint(buf, pos, size)
        if pos < 0:
            break
        if length == 0 or buf[pos] != uncounted_key:
            count += 1
        pos += length
    return count


def count_frames(data: bytes, uncounted_key: int) -> int:
    """``frames.count_frames``, compiled."""
    return int(_count_frames(np.frombuffer(data, np.uint8), uncounted_key))


@njit(cache=True, nogil=True)
def _arrival_order(buf: Any, arrival: Any) -> tuple[Any, Any, bool]:
    """``arrival_order`` in one pass to measure the frames and one to place them: ten numpy
    calls on arrays of a point or two cost the compute thread 27 µs a micro-batch, this 2."""
    size = buf.shape[0]
    count = arrival.shape[0]
    ends = np.zeros(count, np.int64)
    pos = 0
    frames = 0
    while pos < size and frames < count:
        length, body = varint(buf, pos, size)
        if body < 0 or length > size - body:
            break
        place = arrival[frames]
        if place < 0 or place >= count:  # not a place among the points: no write out of bounds
            break
        ends[place] = body + length - pos
        pos = body + length
        frames += 1
    out = np.empty(size, np.uint8)
    if pos != size or frames != count:
        return out, ends, False
    for place in range(1, count):
        ends[place] += ends[place - 1]
    pos = 0
    for frame in range(count):
        length, body = varint(buf, pos, size)
        end = body + length
        stop = ends[arrival[frame]]
        out[stop - (end - pos) : stop] = buf[pos:end]
        pos = end
    return out, ends, True


def arrival_order(output: bytes, arrival: np.ndarray) -> tuple[bytes, np.ndarray] | None:
    """``WireKernels.arrival_order``, compiled."""
    data, ends, whole = _arrival_order(np.frombuffer(output, np.uint8), np.ascontiguousarray(arrival, np.int64))
    return (data.tobytes(), ends) if whole else None


def warm_up() -> None:
    """Compiles (or loads from numba's cache) the scanner, so the first data read does not wait."""
    _scan_runs(np.frombuffer(bytearray(b"\x02\x0a\x00"), np.uint8), 1024, 4, RUN_BYTES)  # a bytearray, as the reader's buffer is: one compiled signature
    _handler_run(np.frombuffer(bytearray(b"\x00"), np.uint8), 0, 1024)
    spans = np.array([[0, 1]], np.int64)
    first_invalid_group(b"g", spans)
    group_points(b"g", spans, spans)
    arrival_order(b"\x00", np.zeros(1, np.int64))
    count_frames(b"\x00", 0)


class FastFrameSplitter(FrameSplitter):
    """``FrameSplitter``'s contract, scanned in compiled code.

    Point-only frames always come out as ``PointRun`` pieces that carry their
    point and group offsets; a point that does not parse comes out as a body,
    for the reference path to report.
    """

    def feed(self, data: bytes | memoryview) -> list[Piece]:  # type: ignore[override]  # pieces, not only bodies
        if data:
            self._buffer += data
        pieces: list[Piece] = []
        while self._buffer:
            buffer = self._buffer
            capacity = len(buffer) // 16 + 16
            count, consumed, outcome, body_start, body_end, kind, edges, points, groups = scan(buffer, self.max_frame_size, capacity)
            if count:
                _append_pieces(buffer, body_start, body_end, kind, edges, points, groups, pieces)
            del buffer[:consumed]
            if outcome != OK:
                number = self.frames + count + 1
                self.frames += count
                reason = "declares a length above the" if outcome == TOO_LONG else "starts with a malformed varint length"
                detail = f" {self.max_frame_size}-byte limit" if outcome == TOO_LONG else ""
                raise ProtocolError(f"frame {number} {reason}{detail}", pieces)
            self.frames += count
            if count < capacity:
                break
        return pieces


# The most bytes one PointRun holds: passthrough output is written run by run, and a
# keepalive reply can only go out between two writes.
RUN_BYTES = 128 * 1024


def _append_pieces(buffer: bytearray, body_start: Any, body_end: Any, kind: Any, edges: Any, points: Any, groups: Any, pieces: list[Piece]) -> None:
    """The scanned frames' pieces (``_scan_runs``): a run of points as one ``PointRun``, any other frame as its body."""
    bounds = edges.tolist()
    for first, stop in zip(bounds[:-1], bounds[1:]):
        if kind[first] == POINT:
            offset = int(body_end[first - 1]) if first else 0
            frames = bytes(buffer[offset : int(body_end[stop - 1])])
            pieces.append(PointRun(frames, stop - first, points[first:stop], groups[first:stop]))
        else:
            for start, end in zip(body_start[first:stop].tolist(), body_end[first:stop].tolist()):
                pieces.append(bytes(buffer[start:end]))


@njit(cache=True, nogil=True)
def _runs(body_start: Any, body_end: Any, kind: Any, group_start: Any, group_end: Any, run_bytes: int) -> tuple[Any, Any, Any]:
    """Scanned frames as runs of like frames (point runs cut further every ``run_bytes``):
    where each run starts and the last ends (frame numbers), and for every point its span with
    its length varint and its group's (-1 where absent), as offsets from its run's first byte.
    One call for what took a dozen numpy calls a read (twin: ``tests/test_scanner.py``)."""
    count = body_start.shape[0]
    edges = np.empty(count + 1, np.int64)
    points = np.empty((count, 2), np.int64)
    groups = np.empty((count, 2), np.int64)
    runs = 0
    edges[0] = 0
    offset = 0  # where the current run's first frame starts
    for i in range(count):
        start = body_end[i - 1] if i else 0
        if i:
            before = body_end[i - 2] if i > 1 else 0
            if (kind[i] == POINT) != (kind[i - 1] == POINT) or start // run_bytes != before // run_bytes:
                runs += 1
                edges[runs] = i
                offset = start
        # The point itself with its length varint: the body less Request.point's key.
        points[i, 0] = body_start[i] + 2 - offset
        points[i, 1] = body_end[i] - offset
        groups[i, 0] = group_start[i] - offset if group_start[i] >= 0 else -1
        groups[i, 1] = group_end[i] - offset if group_end[i] >= 0 else -1
    edges[runs + 1] = count
    return edges[: runs + 2], points, groups


@njit(cache=True, nogil=True)
def _scan_runs(buf: Any, limit: int, capacity: int, run_bytes: int) -> tuple[Any, ...]:
    """``_scan`` (up to ``capacity`` whole frames at the start of ``buf``) then ``_runs``, in one
    call: (frames found, bytes consumed, outcome, each frame's body start and end and kind,
    then ``_runs``' edges, points and groups, none if ``run_bytes`` is 0). A read at a trickle
    made eight numpy calls and two compiled ones for them."""
    body_start = np.empty(capacity, np.int64)
    body_end = np.empty(capacity, np.int64)
    kind = np.empty(capacity, np.int8)
    group_start = np.empty(capacity, np.int64)
    group_end = np.empty(capacity, np.int64)
    count, consumed, outcome = _scan(buf, limit, body_start, body_end, kind, group_start, group_end)
    if run_bytes > 0:
        edges, points, groups = _runs(body_start[:count], body_end[:count], kind[:count], group_start[:count], group_end[:count], run_bytes)
    else:
        edges, points, groups = np.zeros(1, np.int64), np.empty((0, 2), np.int64), np.empty((0, 2), np.int64)
    return count, consumed, outcome, body_start[:count], body_end[:count], kind[:count], edges, points, groups


class Scanned(NamedTuple):
    """The whole frames at the start of a buffer (``scan``), and their runs (``_runs``)."""

    found: int
    consumed: int
    outcome: int
    body_start: np.ndarray
    body_end: np.ndarray
    kind: np.ndarray
    edges: np.ndarray
    points: np.ndarray
    groups: np.ndarray


def scan(buffer: Any, limit: int, capacity: int, run_bytes: int = RUN_BYTES) -> Scanned:
    """Up to ``capacity`` whole frames at the start of ``buffer`` (bytes-like), none longer than
    ``limit``; their runs unless ``run_bytes`` is 0."""
    return Scanned(*_scan_runs(np.frombuffer(buffer, np.uint8), limit, capacity, run_bytes))


class RequestRunSplitter(FrameSplitter):
    """``FrameSplitter``'s contract for a Kapacitor Handler script's session: each run of
    frames its handler takes as they came (points, BeginBatch, EndBatch) is found in compiled
    code and comes out as one ``RequestRun``, never cut into bodies; any other frame comes
    out as its body, as from ``FrameSplitter`` (its twin, which also reports broken framing)."""

    def feed(self, data: bytes | memoryview) -> list[Piece]:  # type: ignore[override]  # pieces, not only bodies
        if data:
            self._buffer += data
        buffer = self._buffer
        size = len(buffer)
        pieces: list[Piece] = []
        pos = 0
        view = np.frombuffer(buffer, np.uint8)
        try:
            while pos < size:
                end, count = _handler_run(view, pos, self.max_frame_size)
                if count:
                    pieces.append(RequestRun(bytes(buffer[pos:end]), count))
                    self.frames += count
                    pos = end
                    if pos == size:
                        break
                frame = self._frame_at(buffer, pos, size)
                if frame is None:
                    break
                pieces.append(bytes(buffer[frame[0] : frame[1]]))
                self.frames += 1
                pos = frame[1]
        except ProtocolError as exc:
            exc.decoded = pieces
            raise
        finally:
            del view  # a bytearray whose buffer is exported cannot shrink
            if pos:
                del buffer[:pos]
        return pieces
