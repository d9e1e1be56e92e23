"""Kapacitor's side of an agent, in this process: what ``udf_agent.testing`` and
``udf-agent replay`` share.

``ServedAgent`` runs an Agent on one end of a socketpair, on a thread of its own; the
other end is Kapacitor's. ``ResponseReader`` takes an agent's output off a socket or a
pipe as fast as it is written, on a thread of its own, and decodes its Response frames:
an agent drops output its peer leaves unread for a second after input ends (a task stop).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from udf_agent import udf_pb2
from udf_agent.wire.frames import FrameDecoder

if TYPE_CHECKING:
    from udf_agent.api import UDFSpec
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines

_READ_SIZE = 1 << 20


class ServedAgent:
    """An ``Agent`` served on one end of a socketpair, in this process; ``sock`` is the other end.

    The agent's end is closed once ``run`` returns, so whoever reads ``sock`` sees the output end.
    """

    def __init__(self, spec: UDFSpec | None, engines: Engines, config: AgentConfig | None = None, name: str | None = None):
        # Imported on use: tests that drive an agent process (KapacitorDriver) never need the runtime.
        from udf_agent.runtime.agent import Agent
        from udf_agent.runtime.transports import SocketConnection

        self.sock, theirs = socket.socketpair()
        self.connection = SocketConnection(theirs)
        self.agent = Agent(spec, self.connection, engines, config)
        self.exit_code: int | None = None
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self.exit_code = self.agent.run()
        finally:
            self.connection.close()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)


class ResponseReader:
    """Reads an agent's output on a thread of its own and hands each chunk read, with the
    Responses it completes, to ``keep``.

    ``keep`` runs holding ``arrived``, which is notified after it and once more when the
    output has ended; ``closed`` is set by then, and ``error`` holds what ended reading,
    if it was not the end of the output.
    """

    def __init__(self, stream: socket.socket | IO[bytes], keep: Callable[[bytes, list[udf_pb2.Response]], None], name: str | None = None):
        self._stream = stream
        self._keep = keep
        self._decoder = FrameDecoder(udf_pb2.Response)
        self.arrived = threading.Condition()
        self.closed = threading.Event()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Leaves the output unread from the next chunk on, as Kapacitor does when it aborts a task."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _read(self) -> bytes:
        if isinstance(self._stream, socket.socket):
            return self._stream.recv(_READ_SIZE)
        # os.read returns what the pipe holds; a file object's read would wait for the whole size.
        return os.read(self._stream.fileno(), _READ_SIZE)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                data = self._read()
                if not data:
                    break
                responses = self._decoder.feed(data)
                with self.arrived:
                    self._keep(data, responses)
                    self.arrived.notify_all()
        except BaseException as exc:  # the reader's owner decides what it means
            self.error = exc
        finally:
            self.closed.set()
            with self.arrived:
                self.arrived.notify_all()
