"""Framing of Kapacitor's UDF protocol, sans-IO.

A frame is an unsigned varint length followed by one serialised protobuf
message. ``FrameDecoder.feed`` takes byte chunks cut anywhere and returns the
whole messages they complete; ``encode_frame`` turns one message into the
single bytes object that is written in one write.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Generic, TypeVar

from google.protobuf.message import DecodeError, Message

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
# A uint64 needs at most ten 7-bit groups.
_MAX_VARINT_BYTES = 10

M = TypeVar("M", bound=Message)
S = TypeVar("S", bound="FrameSplitter")


class ProtocolError(Exception):
    """The peer sent bytes or messages that break the protocol.

    ``decoded`` holds the whole messages that preceded the bad bytes in the
    same ``feed``: they were accepted and must still be acted on.
    """

    def __init__(self, message: str, decoded: list[Any] | None = None):
        super().__init__(message)
        self.decoded = decoded or []


def encode_varint(value: int) -> bytes:
    if value < 0:
        raise ValueError("varint length cannot be negative")
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """Bytes of ``value`` as a varint (a frame's length prefix)."""
    return max(1, (value.bit_length() + 6) // 7)


def encode_frame(message: Message) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


# What a frame's body starts with, by the message it holds: Request's and Response's oneof
# ``message`` is field N, length-delimited, so the body's first bytes are the key varint
# (N << 3) | 2. Both number their messages alike (error is a Response's only). Named here
# once, without the generated udf_pb2 (which a relay never imports); tests/test_proto.py
# holds them to udf.proto. Under field 16 a key is one byte (an int), from 16 on two (bytes).
INIT_KEY = (2 << 3) | 2
KEEPALIVE_KEY = (3 << 3) | 2
SNAPSHOT_KEY = (4 << 3) | 2
RESTORE_KEY = (5 << 3) | 2
ERROR_KEY = (6 << 3) | 2
BEGIN_KEY = encode_varint((16 << 3) | 2)
POINT_KEY = encode_varint((17 << 3) | 2)
END_KEY = encode_varint((18 << 3) | 2)


def frame_spans(data: bytes | bytearray | memoryview) -> Iterator[tuple[int, int, int]]:
    """(start, body start, end) of each frame in ``data``: the one plain-Python walk over frames
    (the compiled ones are in ``scanner``). The last frame may be cut short, its end past
    ``data``'s; a length itself cut short ends the walk."""
    pos, size = 0, len(data)
    while pos < size:
        start = pos
        length = data[pos]
        if length < 0x80:  # a body under 128 bytes: its length read inline
            pos += 1
        else:
            try:
                length, pos = read_varint(data, pos)
            except ProtocolError:
                return
        yield start, pos, pos + length
        pos += length


def count_frames(data: bytes, uncounted_key: int) -> int:
    """The frames of ``data`` (whole frames only) but those whose body starts with the byte
    ``uncounted_key``. The compiled twin: ``scanner.count_frames``."""
    return sum(1 for _, body, end in frame_spans(data) if body == end or data[body] != uncounted_key)


def last_frame_key(data: bytes | memoryview) -> int | None:
    """The first byte of the last whole frame's body (the key that says what it holds), if any."""
    key = None
    for _, body, end in frame_spans(data):
        if end > len(data):
            break  # cut short: not a frame yet
        key = data[body] if end > body else None
    return key


class PointRun:
    """Consecutive whole frames that each hold only a Request.point, as received.

    A Response frame carrying a point is byte for byte the Request frame that
    carried it, so a run can be written back without decoding a single point.
    The compiled scanner (``udf_agent.wire.scanner``) also gives, as (count, 2) arrays of
    offsets into ``frames``, each point with its length varint and its group
    ((-1, -1) when the point has none).
    """

    # A plain class, not a dataclass: the relay imports this module and starts sooner without.
    __slots__ = ("frames", "count", "points", "groups")

    def __init__(self, frames: bytes, count: int, points: Any = None, groups: Any = None):
        self.frames, self.count, self.points, self.groups = frames, count, points, groups


class RequestRun:
    """Consecutive whole frames of the requests a Kapacitor Handler script's handler takes as
    they came (points, BeginBatch and EndBatch), length prefixes included, unparsed: the
    session passes them on in one piece (``scanner.RequestRunSplitter``)."""

    __slots__ = ("frames", "count")

    def __init__(self, frames: bytes, count: int):
        self.frames, self.count = frames, count


Piece = bytes | PointRun | RequestRun


class FrameSplitter:
    """Cuts a byte stream into frame bodies, without parsing them.

    Buffered bytes are kept until a frame is whole; nothing is allocated for a
    declared length before the bytes of that frame have actually arrived, and
    a length above ``max_frame_size`` is refused as soon as its varint is read.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self.frames = 0

    @classmethod
    def continuing(cls: type[S], splitter: FrameSplitter) -> S:
        """Takes over from ``splitter`` mid-stream: its buffered bytes and frame count."""
        taking_over = cls(splitter.max_frame_size)
        taking_over._buffer = splitter._buffer
        taking_over.frames = splitter.frames
        return taking_over

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet complete a frame."""
        return len(self._buffer)

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        """The bodies of the frames ``data`` completes, in order."""
        if data:
            self._buffer += data
        buffer = self._buffer
        size = len(buffer)
        bodies: list[bytes] = []
        pos = 0
        try:
            while pos < size:
                frame = self._frame_at(buffer, pos, size)
                if frame is None:
                    break
                bodies.append(bytes(buffer[frame[0] : frame[1]]))
                self.frames += 1
                pos = frame[1]
        except ProtocolError as exc:
            exc.decoded = bodies
            raise
        finally:
            if pos:
                del buffer[:pos]
        return bodies

    def _frame_at(self, buffer: bytearray, pos: int, size: int) -> tuple[int, int] | None:
        """Where the body of the frame starting at ``pos`` starts and ends; None until it is whole."""
        # Lengths of one and two bytes are read inline: points are 30-16383 bytes.
        first = buffer[pos]
        if first < 0x80:
            length, body_start = first, pos + 1
        elif pos + 1 < size and buffer[pos + 1] < 0x80:
            length, body_start = (first & 0x7F) | (buffer[pos + 1] << 7), pos + 2
        else:
            read, body_start = self._read_length(buffer, pos, size)
            if read is None:
                return None
            length = read
        if length > self.max_frame_size:
            self._read_length(buffer, pos, size)  # raises the error that names the frame
        body_end = body_start + length
        return None if body_end > size else (body_start, body_end)

    def close(self) -> None:
        """Declares end of input; a partial frame left over is an error."""
        if self._buffer:
            raise ProtocolError(
                f"input ended inside a frame ({len(self._buffer)} bytes of an unfinished frame)"
            )

    def _read_length(self, buffer: bytearray, pos: int, size: int) -> tuple[int | None, int]:
        value = 0
        shift = 0
        for index in range(pos, min(size, pos + _MAX_VARINT_BYTES)):
            byte = buffer[index]
            value |= (byte & 0x7F) << shift
            if value > self.max_frame_size:
                raise ProtocolError(
                    f"frame {self.frames + 1} declares a length above the {self.max_frame_size}-byte limit"
                )
            if not byte & 0x80:
                return value, index + 1
            shift += 7
        if size - pos >= _MAX_VARINT_BYTES:
            raise ProtocolError(f"frame {self.frames + 1} starts with a malformed varint length")
        return None, pos


def parse_message(message_type: type[M], body: bytes, frame_number: int = 0) -> M:
    try:
        # A fresh message for every frame: upb grows a reused one forever.
        return message_type.FromString(body)
    except DecodeError as exc:
        where = f"frame {frame_number}" if frame_number else "a frame"
        raise ProtocolError(f"{where} is not a valid {message_type.__name__}: {exc}") from None


class FrameDecoder(Generic[M]):
    """Turns a byte stream into messages of one type."""

    def __init__(self, message_type: type[M], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self._message_type = message_type
        self._splitter = FrameSplitter(max_frame_size)

    @property
    def buffered(self) -> int:
        return self._splitter.buffered

    def feed(self, data: bytes) -> list[M]:
        messages: list[M] = []
        try:
            bodies = self._splitter.feed(data)
        except ProtocolError as exc:
            exc.decoded = self._parse_all(exc.decoded, messages)
            raise
        return self._parse_all(bodies, messages)

    def close(self) -> None:
        self._splitter.close()

    def _parse_all(self, bodies: list[bytes], messages: list[M]) -> list[M]:
        first = self._splitter.frames - len(bodies) + 1
        for number, body in enumerate(bodies, first):
            try:
                messages.append(parse_message(self._message_type, body, number))
            except ProtocolError as exc:
                exc.decoded = messages
                raise
        return messages


def read_varint(data: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; ProtocolError if it runs off the end."""
    value = 0
    shift = 0
    size = len(data)
    while pos < size and shift < 70:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
    raise ProtocolError("malformed varint inside a message")


_GROUP_FIELD = 5


def request_point(body: bytes) -> bytes | None:
    """The serialised Point of a Request frame that holds only a point, else None.

    Points are most of the traffic: they are kept as bytes and decoded
    column-wise where they are computed, never parsed one by one here.
    """
    if not body.startswith(POINT_KEY):
        return None
    length, start = read_varint(body, len(POINT_KEY))
    if start + length != len(body):
        return None  # anything else in the Request: let the full parser decide
    return body[start:]


def point_frame(point: bytes) -> bytes:
    """The Response frame carrying a serialised Point (the same bytes as the Request frame)."""
    body = POINT_KEY + encode_varint(len(point)) + point
    return encode_varint(len(body)) + body


def point_group(point: bytes) -> str:
    """A serialised Point's group id, read without parsing the point."""
    pos = 0
    size = len(point)
    group = b""
    while pos < size:
        key, pos = read_varint(point, pos)
        field, wire_type = key >> 3, key & 7
        if wire_type == 0:
            _, pos = read_varint(point, pos)
        elif wire_type == 2:
            length, pos = read_varint(point, pos)
            if field == _GROUP_FIELD:
                group = point[pos : pos + length]
            pos += length
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise ProtocolError(f"Point holds field {field} of unsupported wire type {wire_type}")
    if pos != size:
        raise ProtocolError("Point ends inside a field")
    try:
        return group.decode()
    except UnicodeDecodeError:
        raise ProtocolError("Point.group is not valid UTF-8") from None
