"""Kapacitor's watchdog without protobuf: a KeepaliveRequest's time read and its
KeepaliveResponse written by hand, byte for byte what protobuf makes of them.

A relay answers keepalives from its process's first moment, before it could have imported
protobuf (~30 ms); the agent's reader answers every one it reads, and this costs it less.
"""

from __future__ import annotations

from udf_agent.wire.frames import KEEPALIVE_KEY, ProtocolError, encode_varint, read_varint

# KeepaliveRequest.time and KeepaliveResponse.time: field 1, a varint.
_TIME_KEY = (1 << 3) | 0
_INT64 = (1 << 64) - 1
# Wire types a field is skipped by: varint, 64-bit, length-delimited, 32-bit.
_VARINT, _FIXED64, _DELIMITED, _FIXED32 = 0, 1, 2, 5


def keepalive_frame(time: int) -> bytes:
    """A framed Response holding KeepaliveResponse(time): a time of 0 is left out of the
    inner message, as protobuf leaves out defaults, and the Response is never empty."""
    inner = b"" if time == 0 else bytes((_TIME_KEY,)) + encode_varint(time & _INT64)
    body = bytes((KEEPALIVE_KEY,)) + encode_varint(len(inner)) + inner
    return encode_varint(len(body)) + body


def keepalive_request_time(body: bytes) -> int:
    """KeepaliveRequest.time in a Request frame's ``body`` holding one (0 where it has none);
    ProtocolError if the body is not one."""
    if body[:1] != bytes((KEEPALIVE_KEY,)):
        raise ProtocolError("not a KeepaliveRequest")
    length, pos = read_varint(body, 1)
    end = pos + length
    if end > len(body):
        raise ProtocolError("a KeepaliveRequest longer than its frame")
    time = 0
    while pos < end:
        key, pos = read_varint(body, pos)
        wire_type = key & 7
        if wire_type == _VARINT:
            value, pos = read_varint(body, pos)
            if key == _TIME_KEY:
                time = value - (1 << 64) if value >> 63 else value  # int64, two's complement
        elif wire_type == _DELIMITED:
            skip, pos = read_varint(body, pos)
            pos += skip
        elif wire_type in (_FIXED64, _FIXED32):
            pos += 8 if wire_type == _FIXED64 else 4
        else:
            raise ProtocolError(f"a KeepaliveRequest field of wire type {wire_type}")
    if pos != end:
        raise ProtocolError("a KeepaliveRequest field runs past its message")
    return time
