"""The writer of an agent's output: frames in order, keepalive replies first, one write at a time."""

from __future__ import annotations

import logging
import threading
from collections import deque

from udf_agent.logs import TaskLabels, in_task
from udf_agent.runtime.connection import Connection, WriteTimeout

log = logging.getLogger(__name__)

# The most the writer hands to one write: a keepalive reply queued meanwhile waits
# for no more than this (and the pipe's own buffer) to drain.
WRITE_CHUNK = 256 * 1024
# Output queued for a peer that reads slowly or not at all; past it, whoever sends data
# waits (compute stops, then the reader: backpressure), so memory stays bounded.
OUTPUT_QUEUE_BYTES = 32 * 1024 * 1024


class LinkMessage(bytearray):
    """Bytes for the connection itself, not Kapacitor frames (a relayed task's checkpoint):
    written alone, in its place in the output, never joined with frames. Built in place (a
    checkpoint's snapshot is compressed straight into it): no copy of tens of MB is made."""


class Writer:
    """The writer: frames in order, keepalive replies ahead of queued data. Its thread
    writes them, but for a small piece sent while nothing is queued or under way, which the
    sender writes itself (``send_now``); one write at a time either way.

    Once ``drain_by`` has set a deadline, output that cannot be written by
    then is dropped (and counted) and the output is closed: after the end of
    input nothing may keep the agent alive, not even a peer that stopped reading.
    """

    def __init__(self, connection: Connection, labels: TaskLabels | None = None):
        self._connection = connection
        self._frames: deque[bytes | LinkMessage] = deque()
        self._queued = 0  # bytes in _frames
        self._cond = threading.Condition()
        self._closing = False
        self._writing = False  # a write is under way (the writer's, or ``send_now``'s)
        self._deadline: float | None = None
        self.broken: BaseException | None = None
        self.unwritten_frames = 0
        self.unwritten_bytes = 0
        self._thread = threading.Thread(target=self._run if labels is None else in_task(labels, self._run), name="writer", daemon=True)
        self._thread.start()

    @property
    def queued_bytes(self) -> int:
        """Bytes of output waiting to be written."""
        return self._queued

    def send(self, frame: bytes | LinkMessage, urgent: bool = False, wait: bool = True) -> None:
        """Queues ``frame``; with ``wait``, data waits while the queue is full
        (``OUTPUT_QUEUE_BYTES``). An urgent frame (a keepalive reply) never waits and goes
        first; replies sent by a thread that holds the agent's lock pass ``wait=False``."""
        with self._cond:
            while wait and not urgent and self._queued >= OUTPUT_QUEUE_BYTES and not self._closing and self._deadline is None:
                self._cond.wait(0.1)
            if self._closing:
                return
            if urgent:
                self._frames.appendleft(frame)
            else:
                self._frames.append(frame)
            self._queued += len(frame)
            self._cond.notify_all()

    def send_now(self, frame: bytes) -> None:
        """``send``, but written by the calling thread when nothing is queued or being written
        and the connection takes it at once (``Connection.write_now``): on a trickle, output
        then leaves without waking the writer thread and waiting for it to get the GIL."""
        with self._cond:
            direct = not self._frames and not self._writing and not self._closing and self._deadline is None
            if direct:
                self._writing = True  # the writer thread waits meanwhile
        if direct:
            try:
                if self._connection.write_now(frame):
                    return
            except OSError:
                pass  # the writer's own write of it meets the error and reports it
            finally:
                with self._cond:
                    self._writing = False
                    if self._frames or self._closing:  # else the writer thread has nothing to wake for
                        self._cond.notify_all()
        self.send(frame)

    def close(self, last_frame: bytes | None = None) -> None:
        """Writes what is queued (and ``last_frame``), then closes the output."""
        with self._cond:
            if self._closing:
                return
            if last_frame is not None:
                self._frames.append(last_frame)
                self._queued += len(last_frame)
            self._closing = True
            self._cond.notify_all()

    def full(self) -> bool:
        """Whether data sent now would wait (``send``'s ``wait``)."""
        with self._cond:
            return self._queued >= OUTPUT_QUEUE_BYTES

    def fail_now(self, last_frame: bytes, deadline: float) -> None:
        """Drops what is queued (counted as unwritten), then writes ``last_frame`` by
        ``deadline`` after whatever write is under way, and closes the output."""
        with self._cond:
            if self._closing:
                return
            self._count_unwritten(list(self._frames), 0)
            self._frames.clear()
            self._frames.append(last_frame)
            self._queued = len(last_frame)
            self._closing = True
            self._deadline = deadline
            self._cond.notify()

    def drain_by(self, deadline: float) -> None:
        """Output not written by ``deadline`` (monotonic) is dropped; the earliest deadline wins."""
        with self._cond:
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
            self._cond.notify_all()

    def join(self) -> None:
        self._thread.join()

    def _current_deadline(self) -> float | None:
        return self._deadline

    def _run(self) -> None:
        while True:
            with self._cond:
                self._writing = False  # this thread's last write is done
                while (not self._frames and not self._closing) or self._writing:
                    self._cond.wait()
                frames: list[bytes | LinkMessage] = []
                size = 0
                while self._frames and (not frames or size + len(self._frames[0]) <= WRITE_CHUNK):
                    if frames and (isinstance(self._frames[0], LinkMessage) or isinstance(frames[0], LinkMessage)):
                        break  # a link message goes alone
                    frame = self._frames.popleft()
                    frames.append(frame)
                    size += len(frame)
                self._queued -= size
                self._writing = bool(frames)
                self._cond.notify_all()  # room for senders waiting on a full queue
                done = self._closing and not self._frames
            try:
                if frames:
                    self._connection.write(frames[0] if len(frames) == 1 else b"".join(frames), self._current_deadline)
            except WriteTimeout as exc:
                self._count_unwritten(frames, exc.written)
                done = True
            except OSError as exc:
                log.error("cannot write to Kapacitor (%s); stopping", exc)
                self.broken = exc
                self._connection.abort_read()
                done = True
            if done:
                with self._cond:
                    self._closing = True
                    if self._deadline is not None:
                        self._count_unwritten(list(self._frames), 0)
                    self._frames.clear()
                    self._queued = 0
                    self._cond.notify_all()
                try:
                    self._connection.close_write()
                except OSError:
                    pass
                return

    def _count_unwritten(self, frames: list[bytes | LinkMessage], written: int) -> None:
        # Frames wholly written before the deadline count as sent; the rest,
        # including one cut short, as dropped.
        for frame in frames:
            if written >= len(frame):
                written -= len(frame)
                continue
            self.unwritten_frames += 1
            self.unwritten_bytes += len(frame) - written
            written = 0
