"""The two byte pipes Kapacitor reaches an agent by: the process's stdio, or one unix socket connection.

Both are thin: all protocol logic lives in the session, the threads in the agent.
"""

from __future__ import annotations

import logging
import math
import os
import select
import socket
import stat
import time

from udf_agent.runtime.connection import ATOMIC_WRITE, Deadline, WriteTimeout
from udf_agent.runtime.stdio import PIPE_SIZE, claim_stdio_fds, size_pipe

log = logging.getLogger(__name__)




# How often a blocked write looks again at a deadline that may have been set meanwhile.
_POLL_SLICE = 0.05
# Once there is a deadline (input has ended), a peer that takes no output for this long has
# stopped reading (Kapacitor's task stop): what is left is dropped now, not at the deadline.
UNREAD_AFTER = 1.0


def _wait_writable(fd: int, deadline: Deadline, written: int) -> None:
    """Waits until ``fd`` takes more output; WriteTimeout once the deadline (read afresh)
    passes, or once there is one and the wait has lasted ``UNREAD_AFTER``."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    unread_by = time.monotonic() + UNREAD_AFTER
    while True:
        limit = deadline()
        timeout = _POLL_SLICE
        if limit is not None:
            limit = min(limit, unread_by)
            timeout = min(timeout, limit - time.monotonic())
            if timeout <= 0:
                raise WriteTimeout(written)
        if poller.poll(timeout * 1000):
            return


def no_deadline() -> None:
    return None


class FdConnection:
    """Kapacitor over a pair of file descriptors (the process's stdin/stdout).

    Reads can be interrupted (``abort_read``, e.g. on SIGTERM) and writes to a
    pipe never block past the writer's deadline: a peer that stops reading our
    output must not keep the process alive after its input ended.
    """

    def __init__(self, read_fd: int, write_fd: int):
        self._read_fd = read_fd
        self._write_fd = write_fd
        size_pipe(read_fd, PIPE_SIZE)
        size_pipe(write_fd, PIPE_SIZE)
        self._wake_read, self._wake_write = os.pipe()
        # Only pipes and sockets can block without end; a terminal's or a file's
        # open-file flags are shared with the shell and are left alone.
        self._bounded_writes = _pipe_or_socket(write_fd)
        if self._bounded_writes:
            os.set_blocking(write_fd, False)
        # Reads wait in poll (which an abort wakes), so the read itself need never block: a
        # read of what is ready (``read_ready_into``) is then one system call.
        self._nonblocking_reads = _pipe_or_socket(read_fd)
        if self._nonblocking_reads:
            os.set_blocking(read_fd, False)
        self._poller = select.poll()
        self._poller.register(read_fd, select.POLLIN)
        self._poller.register(self._wake_read, select.POLLIN)

    def read_into(self, buffer: memoryview) -> int:
        while True:
            ready = {fd for fd, _ in self._poller.poll()}
            if self._wake_read in ready:
                return 0
            if ready:
                try:
                    return os.readv(self._read_fd, [buffer])
                except BlockingIOError:  # a non-blocking fd: polled ready, read empty (spurious)
                    continue

    def read_ready_into(self, buffer: memoryview) -> int | None:
        if not self._nonblocking_reads:
            ready = {fd for fd, _ in self._poller.poll(0)}
            if self._read_fd not in ready or self._wake_read in ready:
                return None
        try:
            return os.readv(self._read_fd, [buffer])
        except OSError:  # BlockingIOError: nothing yet
            return None

    def input_waiting(self, within: float = 0.0) -> bool:
        return bool(self._poller.poll(math.ceil(within * 1000)))  # an abort counts: the next read returns at once

    def write(self, data: bytes | bytearray, deadline: Deadline = no_deadline) -> None:
        view = memoryview(data)
        total = len(view)
        while view:
            try:
                view = view[os.write(self._write_fd, view) :]
            except BlockingIOError:
                pass
            if view:
                _wait_writable(self._write_fd, deadline, total - len(view))

    def write_now(self, data: bytes) -> bool:
        if not self._bounded_writes or len(data) > ATOMIC_WRITE:
            return False
        try:
            written = os.write(self._write_fd, data)
        except BlockingIOError:
            return False
        if written < len(data):  # a socket as stdout may take part of it: the rest follows
            self.write(data[written:])
        return True

    def limit_unread_input(self, size: int) -> None:
        size_pipe(self._read_fd, size)

    def input_closed(self) -> bool:
        """Whether Kapacitor has closed our stdin (seen without reading: a pipe reports
        the hang-up while data is still buffered)."""
        return _hung_up(self._read_fd, select.POLLHUP)

    def close_write(self) -> None:
        os.close(self._write_fd)

    def abort_read(self) -> None:
        """Makes the pending and every later ``read`` return end of input."""
        try:
            os.write(self._wake_write, b"x")
        except OSError:
            pass


class SocketConnection:
    """Kapacitor over one accepted unix socket connection."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._input_poller = select.poll()
        self._input_poller.register(sock, select.POLLIN | select.POLLRDHUP | select.POLLHUP)

    def read_into(self, buffer: memoryview) -> int:
        return self.sock.recv_into(buffer)

    def read_ready_into(self, buffer: memoryview) -> int | None:
        try:
            return self.sock.recv_into(buffer, 0, socket.MSG_DONTWAIT)
        except OSError:
            return None

    def input_waiting(self, within: float = 0.0) -> bool:
        return bool(self._input_poller.poll(math.ceil(within * 1000)))

    def limit_unread_input(self, size: int) -> None:
        # A unix stream socket queues what the peer sends against the peer's send buffer,
        # which is not ours to size.
        pass

    def input_closed(self) -> bool:
        """Whether the peer has shut down its sending side (seen without reading)."""
        return _hung_up(self.sock.fileno(), select.POLLRDHUP | select.POLLHUP)

    def write(self, data: bytes | bytearray, deadline: Deadline = no_deadline) -> None:
        view = memoryview(data)
        total = len(view)
        while view:
            try:
                view = view[self.sock.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                pass
            if view:
                _wait_writable(self.sock.fileno(), deadline, total - len(view))

    def write_now(self, data: bytes) -> bool:
        if len(data) > ATOMIC_WRITE:
            return False
        try:
            written = self.sock.send(data, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if written < len(data):  # not seen with a unix socket: the rest follows
            SocketConnection.write(self, data[written:])
        return True

    def close_write(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def abort_read(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()


def _pipe_or_socket(fd: int) -> bool:
    """Whether ``fd`` is a pipe or a socket: the only files whose flags are ours to change (a
    terminal's or a file's open-file flags are shared with the shell)."""
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _hung_up(fd: int, events: int) -> bool:
    poller = select.poll()
    poller.register(fd, events)
    return any(revents & events for _, revents in poller.poll(0))


def claim_stdio() -> FdConnection:
    """Keeps the real stdin/stdout for the protocol and points fds 0 and 1 elsewhere.

    After this, a stray ``print`` (the UDF's, a library's, or a child
    process's such as Spark's JVM) lands on stderr and nothing but the
    protocol can reach Kapacitor's end of stdout.
    """
    return FdConnection(*claim_stdio_fds())
