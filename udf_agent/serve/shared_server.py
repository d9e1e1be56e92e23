"""``udf-agent shared-server``: the server's side of the shared Spark server (``shared.py`` is
the relay's). Its socket server takes tasks of any target: each connection starts with the
relay's handshake, which names the target and the task's own options (see ``shared.py``,
"Handshake"), and is then a task's agent whose output and log records go to its relay
(``relay_link``) and which is checkpointed for a carry-over (``failover``)."""

from __future__ import annotations

import json
import logging
import os
from typing import TYPE_CHECKING

from udf_agent.logs import TaskLogRoutes
from udf_agent.runtime.agent import Agent
from udf_agent.runtime.config import AgentConfig
from udf_agent.serve.relay_link import RelayedConnection
from udf_agent.serve.shared import answer_line, read_line
from udf_agent.serve.socket_server import SessionRefused, UnixSocketServer
from udf_agent.targets import TargetError, resolve_fresh

if TYPE_CHECKING:
    from udf_agent.runtime.engines import Engines
    from udf_agent.runtime.transports import SocketConnection


def shared_socket_server(socket_path: str, engines: Engines, idle_exit: float, max_connections: int) -> tuple[UnixSocketServer, SharedSessions]:
    """The shared server's socket server (mode 0600; it stops after ``idle_exit`` with no task)
    and its sessions, not yet bound. From now on the records a task's threads log go to its
    relay as well as to the server's log."""
    log_routes = TaskLogRoutes()
    logging.getLogger().addHandler(log_routes)
    sessions = SharedSessions(engines, os.path.splitext(os.path.abspath(socket_path))[0] + ".log", log_routes, idle_exit)
    server = UnixSocketServer(
        socket_path,
        sessions,
        mode=0o600,
        max_connections=max_connections,
        idle_exit=idle_exit,
        describe=lambda: {"kind": "shared-server", **engines.describe()},
    )
    return server, sessions


class SharedSessions:
    """The shared server's sessions: each connection names its target and options first."""

    def __init__(self, engines: Engines, log_path: str, log_routes: TaskLogRoutes, idle_exit: float):
        self._engines = engines
        self._log_path = log_path
        self._log_routes = log_routes
        self._idle_exit = idle_exit
        # (--metrics-address, the URL it is served at), once it is; before the first task connects.
        self.metrics: tuple[str, str] | None = None

    def __call__(self, connection: SocketConnection) -> Agent:
        line = read_line(connection.sock.recv)
        if line is None:
            raise SessionRefused("the connection closed before its handshake")
        try:
            hello = json.loads(line)
            # A module of the user's changed on disk since is imported afresh, so a task
            # redefined after an edit runs the new code (tasks already running keep theirs).
            spec = resolve_fresh(str(hello["target"]), [str(arg) for arg in hello.get("script_args", [])])
            config = AgentConfig.from_options(dict(hello["agent"]))
        except (TargetError, ValueError, KeyError, TypeError) as exc:
            message = str(exc) if isinstance(exc, TargetError) else f"not a task's handshake: {exc!r}"
            connection.write(answer_line({"error": message}))
            raise SessionRefused(message) from None
        metrics_address, metrics_url = self.metrics or (None, None)
        # How the task that started this server set it up: the relay tells a task that asked otherwise.
        connection.write(answer_line({"pid": os.getpid(), "log": self._log_path, "metrics_address": metrics_address, "metrics_url": metrics_url, "idle_exit": self._idle_exit}))
        link = RelayedConnection(connection.sock)
        agent = Agent(spec, link, self._engines, config, checkpoints=link)
        link.forward_logs(self._log_routes, agent.labels, agent.writer)
        return agent
