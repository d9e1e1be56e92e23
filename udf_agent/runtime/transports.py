"""The two ways Kapacitor reaches an agent: the process's stdio, or a unix socket.

Both are thin loops around ``Agent``; all protocol logic lives in the session.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import select
import socket
import stat
import sys
import threading
import time
from collections.abc import Callable

from udf_agent.runtime.agent import Agent, Deadline, WriteTimeout
from udf_agent.wire.guard import error_frame

log = logging.getLogger(__name__)

_TRANSIENT_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


# Linux pipes hold 64 KiB by default: every read and write then moves only a few hundred
# points, and the per-call costs dominate. Bigger is not better either: a keepalive waits
# behind everything queued in the pipe (the agent sizes its input pipe for the UDF's pace).
PIPE_SIZE = 256 * 1024


def _size_pipe(fd: int, size: int) -> None:
    if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError as exc:  # over /proc/sys/fs/pipe-max-size, not permitted, or (shrinking) fuller than size: only slower
        log.debug("cannot size the pipe on fd %d to %d bytes: %s", fd, size, exc)


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


def _no_deadline() -> None:
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
        _size_pipe(read_fd, PIPE_SIZE)
        _size_pipe(write_fd, PIPE_SIZE)
        self._wake_read, self._wake_write = os.pipe()
        # Only pipes and sockets can block without end; a terminal's or a file's
        # open-file flags are shared with the shell and are left alone.
        mode = os.fstat(write_fd).st_mode
        self._bounded_writes = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)
        if self._bounded_writes:
            os.set_blocking(write_fd, False)
        self._poller = select.poll()
        self._poller.register(read_fd, select.POLLIN)
        self._poller.register(self._wake_read, select.POLLIN)

    def read(self, size: int) -> bytes:
        while True:
            ready = {fd for fd, _ in self._poller.poll()}
            if self._wake_read in ready:
                return b""
            if ready:
                return os.read(self._read_fd, size)

    def write(self, data: bytes, deadline: Deadline = _no_deadline) -> None:
        view = memoryview(data)
        total = len(view)
        while view:
            try:
                view = view[os.write(self._write_fd, view) :]
            except BlockingIOError:
                pass
            if view:
                _wait_writable(self._write_fd, deadline, total - len(view))

    def limit_unread_input(self, size: int) -> None:
        _size_pipe(self._read_fd, size)

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
        self._sock = sock

    def read(self, size: int) -> bytes:
        return self._sock.recv(size)

    def limit_unread_input(self, size: int) -> None:
        # A unix stream socket queues what the peer sends against the peer's send buffer,
        # which is not ours to size.
        pass

    def input_closed(self) -> bool:
        """Whether the peer has shut down its sending side (seen without reading)."""
        return _hung_up(self._sock.fileno(), select.POLLRDHUP | select.POLLHUP)

    def write(self, data: bytes, deadline: Deadline = _no_deadline) -> None:
        view = memoryview(data)
        total = len(view)
        while view:
            try:
                view = view[self._sock.send(view, socket.MSG_DONTWAIT) :]
            except BlockingIOError:
                pass
            if view:
                _wait_writable(self._sock.fileno(), deadline, total - len(view))

    def close_write(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def abort_read(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RD)
        except OSError:
            pass

    def close(self) -> None:
        self._sock.close()


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
    protocol_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return FdConnection(protocol_in, claim_stdout())


def claim_stdout() -> int:
    """Keeps the real stdout (returned, as a new fd) for this process's own output and
    points fd 1 and ``sys.stdout`` at stderr, so nothing else can write there."""
    ours = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return ours


class SocketServerError(Exception):
    """The socket path cannot be served (in use, not a socket, too long)."""


class UnixSocketServer:
    """Serves one independent agent session per connection, many at once."""

    def __init__(
        self,
        path: str,
        make_agent: Callable[[SocketConnection], Agent],
        mode: int = 0o660,
        drain_timeout: float = 5.0,
        max_connections: int = 64,
        init_timeout: float = 60.0,
    ):
        self.path = os.path.abspath(path)
        self.mode = mode
        self.drain_timeout = drain_timeout
        self.max_connections = max_connections
        self.init_timeout = init_timeout
        self._stop_reason: str | None = None
        self._make_agent = make_agent
        self._listener: socket.socket | None = None
        self._stopping = threading.Event()
        self._sessions: dict[threading.Thread, Agent] = {}
        self._lock = threading.Lock()

    def bind(self) -> None:
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH:
            raise SocketServerError(f"socket path is {len(os.fsencode(self.path))} bytes long; unix sockets allow {MAX_SOCKET_PATH}: {self.path}")
        self._remove_stale()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # Create the file with no access at all, then open it up to exactly `mode`:
        # there is no moment when it is world-writable.
        old_umask = os.umask(0o777)
        try:
            listener.bind(self.path)
        except OSError as exc:
            listener.close()
            raise SocketServerError(f"cannot bind {self.path}: {exc.strerror}") from None
        finally:
            os.umask(old_umask)
        os.chmod(self.path, self.mode)
        listener.listen(64)
        listener.settimeout(0.2)
        self._listener = listener
        log.info("listening on %s (mode %o)", self.path, self.mode)

    def serve_forever(self) -> None:
        assert self._listener is not None, "bind() first"
        try:
            while not self._stopping.is_set():
                try:
                    conn, _ = self._listener.accept()
                except TimeoutError:
                    continue
                except OSError as exc:
                    if self._stopping.is_set():
                        break
                    if exc.errno not in _TRANSIENT_ACCEPT_ERRORS:
                        raise
                    # Out of descriptors or memory for now: the connection stays
                    # queued and is accepted once open sessions free some.
                    log.warning("cannot accept a connection yet: %s", exc.strerror)
                    self._stopping.wait(0.1)
                    continue
                with self._lock:
                    open_sessions = len(self._sessions)
                if open_sessions >= self.max_connections:
                    self._refuse(conn, open_sessions)
                    continue
                conn.settimeout(None)
                thread = threading.Thread(target=self._serve_connection, args=(conn,), name="session", daemon=True)
                with self._lock:
                    self._sessions[thread] = None  # type: ignore[assignment]
                thread.start()
        finally:
            self._close()

    def shutdown(self, reason: str | None = None) -> None:
        """Stops accepting; open sessions finish what they accepted within the drain
        timeout, send ``reason`` (if given) as their ErrorResponse, then end."""
        self._stop_reason = reason
        self._stopping.set()

    def _refuse(self, conn: socket.socket, open_sessions: int) -> None:
        """Past --max-connections a connection gets an ErrorResponse saying so, and is closed."""
        log.warning("refused a connection: %d session(s) open, the --max-connections limit", open_sessions)
        conn.settimeout(1.0)
        try:
            conn.sendall(error_frame(f"udf-agent: too many connections ({open_sessions} open, --max-connections {self.max_connections}); try again later"))
        except OSError:
            pass  # the peer left already: nothing to tell it
        finally:
            conn.close()

    def _serve_connection(self, conn: socket.socket) -> None:
        connection = SocketConnection(conn)
        thread = threading.current_thread()
        watchdog: threading.Timer | None = None
        try:
            agent = self._make_agent(connection)
            with self._lock:
                self._sessions[thread] = agent
            if self._stopping.is_set():
                agent.stop_reading(self._stop_reason)
            watchdog = threading.Timer(self.init_timeout, self._require_init, args=(agent,))
            watchdog.daemon = True
            watchdog.start()
            code = agent.run()
            log.info("session ended (%s)", "ok" if code == 0 else "with an error")
        except Exception:
            log.exception("session failed")
        finally:
            if watchdog is not None:
                watchdog.cancel()
            connection.close()
            with self._lock:
                self._sessions.pop(thread, None)

    def _require_init(self, agent: Agent) -> None:
        """A connection that never sent Init holds threads for nothing: it is closed."""
        if not agent.initialized:
            log.warning("closing a connection that sent no Init within %g s (--init-timeout)", self.init_timeout)
            agent.stop_reading(f"udf-agent: no Init within {self.init_timeout:g} s of connecting (--init-timeout); closing the connection")

    def _close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            sessions = list(self._sessions.items())
        if sessions:
            log.info("stopping: finishing %d open session(s)", len(sessions))
        for _, agent in sessions:
            if agent is not None:
                agent.stop_reading(self._stop_reason)
        # Each session's writer gives up at its drain deadline; the margin covers the rest.
        deadline = time.monotonic() + self.drain_timeout + 1.0
        for thread, _ in sessions:
            thread.join(max(0.0, deadline - time.monotonic()))
        stuck = sum(thread.is_alive() for thread, _ in sessions)
        if stuck:
            log.warning("%d session(s) did not end within the drain timeout; exiting anyway", stuck)
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        log.info("stopped; removed %s", self.path)

    def _remove_stale(self) -> None:
        try:
            info = os.lstat(self.path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(info.st_mode):
            raise SocketServerError(f"{self.path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(self.path)
        except OSError as exc:
            if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise SocketServerError(f"cannot check {self.path}: {exc.strerror}") from None
            log.info("removing stale socket file %s", self.path)
            os.unlink(self.path)
        else:
            raise SocketServerError(f"another server is already listening on {self.path}")
        finally:
            probe.close()
