"""Framing of Kapacitor's UDF protocol, sans-IO.

A frame is an unsigned varint length followed by one serialised protobuf
message. ``FrameDecoder.feed`` takes byte chunks cut anywhere and returns the
whole messages they complete; ``encode_frame`` turns one message into the
single bytes object that is written in one write.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from google.protobuf.message import DecodeError, Message

DEFAULT_MAX_FRAME_SIZE = 64 * 1024 * 1024
# A uint64 needs at most ten 7-bit groups.
_MAX_VARINT_BYTES = 10

M = TypeVar("M", bound=Message)


class ProtocolError(Exception):
    """The peer sent bytes or messages that break the protocol.

    ``decoded`` holds the whole messages that preceded the bad bytes in the
    same ``feed``: they were accepted and must still be acted on.
    """

    def __init__(self, message: str, decoded: list | None = None):
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


def encode_frame(message: Message) -> bytes:
    body = message.SerializeToString()
    return encode_varint(len(body)) + body


class FrameDecoder(Generic[M]):
    """Turns a byte stream into messages of one type.

    Buffered bytes are kept until a frame is whole; nothing is allocated for a
    declared length before the bytes of that frame have actually arrived, and
    a length above ``max_frame_size`` is refused as soon as its varint is read.
    """

    def __init__(self, message_type: type[M], max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self._message_type = message_type
        self._max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._frames_decoded = 0

    @property
    def buffered(self) -> int:
        """Bytes received that do not yet complete a frame."""
        return len(self._buffer)

    def feed(self, data: bytes) -> list[M]:
        if data:
            self._buffer += data
        buffer = self._buffer
        size = len(buffer)
        messages: list[M] = []
        pos = 0
        try:
            while pos < size:
                length, body_start = self._read_length(buffer, pos, size)
                if length is None:
                    break
                body_end = body_start + length
                if body_end > size:
                    break
                messages.append(self._parse(bytes(buffer[body_start:body_end])))
                pos = body_end
        except ProtocolError as exc:
            exc.decoded = messages
            raise
        finally:
            if pos:
                del buffer[:pos]
        return messages

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
            if value > self._max_frame_size:
                raise ProtocolError(
                    f"frame {self._frames_decoded + 1} declares a length above the "
                    f"{self._max_frame_size}-byte limit"
                )
            if not byte & 0x80:
                return value, index + 1
            shift += 7
        if size - pos >= _MAX_VARINT_BYTES:
            raise ProtocolError(f"frame {self._frames_decoded + 1} starts with a malformed varint length")
        return None, pos

    def _parse(self, body: bytes) -> M:
        self._frames_decoded += 1
        try:
            # A fresh message for every frame: upb grows a reused one forever.
            return self._message_type.FromString(body)
        except DecodeError as exc:
            raise ProtocolError(
                f"frame {self._frames_decoded} is not a valid {self._message_type.__name__}: {exc}"
            ) from None
