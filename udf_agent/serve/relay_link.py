"""The shared server's messages to a task's relay: whole Kapacitor frames in length-prefixed
chunks, and the task's log records.

The relay passes Kapacitor whole frames only, so that a server that dies in the middle of a
write still leaves the task a well-formed last frame. Finding where frames end would cost the
relay a step per frame (a third of its CPU under Kapacitor's feed); the server knows already,
since each of its writes is whole frames. So each write goes out as one chunk behind its length,
and the relay passes on whole chunks without looking inside them. A chunk carries the count of
its frames that a carry-over counts (all but keepalive replies), which the server's compiled
scanner finds for a fraction of what the relay's walk through them would cost.

A message's kind (``wire/links.py``) says what it holds: OUTPUT, such a chunk; LOG_RECORD, a
log record (``logs.forwarded_record``): what the task logged in the server, which the relay logs on the task's own stderr, where Kapacitor keeps
a UDF's log. Records travel ahead of the output chunk of the writer's next write, so the writes
to the socket stay the agent's writer's, one at a time (a chunk written at once by the compute
thread, ``write_now``, never goes while records are queued); a task that logs while no output
flows wakes its writer with an empty write. Logging never waits on the relay: records the writer has
not taken yet are bounded, and those past the bound are dropped and counted.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from typing import NamedTuple

from udf_agent.logs import TaskLabels, TaskLogRoutes, forwarded_record
from udf_agent.runtime.connection import Deadline, WriteTimeout
from udf_agent.runtime.transports import SocketConnection, no_deadline
from udf_agent.runtime.writer import LinkMessage, Writer
from udf_agent.wire import hotpath
from udf_agent.wire.frames import KEEPALIVE_KEY
from udf_agent.wire.links import HEADER, LENGTH, begin_message, end_message, message

# The kinds of message: whole frames of output (behind the count of those that are not keepalive
# replies), a log record, a checkpoint (``checkpoint_message``).
OUTPUT, LOG_RECORD, CHECKPOINT = range(3)
# A task's log records waiting for its writer (one is at most ~20 KiB: messages are cut).
MAX_QUEUED_LOG_BYTES = 256 * 1024
# The send buffer of a task's connection to its relay. A keepalive reply jumps the writer's
# queue, but not what the socket already holds: unsized (~200 KiB) that was the larger part of
# its wait on the way out flat out (p99 20-51 -> 12-18 ms on the output side).
OUTPUT_SEND_BUFFER = 32 * 1024


def checkpoint_message(input_bytes: int, init_frame: bytes, write_state: Callable[[bytearray], None]) -> LinkMessage:
    """A checkpoint as it goes to the relay, in its place among the output chunks: the task's
    state (the agent's own snapshot, which ``write_state`` appends to the message) as of
    ``input_bytes`` of its input, every output for that input written before it, and the
    Init that starts the task afresh."""
    out = LinkMessage()
    begin_message(out)
    out += LENGTH.pack(input_bytes)
    out += LENGTH.pack(len(init_frame))
    out += init_frame
    write_state(out)
    end_message(out, CHECKPOINT)
    return out


class Checkpoint(NamedTuple):
    input_bytes: int
    init_frame: bytes
    snapshot: bytes | memoryview

    @classmethod
    def parse(cls, payload: bytes | bytearray) -> Checkpoint:
        """The snapshot is kept where it is, a view of ``payload`` (which must not change
        after): a checkpoint of many groups' state is tens of MB, and the relay's footprint is
        what it keeps plus what it copies on the way."""
        (input_bytes,) = LENGTH.unpack_from(payload)
        (init_length,) = LENGTH.unpack_from(payload, LENGTH.size)
        start = 2 * LENGTH.size
        return cls(input_bytes, bytes(payload[start : start + init_length]), memoryview(payload)[start + init_length :])


def output_message(frames: bytes, counted: int) -> bytes:
    """Whole ``frames`` as they go to the relay: behind their length and ``counted``, how many
    of them are not keepalive replies (what a carry-over counts)."""
    return message(OUTPUT, LENGTH.pack(counted), frames)


def log_message(record: bytes) -> bytes:
    """``record`` as it goes to the relay: behind its length, marked as a log record."""
    return message(LOG_RECORD, record)


class RelayedConnection(SocketConnection):
    """A task's connection from its relay: output leaves as chunks of whole frames, its log
    records (once ``forward_logs``) ahead of them."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__(sock)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, OUTPUT_SEND_BUFFER)
        self._log_lock = threading.Lock()
        self._log_messages: list[bytes] = []
        self._log_bytes = 0
        self._logs_dropped = 0
        self._labels: TaskLabels | None = None
        self._routes: TaskLogRoutes | None = None
        self._writer: Writer | None = None

    checkpoint_message = staticmethod(checkpoint_message)

    def forward_logs(self, routes: TaskLogRoutes, labels: TaskLabels, writer: Writer) -> None:
        """From now on what the threads of the task of ``labels`` log goes to its relay too,
        written by ``writer`` (this connection's), until the output closes."""
        self._labels, self._routes, self._writer = labels, routes, writer
        routes.add(labels, self._queue_log_record)

    def _queue_log_record(self, record: bytes) -> None:
        """Any thread; never waits for the relay (past the bound, the record is dropped)."""
        framed = log_message(record)
        with self._log_lock:
            if self._log_bytes + len(framed) > MAX_QUEUED_LOG_BYTES:
                self._logs_dropped += 1
                return
            wake = not self._log_messages  # else a write that takes them is due already
            self._log_messages.append(framed)
            self._log_bytes += len(framed)
        if wake and self._writer is not None:
            self._writer.send(b"", wait=False)  # an empty write: the records go out with it

    def _take_log_messages(self) -> bytes:
        with self._log_lock:
            messages, dropped = self._log_messages, self._logs_dropped
            self._log_messages, self._log_bytes, self._logs_dropped = [], 0, 0
        if dropped and self._labels is not None:
            notice = logging.makeLogRecord(
                {
                    "name": __name__,
                    "levelno": logging.WARNING,
                    "levelname": "WARNING",
                    "msg": f"{dropped} log record(s) of this task were not sent to its stderr: its relay did not keep up (the shared server's log has them)",
                }
            )
            messages.append(log_message(forwarded_record(notice, self._labels)))
        return b"".join(messages)

    def write(self, data: bytes | bytearray, deadline: Deadline = no_deadline) -> None:
        """``data``, whole frames (or nothing), as one chunk, after the log records queued since
        the last write; a link message (a checkpoint) as it is."""
        queued = self._take_log_messages()
        if isinstance(data, LinkMessage):
            if queued:  # apart: a checkpoint is large, and a joined copy of it only a peak
                super().write(queued, deadline)
            super().write(data, deadline)
            return
        assert isinstance(data, bytes)  # frames: only a link message is built in a bytearray
        if data:
            # Compiled once the server's scanner has loaded (the relay, which never writes here, never loads it).
            queued += output_message(data, hotpath.kernels().count_frames(data, KEEPALIVE_KEY))
        if not queued:
            return
        try:
            super().write(queued, deadline)
        except WriteTimeout as exc:  # counted in frames' bytes, headers and log records not included
            raise WriteTimeout(max(0, exc.written - (len(queued) - len(data)))) from None

    def write_now(self, data: bytes) -> bool:
        """``data`` as one chunk, whole frames; not with log records queued: they go first, by ``write``."""
        with self._log_lock:
            if self._log_messages or self._logs_dropped:
                return False
        if isinstance(data, LinkMessage) or not data:
            return False
        return super().write_now(output_message(data, hotpath.kernels().count_frames(data, KEEPALIVE_KEY)))

    def close_write(self) -> None:
        if self._routes is not None and self._labels is not None:
            self._routes.remove(self._labels)  # what the task logs from now on stays in the server's log
        super().close_write()


class LinkError(ValueError):
    """What the server sent is not this link's messages."""


class ChunkSplitter:
    """Sans-IO, the relay's side: bytes as received in; out, the frames of the chunks they
    complete (and how many of them are not keepalive replies) and the log records they complete."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.last_chunk = b""  # the last whole chunk's frames: its last frame says how the task ended

    @property
    def buffered(self) -> int:
        """Bytes of a chunk or record not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes | memoryview) -> tuple[bytes, int, list[bytes], Checkpoint | None]:
        """The frames of every chunk ``data`` completes and how many of them are not keepalive
        replies, the log records it completes, each in order, up to the first checkpoint it
        completes, which comes last: feed ``b""`` again for what follows it (output after a
        checkpoint is output of input after it)."""
        buffer = self._buffer
        buffer += data
        pos, size = 0, len(buffer)
        chunks: list[bytes] = []
        counted = 0
        records: list[bytes] = []
        checkpoint: Checkpoint | None = None
        while size - pos >= HEADER.size and checkpoint is None:
            kind, length = HEADER.unpack_from(buffer, pos)
            end = pos + HEADER.size + length
            if end > size:
                break
            start = pos + HEADER.size
            if kind == OUTPUT:
                if length < LENGTH.size:
                    raise LinkError(f"an output chunk of {length} bytes, short of its count")
                counted += LENGTH.unpack_from(buffer, start)[0]
                chunks.append(bytes(buffer[start + LENGTH.size : end]))
                pos = end
                continue
            if kind == LOG_RECORD:
                records.append(bytes(buffer[start:end]))
            elif kind == CHECKPOINT:
                # The buffer becomes the checkpoint's, cut to its payload; what follows it (at
                # most a receive's worth) starts a new buffer.
                self._buffer = bytearray(buffer[end:])
                del buffer[end:]
                del buffer[:start]  # from the front: a bytearray only moves its start
                checkpoint = Checkpoint.parse(buffer)
                buffer, pos = self._buffer, 0
                break
            else:
                raise LinkError(f"a message of unknown kind {kind}")
            pos = end
        del buffer[:pos]
        if chunks:
            self.last_chunk = chunks[-1]
        return b"".join(chunks), counted, records, checkpoint
