"""How udf-agent's own links frame their messages: the relay's link to the shared server
(``serve/relay_link.py``) and the agent's to its resident Spark workers
(``spark_backend/resident_protocol.py``).

A message is its kind (one byte) and its payload's length (eight bytes), then the payload. A
length inside a payload is eight bytes too. Little-endian throughout. Kapacitor's own frames
are another format: a varint length, then a protobuf message (``frames.py``). A snapshot is a
stored format of its own, versioned (``runtime/snapshot.py``).
"""

from __future__ import annotations

import struct

HEADER = struct.Struct("<BQ")
LENGTH = struct.Struct("<Q")


def begin_message(buffer: bytearray) -> None:
    """Leaves room in ``buffer`` for the header of a message whose payload is appended next."""
    buffer += bytes(HEADER.size)


def end_message(buffer: bytearray, kind: int) -> None:
    """Writes the header of the message ``begin_message`` started, once its payload is in."""
    HEADER.pack_into(buffer, 0, kind, len(buffer) - HEADER.size)


def message(kind: int, *payload: bytes) -> bytes:
    """A payload of ``payload``'s parts, one after another, behind its header, joined once. A
    message too large to copy (a checkpoint) is built in place instead: ``begin_message``."""
    return b"".join((HEADER.pack(kind, sum(len(part) for part in payload)), *payload))
