"""Telegraf-like ``cpu`` points, framed exactly as Kapacitor frames them.

Point ``i`` belongs to group ``i % groups`` and has time ``T0 + i`` ms, so
time is strictly increasing. Every point frame has the same length (tag values
are zero-padded, the time always takes a 9-byte varint), which lets the driver
cut the stream at frame boundaries by arithmetic alone. Frames are written
once into a cache file under /tmp keyed by the parameters; generating them is
never part of a measurement.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from udf_agent.wire.frames import encode_varint, read_varint

T0_NS = 1_700_000_000_000_000_000  # any time in [2**56, 2**63) encodes in 9 varint bytes
STEP_NS = 1_000_000
MEASUREMENT = "cpu"
DATABASE = "telegraf"
RETENTION_POLICY = "autogen"
DIMENSIONS = ("cpu", "host")
FIELDS = ("usage_idle", "usage_system", "usage_user")
CACHE_DIR = os.path.join(tempfile.gettempdir(), "udf-agent-bench")
_FORMAT_VERSION = 1
_GENERATE_CHUNK = 500_000


def _key(field_number: int, wire_type: int) -> bytes:
    return encode_varint(field_number << 3 | wire_type)


def _string(field_number: int, value: str) -> bytes:
    data = value.encode()
    return _key(field_number, 2) + encode_varint(len(data)) + data


def _message(field_number: int, body: bytes) -> bytes:
    return _key(field_number, 2) + encode_varint(len(body)) + body


def group_tags(group: int) -> dict[str, str]:
    """The tags of group number ``group`` (unique per group, fixed width)."""
    return {"cpu": f"cpu{group % 8}", "host": f"host{group // 8:06d}"}


def group_id(tags: dict[str, str]) -> str:
    """Kapacitor's group id: ``k=v`` pairs joined by ``,`` in dimension order."""
    return ",".join(f"{name}={tags[name]}" for name in DIMENSIONS)


@dataclass(frozen=True)
class PointLayout:
    """One group's serialised Request{point} frame and where its varying bytes sit."""

    template: bytes
    time_offset: int  # 9 bytes of varint
    field_offsets: tuple[int, ...]  # 8 little-endian bytes per field in FIELDS


def point_layout(group: int) -> PointLayout:
    """Serialises a Point in field-number order (as Go does; map entries in sorted order)."""
    tags = group_tags(group)
    head = _key(1, 0)
    time_start = len(head)
    head += encode_varint(T0_NS)
    assert len(head) - time_start == 9
    body = bytearray(head)
    body += _string(2, MEASUREMENT) + _string(3, DATABASE) + _string(4, RETENTION_POLICY)
    body += _string(5, group_id(tags))
    for name in DIMENSIONS:
        body += _string(6, name)
    for name in sorted(tags):
        body += _message(7, _string(1, name) + _string(2, tags[name]))
    field_offsets = []
    for name in FIELDS:
        entry = _string(1, name) + _key(2, 1)
        body += _key(8, 2) + encode_varint(len(entry) + 8) + entry
        field_offsets.append(len(body))
        body += bytes(8)
    request = _message(17, bytes(body))
    prefix = encode_varint(len(request))
    shift = len(prefix) + len(request) - len(body)
    return PointLayout(
        template=prefix + request,
        time_offset=time_start + shift,
        field_offsets=tuple(offset + shift for offset in field_offsets),
    )


def _varint9(values: np.ndarray) -> np.ndarray:
    """Each uint64 in ``values`` as exactly 9 varint bytes (all must be in [2**56, 2**63))."""
    out = np.empty((len(values), 9), dtype=np.uint8)
    rest = values.astype(np.uint64)
    for i in range(9):
        low = (rest & np.uint64(0x7F)).astype(np.uint8)
        out[:, i] = low | (0x80 if i < 8 else 0)
        rest = rest >> np.uint64(7)
    return out


@dataclass(frozen=True)
class Workload:
    """``points`` points over ``groups`` groups (``groups == points``: every point a new group)."""

    points: int
    groups: int = 100
    seed: int = 1

    def __post_init__(self) -> None:
        if self.points < 1 or not 1 <= self.groups <= 8_000_000:
            raise ValueError(f"bad workload {self}")

    @property
    def label(self) -> str:
        return f"{self.points:,} points, {self.groups:,} groups"

    @property
    def frame_length(self) -> int:
        return len(point_layout(0).template)

    def time_of(self, index: int) -> int:
        return T0_NS + index * STEP_NS

    def values(self, start: int, stop: int) -> np.ndarray:
        """Field values of points ``start..stop-1``, shape (n, len(FIELDS)): reproducible, in [0, 100)."""
        index = np.arange(start, stop, dtype=np.uint64)
        # A cheap counter-based hash, so any slice is generated on its own.
        mixed = (index + np.uint64(self.seed)) * np.uint64(0x9E3779B97F4A7C15)
        columns = []
        for salt in range(len(FIELDS)):
            h = mixed ^ (mixed >> np.uint64(29 + salt))
            h = h * np.uint64(0xBF58476D1CE4E5B9 + 2 * salt)
            columns.append((h >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 100.0)
        return np.stack(columns, axis=1)

    def path(self) -> str:
        """The cache file holding every point frame, created on first use."""
        name = f"workload-v{_FORMAT_VERSION}-{self.points}-{self.groups}-{self.seed}.bin"
        path = os.path.join(CACHE_DIR, name)
        if not os.path.exists(path) or os.path.getsize(path) != self.points * self.frame_length:
            os.makedirs(CACHE_DIR, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=CACHE_DIR, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    for start in range(0, self.points, _GENERATE_CHUNK):
                        out.write(self.frames(start, min(self.points, start + _GENERATE_CHUNK)))
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        return path

    def frames(self, start: int, stop: int) -> bytes:
        """The frames of points ``start..stop-1``, concatenated."""
        index = np.arange(start, stop, dtype=np.int64)
        group_of = index % self.groups
        present = np.arange(self.groups) if stop - start >= self.groups else np.unique(group_of)
        layouts = [point_layout(int(g)) for g in present]
        first = layouts[0]
        # Fixed-width tags make every layout the same shape; the patching below relies on it.
        assert all(
            (len(layout.template), layout.time_offset, layout.field_offsets)
            == (len(first.template), first.time_offset, first.field_offsets)
            for layout in layouts
        )
        table = np.frombuffer(b"".join(layout.template for layout in layouts), dtype=np.uint8)
        rows = table.reshape(len(layouts), len(first.template))[np.searchsorted(present, group_of)]
        times = np.uint64(T0_NS) + index.astype(np.uint64) * np.uint64(STEP_NS)
        rows[:, first.time_offset : first.time_offset + 9] = _varint9(times)
        values = np.ascontiguousarray(self.values(start, stop), dtype="<f8")
        for column, offset in enumerate(first.field_offsets):
            rows[:, offset : offset + 8] = values[:, column].copy().view(np.uint8).reshape(-1, 8)
        return rows.tobytes()


def init_frame(options: list[tuple[str, object]]) -> bytes:
    """Request{init} with Kapacitor's typing of the option values."""
    from udf_agent import udf_pb2

    wire = []
    for name, value in options:
        if isinstance(value, bool):
            typed = udf_pb2.OptionValue(type=udf_pb2.BOOL, boolValue=value)
        elif isinstance(value, int):
            typed = udf_pb2.OptionValue(type=udf_pb2.INT, intValue=value)
        elif isinstance(value, float):
            typed = udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=value)
        else:
            typed = udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=str(value))
        wire.append(udf_pb2.Option(name=name, values=[typed]))
    request = udf_pb2.Request(init=udf_pb2.InitRequest(options=wire, taskID="bench", nodeID="udf1"))
    body = request.SerializeToString()
    return encode_varint(len(body)) + body


def keepalive_frame(stamp: int) -> bytes:
    body = _message(3, _key(1, 0) + encode_varint(stamp))
    return encode_varint(len(body)) + body


MOVING_AVG_OPTIONS: list[tuple[str, object]] = [("field", "usage_user"), ("size", 10), ("as", "avg")]


def varint_length(frame: bytes | memoryview) -> int:
    """Bytes of the length varint that starts ``frame``: Kapacitor writes them apart from the body."""
    return read_varint(frame, 0)[1]
