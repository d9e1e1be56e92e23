"""``udf-agent check``: is a socket UDF alive? Info, then a keepalive, as Kapacitor sends them.

For systemd, a Kubernetes readiness probe or a person debugging: ``probe_socket`` returns
what answered and how fast, or raises ProbeError with one line saying why not.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass

from udf_agent import udf_pb2
from udf_agent.wire.frames import FrameDecoder, ProtocolError, encode_frame

_KIND = {udf_pb2.STREAM: "stream", udf_pb2.BATCH: "batch"}


class ProbeError(Exception):
    """The socket UDF is not healthy; the message says why, in one line."""


@dataclass
class Health:
    wants: str
    provides: str
    info_ms: float
    keepalive_ms: float

    def __str__(self) -> str:
        return f"{self.wants} -> {self.provides}; Info answered in {self.info_ms:.1f} ms, a keepalive in {self.keepalive_ms:.1f} ms"


def probe_socket(path: str, timeout: float) -> Health:
    """Connects to ``path``, asks Info and sends a keepalive; the whole exchange within ``timeout``."""
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except FileNotFoundError:
            raise ProbeError("no socket at this path (is `udf-agent serve` running?)") from None
        except ConnectionRefusedError:
            raise ProbeError("connection refused: nothing listens on this socket (a server that has stopped?)") from None
        except OSError as exc:
            raise ProbeError(f"cannot connect: {exc.strerror or exc}") from None
        exchange = _Exchange(sock, deadline)
        started = time.monotonic()
        info = exchange.ask(udf_pb2.Request(info=udf_pb2.InfoRequest()), "info").info
        info_ms = (time.monotonic() - started) * 1000
        stamp = time.time_ns()
        started = time.monotonic()
        answer = exchange.ask(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=stamp)), "keepalive")
        keepalive_ms = (time.monotonic() - started) * 1000
        if answer.keepalive.time != stamp:
            raise ProbeError(f"the keepalive was answered with time {answer.keepalive.time}, not {stamp}")
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
    return Health(_KIND.get(info.wants, str(info.wants)), _KIND.get(info.provides, str(info.provides)), info_ms, keepalive_ms)


class _Exchange:
    def __init__(self, sock: socket.socket, deadline: float):
        self._sock = sock
        self._deadline = deadline
        self._decoder = FrameDecoder(udf_pb2.Response)
        self._pending: list[udf_pb2.Response] = []

    def ask(self, request: udf_pb2.Request, kind: str) -> udf_pb2.Response:
        try:
            self._sock.sendall(encode_frame(request))
        except OSError as exc:
            raise ProbeError(f"cannot send the {kind} request: {exc.strerror or exc}") from None
        while True:
            for response in self._pending:
                which = response.WhichOneof("message")
                if which == "error":
                    raise ProbeError(f"the UDF answered with an error: {response.error.error}")
                if which == kind and (kind != "keepalive" or response.keepalive.time == request.keepalive.time):
                    self._pending.remove(response)
                    return response
            self._pending.clear()  # heartbeats and the like
            remaining = self._deadline - time.monotonic()
            if remaining <= 0:
                raise ProbeError(f"no {kind} answer within the timeout")
            self._sock.settimeout(remaining)
            try:
                data = self._sock.recv(65536)
            except TimeoutError:
                raise ProbeError(f"no {kind} answer within the timeout") from None
            except OSError as exc:
                raise ProbeError(f"reading the {kind} answer failed: {exc.strerror or exc}") from None
            if not data:
                raise ProbeError(f"the server closed the connection before answering {kind}")
            try:
                self._pending = self._decoder.feed(data)
            except ProtocolError as exc:
                raise ProbeError(f"the answer is not Kapacitor's protocol: {exc}") from None
