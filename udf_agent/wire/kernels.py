"""Compiled primitives over raw protobuf bytes, shared by the frame scanner and the point codec.

Their plain-Python twins are ``frames.read_varint``, the slicing in ``batches`` and ``bytes.decode``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; position -1 if it runs past ``end``."""
    value = 0
    shift = 0
    while pos < end and shift < 64:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    return 0, -1


@njit(cache=True, nogil=True)
def skip_field(buf: Any, key: int, pos: int, end: int) -> tuple[int, int, int]:
    """Skips one field's value: (position after it, value start, value end); position -1 if malformed.

    The value span is that of a length-delimited field, else (-1, -1).
    """
    wire_type = key & 7
    if wire_type == 0:
        _, pos = varint(buf, pos, end)
        return pos, -1, -1
    if wire_type == 2:
        length, pos = varint(buf, pos, end)
        if pos < 0 or length < 0 or length > end - pos:
            return -1, -1, -1
        return pos + length, pos, pos + length
    if wire_type == 1:
        return (pos + 8 if pos + 8 <= end else -1), -1, -1
    if wire_type == 5:
        return (pos + 4 if pos + 4 <= end else -1), -1, -1
    return -1, -1, -1


SHORT_SPAN = 32


@njit(cache=True, nogil=True)
def gather(buf: Any, spans: Any) -> tuple[Any, Any]:
    """The bytes of each span, concatenated, and Arrow's int32 offsets for them."""
    count = spans.shape[0]
    offsets = np.empty(count + 1, np.int32)
    offsets[0] = 0
    for i in range(count):
        offsets[i + 1] = offsets[i] + (spans[i, 1] - spans[i, 0])
    data = np.empty(offsets[count], np.uint8)
    for i in range(count):
        start, end, out = spans[i, 0], spans[i, 1], offsets[i]
        if end - start <= SHORT_SPAN:
            # Tag values and names are a few bytes: a byte loop beats making two array views.
            for b in range(start, end):
                data[out] = buf[b]
                out += 1
        else:
            data[out : offsets[i + 1]] = buf[start:end]
    return data, offsets


@njit(cache=True, nogil=True)
def invalid_utf8(buf: Any, j: int, end: int) -> bool:
    """Whether ``buf[j:end]`` is not valid UTF-8 (by ``bytes.decode``'s rules, its twin)."""
    while j < end:
        lead = buf[j]
        if lead < 0x80:
            j += 1
            continue
        if 0xC2 <= lead <= 0xDF:
            tail = 1
        elif 0xE0 <= lead <= 0xEF:
            tail = 2
        elif 0xF0 <= lead <= 0xF4:
            tail = 3
        else:
            return True
        if j + tail >= end:
            return True
        second = buf[j + 1]
        # Overlong forms, surrogates and code points above U+10FFFF.
        if (lead == 0xE0 and second < 0xA0) or (lead == 0xED and second > 0x9F):
            return True
        if (lead == 0xF0 and second < 0x90) or (lead == 0xF4 and second > 0x8F):
            return True
        for k in range(1, tail + 1):
            if buf[j + k] & 0xC0 != 0x80:
                return True
        j += tail + 1
    return False


@njit(cache=True, nogil=True)
def first_invalid_utf8(buf: Any, spans: Any) -> int:
    """The first span whose bytes are not valid UTF-8, or -1; (-1, -1) is empty."""
    for i in range(spans.shape[0]):
        if invalid_utf8(buf, spans[i, 0], spans[i, 1]):
            return i
    return -1
