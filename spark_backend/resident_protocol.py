"""Messages between the agent and its resident workers, over TCP, both ways.

A header (kind: 1 byte, payload length: 8 bytes), then the payload. The job (the UDF and its
options) travels once per worker, pickled by Spark's own cloudpickle as Spark ships any pandas
UDF, keyed by a digest of its pickle; tasks and results travel as Arrow IPC.
"""

from __future__ import annotations

import socket
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa

HEADER = struct.Struct("!BQ")
# HELLO and WELCOME prove a worker was launched by this agent (a random token); JOB and
# TASKS carry the job key first.
HELLO, WELCOME, JOB, TASKS, RESULT, FAILURE = range(1, 7)
JOB_KEY_BYTES = 16

# Jobs a worker keeps unpickled (one per UDF and options; `serve` may have many).
KEPT_JOBS = 64


def send_message(sock: socket.socket, kind: int, *parts: bytes | bytearray | memoryview | pa.Buffer) -> None:
    """One message whose payload is ``parts`` (bytes-like) one after another, never joined:
    a micro-batch is megabytes, and copying it holds the GIL the reader needs."""
    sock.sendall(HEADER.pack(kind, sum(len(part) for part in parts)))
    for part in parts:
        sock.sendall(part)


def receive_message(sock: socket.socket) -> tuple[int, bytearray] | None:
    """The next message, or None at a clean end of stream (before a header)."""
    header = receive_exactly(sock, HEADER.size, eof_ok=True)
    if header is None:
        return None
    kind, length = HEADER.unpack(header)
    payload = receive_exactly(sock, length, eof_ok=False)
    assert payload is not None
    return kind, payload


def receive_exactly(sock: socket.socket, length: int, eof_ok: bool) -> bytearray | None:
    buffer = bytearray(length)
    view = memoryview(buffer)
    received = 0
    while received < length:
        count = sock.recv_into(view[received:])
        if count == 0:
            if eof_ok and received == 0:
                return None
            raise ConnectionError(f"connection closed after {received} of {length} bytes")
        received += count
    return buffer
