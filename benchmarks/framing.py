"""Byte-level helpers shared by the benchmark driver and the in-process limits.

Everything here works on raw frames (unsigned varint length + serialised
protobuf message) without building protobuf objects, so the driver's own cost
stays small next to the agent it measures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

# Imported (numba and all) with this module, never on the clock.
from udf_agent.wire.frames import ERROR_KEY, INIT_KEY, KEEPALIVE_KEY, POINT_KEY, SNAPSHOT_KEY, ProtocolError, read_varint
from udf_agent.wire.scanner import OK, POINT, scan, warm_up

warm_up()


CHUNK_SIZE = 4 * 1024 * 1024


def split_frames(data: bytes | bytearray, pos: int = 0) -> tuple[list[tuple[int, int]], int]:
    """(start, end) spans of the whole frame bodies in ``data`` from ``pos``, and where the rest begins."""
    spans = []
    size = len(data)
    while pos < size:
        # One-byte lengths (< 128) are the common case: keep them off the general path.
        length = data[pos]
        start = pos + 1
        if length >= 0x80:
            try:
                length, start = read_varint(data, pos)
            except ProtocolError:  # the length runs off the end: the frame is cut
                break
        end = start + length
        if end > size:
            break
        spans.append((start, end))
        pos = end
    return spans, pos


def frames_in_file(path: str, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[bytes, list[tuple[int, int]]]]:
    """Each ``chunk_size`` read of a file of frames, as (bytes, spans of the frame bodies whole in it);
    a frame cut by a read is carried into the next."""
    rest = b""
    fd = os.open(path, os.O_RDONLY)
    try:
        while chunk := os.read(fd, chunk_size):
            data = rest + chunk if rest else chunk
            spans, pos = split_frames(data)
            yield data, spans
            rest = data[pos:]
    finally:
        os.close(fd)
    if rest:
        raise ValueError(f"{len(rest)} bytes after the last whole frame of {path}")


def count_frames_in_file(path: str, chunk_size: int = CHUNK_SIZE) -> int:
    """Frames in a file, split with a tight varint loop over ``chunk_size`` reads (the framing limit)."""
    return sum(len(spans) for _, spans in frames_in_file(path, chunk_size))


def point_time(body: bytes | bytearray | memoryview) -> int | None:
    """Point.time of a Response{point} frame body, read without protobuf (None if not a point)."""
    if body[0] != POINT_KEY[0] or body[1] != POINT_KEY[1]:
        return None
    length, pos = read_varint(body, 2)
    end = pos + length
    while pos < end:
        key, pos = read_varint(body, pos)
        wire_type = key & 7
        if key == 0x08:  # field 1 (time), varint
            value, _ = read_varint(body, pos)
            return value - (1 << 64) if value >= 1 << 63 else value
        if wire_type == 0:
            _, pos = read_varint(body, pos)
        elif wire_type == 2:
            size, pos = read_varint(body, pos)
            pos += size
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ValueError(f"unexpected wire type {wire_type} in a Point")
    return 0  # time 0 is not serialised in proto3


@dataclass
class OutputTally:
    """What an agent wrote, counted frame by frame as chunks arrive.

    ``keepalive_times`` maps each KeepaliveResponse.time to when it was read;
    ``point_times`` (only when ``track_points``) maps each output Point.time to when it was read.
    """

    track_points: bool = False
    points: int = 0
    first_point_at: float | None = None
    points_in_first_chunk: int = 0
    last_point_at: float | None = None
    init_at: float | None = None
    init_body: bytes | None = None
    errors: list[str] = field(default_factory=list)
    keepalive_times: dict[int, float] = field(default_factory=dict)
    snapshots: list[tuple[float, bytes]] = field(default_factory=list)  # (when read, SnapshotResponse.snapshot)
    point_times: dict[int, float] = field(default_factory=dict)
    other_frames: int = 0
    _buffer: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes, now: float) -> None:
        buffer = self._buffer
        buffer += chunk
        if self.track_points:
            points, pos = self._walk(buffer, now)
        else:
            points, pos = self._scan(buffer, now)
        del buffer[:pos]
        if points:
            if self.first_point_at is None:
                self.first_point_at = now
                self.points_in_first_chunk = points
            self.last_point_at = now
            self.points += points

    def _scan(self, buffer: bytearray, now: float) -> tuple[int, int]:
        """Counts whole frames with the project's compiled scanner: a Python loop per frame
        here would cap what the benchmark can measure near 1 M frames/s, on a core the
        agent needs. (The scanner is tested frame for frame against the reference splitter.)"""
        found = scan(buffer, 1 << 40, len(buffer) // 4 + 16, run_bytes=0)
        if found.outcome != OK:
            self.errors.append("malformed output framing")
        empty = found.body_end == found.body_start
        if empty.any():
            self.errors.append("empty Response frame (crashes kapacitord)")
        for index in np.flatnonzero((found.kind != POINT) & ~empty).tolist():
            self._other(bytes(buffer[found.body_start[index] : found.body_end[index]]), now)
        return int(np.count_nonzero(found.kind == POINT)), int(found.consumed)

    def _walk(self, buffer: bytearray, now: float) -> tuple[int, int]:
        """Frame by frame in Python, reading each point's time (paced runs: few frames)."""
        spans, pos = split_frames(buffer)
        points = 0
        for start, end in spans:
            if start == end:
                self.errors.append("empty Response frame (crashes kapacitord)")
            elif buffer[start] == POINT_KEY[0] and buffer[start + 1] == POINT_KEY[1]:
                points += 1
                stamp = point_time(memoryview(buffer)[start:end])
                if stamp is not None:
                    self.point_times.setdefault(stamp, now)
            else:
                self._other(bytes(buffer[start:end]), now)
        return points, pos

    @property
    def leftover(self) -> int:
        return len(self._buffer)

    def _other(self, body: bytes, now: float) -> None:
        key = body[0]
        if key == KEEPALIVE_KEY:
            _, pos = read_varint(body, 1)
            stamp = 0
            if pos < len(body) and body[pos] == 0x08:
                stamp, _ = read_varint(body, pos + 1)
            self.keepalive_times.setdefault(stamp, now)
        elif key == INIT_KEY:
            self.init_at = now
            self.init_body = body
        elif key == ERROR_KEY:
            from udf_agent import udf_pb2

            self.errors.append(udf_pb2.Response.FromString(body).error.error)
        elif key == SNAPSHOT_KEY:
            from udf_agent import udf_pb2

            self.snapshots.append((now, udf_pb2.Response.FromString(body).snapshot.snapshot))
        else:
            self.other_frames += 1
