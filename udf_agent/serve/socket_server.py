"""``udf-agent serve``: one independent agent per unix socket connection, many at once."""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

from udf_agent.logs import in_task, label_thread
from udf_agent.runtime.agent import Agent
from udf_agent.runtime.transports import SocketConnection
from udf_agent.wire.guard import error_frame

log = logging.getLogger(__name__)

_TRANSIENT_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED}

# sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107

# What ``udf-agent status`` sends instead of Kapacitor's bytes (or a relay's handshake): no
# Kapacitor frame starts so (its first is an Info request, a few bytes long). The answer is the
# server's status as one JSON document, then the connection closes.
STATUS_REQUEST = b"UDF-AGENT STATUS\n"
# A status client writes its request as it connects; a connection silent this long is a session's.
STATUS_WAIT = 1.0


class SocketServerError(Exception):
    """The socket path cannot be served (in use, not a socket, too long)."""


class SessionRefused(Exception):
    """``make_agent`` turned a connection away (and told the peer why): no session."""


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
        idle_exit: float | None = None,
        describe: Callable[[], dict[str, Any]] | None = None,
    ):
        self.path = os.path.abspath(path)
        self.mode = mode
        self.drain_timeout = drain_timeout
        self.max_connections = max_connections
        self.init_timeout = init_timeout
        # With no session open for this long the server stops by itself (the shared server).
        self.idle_exit = idle_exit
        self._idle_since = time.monotonic()
        self._stop_reason: str | None = None
        self._make_agent = make_agent
        self._describe = describe  # the process's own part of the status (its Spark)
        self._started_wall = time.time()
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
        self._listener = listener
        log.info("listening on %s (mode %o)", self.path, self.mode)

    def serve_forever(self) -> None:
        assert self._listener is not None, "bind() first"
        try:
            while not self._stopping.is_set():
                # The timeout only paces the idle-exit check: shutdown() wakes the accept itself.
                until_exit = self._until_idle_exit()
                if until_exit is not None and until_exit <= 0:
                    log.info("no task for %g s (--idle-exit): stopping", self.idle_exit)
                    break
                self._listener.settimeout(until_exit)
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
                if self._stopping.is_set():
                    conn.close()  # shutdown()'s wake-up call, or a peer just too late
                    break
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

    def _until_idle_exit(self) -> float | None:
        """Seconds until the server will have been idle for ``idle_exit`` (None: it never
        exits by itself; 0 or less: it is due). An idle server wakes then, not every second;
        with a task open now, that is ``idle_exit`` from now at the soonest."""
        if self.idle_exit is None:
            return None
        with self._lock:
            if self._sessions:
                return self.idle_exit
            return self._idle_since + self.idle_exit - time.monotonic()

    def shutdown(self, reason: str | None = None) -> None:
        """Stops accepting; open sessions finish what they accepted within the drain
        timeout, send ``reason`` (if given) as their ErrorResponse, then end."""
        self._stop_reason = reason
        self._stopping.set()
        self._wake_accept()

    def _wake_accept(self) -> None:
        """Connects to the listener, so an accept under way returns now (a signal handler's
        call included: the kernel queues the connection, nothing waits for the accept)."""
        waker = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waker.setblocking(False)
        try:
            waker.connect(self.path)
        except OSError:
            pass  # not listening (yet, or any more), or the backlog is full: the accept returns anyway
        finally:
            waker.close()

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

    def agents(self) -> list[Agent]:
        """The agents of the open sessions."""
        with self._lock:
            return [agent for agent in self._sessions.values() if agent is not None]

    def status(self) -> dict[str, Any]:
        """The server and its live tasks, as ``udf-agent status`` shows them."""
        return {
            "pid": os.getpid(),
            "socket": self.path,
            "started": self._started_wall,
            "uptime_s": round(time.time() - self._started_wall, 3),
            **(self._describe() if self._describe is not None else {}),
            "tasks": [agent.status() for agent in self.agents()],
        }

    def _serve_connection(self, conn: socket.socket) -> None:
        thread = threading.current_thread()
        if _status_requested(conn, STATUS_WAIT):
            self._answer_status(conn, thread)
            return
        connection = SocketConnection(conn)
        watchdog: threading.Timer | None = None
        try:
            agent = self._make_agent(connection)
            label_thread(agent.labels)  # "session ended" names its task
            with self._lock:
                self._sessions[thread] = agent
            if self._stopping.is_set():
                agent.stop_reading(self._stop_reason)
            watchdog = threading.Timer(self.init_timeout, in_task(agent.labels, self._require_init), args=(agent,))
            watchdog.daemon = True
            watchdog.start()
            code = agent.run()
            log.info("session ended (%s)", "ok" if code == 0 else "with an error")
        except SessionRefused as exc:
            log.warning("refused a connection: %s", exc)
        except Exception:
            log.exception("session failed")
        finally:
            if watchdog is not None:
                watchdog.cancel()
            connection.close()
            with self._lock:
                self._sessions.pop(thread, None)
                self._idle_since = time.monotonic()

    def _answer_status(self, conn: socket.socket, thread: threading.Thread) -> None:
        """Answers a status request; it is no task (the server's idle time goes on)."""
        try:
            conn.settimeout(5.0)
            conn.recv(len(STATUS_REQUEST))
            conn.sendall(json.dumps(self.status()).encode() + b"\n")
        except OSError as exc:
            log.warning("a status request went unanswered: %s", exc)
        finally:
            conn.close()
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


def _status_requested(conn: socket.socket, timeout: float) -> bool:
    """Whether the connection's first bytes are ``STATUS_REQUEST`` (peeked: a session reads
    them as they came). Kapacitor's first byte already differs."""
    deadline = time.monotonic() + timeout
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            conn.settimeout(remaining)
            seen = conn.recv(len(STATUS_REQUEST), socket.MSG_PEEK)
            if not seen or not STATUS_REQUEST.startswith(seen):
                return False
            if len(seen) == len(STATUS_REQUEST):
                return True
            time.sleep(0.005)  # the rest of the request is on its way
    except OSError:
        return False  # the session meets the same fault and handles it
    finally:
        conn.settimeout(None)
