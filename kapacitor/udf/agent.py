"""Kapacitor's Python UDF agent API (``Agent``, ``Handler``, ``Server``), run by udf-agent.

A script written for Kapacitor's own agent runs unmodified:

- ``python -u script.py`` (Kapacitor's ``prog``/``args``): ``Agent.start()`` turns the process
  into ``udf-agent run script.py -- ARGS`` (the same pid, the same stdin and stdout). Options
  for udf-agent may be given in ``UDF_AGENT_RUN_OPTIONS`` (e.g. ``--log-format json``).
- A socket script (``Server(path, accepter).serve()``) listens on its socket; each connection
  is served by a ``udf-agent run`` of the script on that connection.

Either way the script's ``__main__`` block runs again where the task computes (a resident
Spark worker of the host's shared server), in capture mode: there ``Agent.start()`` hands its
handler to udf-agent, which feeds it each request in order and sends what it writes
(``udf_agent.compute.handlers``). See docs/migrating.md.
"""

from __future__ import annotations

import logging
import os
import shlex
import socket
import struct
import subprocess
import sys
import threading
from typing import Any

logger = logging.getLogger()

# Run-time options for the udf-agent a script becomes, as on its command line.
RUN_OPTIONS_ENV = "UDF_AGENT_RUN_OPTIONS"


class Handler:
    """The methods udf-agent calls, one request at a time, in order (as Kapacitor's agent
    does). Write points and batches with ``self._agent.write_response(response)``; return
    the responses of ``info``, ``init``, ``snapshot`` and ``restore``."""

    def info(self) -> Any:
        pass

    def init(self, init_req: Any) -> Any:
        pass

    def snapshot(self) -> Any:
        pass

    def restore(self, restore_req: Any) -> Any:
        pass

    def begin_batch(self, begin_req: Any) -> Any:
        pass

    def point(self, point_req: Any) -> Any:
        pass

    def end_batch(self, end_req: Any) -> Any:
        pass


class Agent:
    """``Agent()`` serves stdin/stdout, ``Agent(conn, conn)`` a connection; ``handler`` is
    set before ``start()``."""

    def __init__(self, _in: Any = None, out: Any = None, handler: Handler | None = None):
        # Nothing is bound to stdin or stdout here: a default means "the process's own".
        self._in = _in
        self._out = out
        self.handler = handler
        self._sink: Any = None
        self._child: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        from udf_agent.compute.handlers import HandlerCaptured, capturing

        if capturing():
            raise HandlerCaptured(self)
        script, args = _running_script()
        if _is_stdio(self._in, 0) and _is_stdio(self._out, 1):
            sys.stdout.flush()
            sys.stderr.flush()
            command = _run_command(script, args)
            os.execv(command[0], command)
        in_fd, out_fd = _fd_of(self._in), _fd_of(self._out)
        self._child = subprocess.Popen(_run_command(script, args), stdin=in_fd, stdout=out_fd, close_fds=True)

    def wait(self) -> None:
        """Until the task ends (its connection closed); then the connection is closed."""
        if self._child is not None:
            self._child.wait()
        for stream in (self._in, self._out):
            close = getattr(stream, "close", None)
            if close is not None:
                close()

    def write_response(self, response: Any, flush: bool = False) -> None:
        """Sends ``response`` to Kapacitor, after the ones written before it (thread safe)."""
        if response is None:
            raise Exception("cannot write None response")
        if self._sink is None:
            raise RuntimeError("write_response: this Agent is not serving a task (udf-agent calls the handler where the task computes)")
        self._sink.write(response)

    def _hosted_by(self, sink: Any) -> None:
        """udf-agent's host of this agent's handler takes what it writes: from now on
        ``write_response`` is the host's own, a call less for every response."""
        self._sink = sink
        self.write_response = sink.write  # type: ignore[method-assign]


class EOF(Exception):
    """The end of a stream was reached."""


def encodeUvarint(writer: Any, value: int) -> Any:
    """Writes ``value`` as an unsigned varint to ``writer``."""
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return writer.write(bytes(out))


def decodeUvarint32(reader: Any) -> int:
    """Reads an unsigned varint of at most 32 bits from ``reader``; EOF at its end."""
    result, shift = 0, 0
    while True:
        byte = reader.read(1)
        if len(byte) == 0:
            raise EOF
        value: int = struct.unpack("B", byte)[0]
        result |= (value & 0x7F) << shift
        if not value & 0x80:
            return result & 0xFFFFFFFF
        shift += 7
        if shift >= 32:
            raise Exception("too many bytes when decoding varint, larger than 32bit uint")


class Server:
    """Listens on ``socket_path``; ``accepter.accept(conn, addr)`` is called, in a thread of
    its own, for each connection."""

    def __init__(self, socket_path: str, accepter: Any):
        from udf_agent.compute.handlers import capturing

        self._socket_path = socket_path
        self._accepter = accepter
        self._listener: socket.socket | None = None
        if not capturing():
            self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._listener.bind(socket_path)

    def serve(self) -> None:
        from udf_agent.compute.handlers import capturing

        if capturing():
            # Where a task computes: the accepter builds this connection's agent and handler.
            self._accepter.accept(_Connection(None), None)
            return
        assert self._listener is not None
        self._listener.listen(5)
        try:
            while True:
                sock, addr = self._listener.accept()
                threading.Thread(target=self._accepter.accept, args=(_Connection(sock), addr)).start()
        except BaseException:
            self.stop()

    def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        try:
            os.remove(self._socket_path)
        except OSError:
            pass


class _Connection:
    """A connection as the accepter gets it: a binary file (read, write, flush, close) that
    also gives its socket's fd, which the connection's udf-agent serves."""

    def __init__(self, sock: socket.socket | None):
        self._sock = sock
        self._file = sock.makefile("rwb") if sock is not None else None

    def fileno(self) -> int:
        if self._sock is None:
            raise OSError("udf-agent serves this connection")
        return self._sock.fileno()

    def read(self, size: int = -1) -> bytes:
        return self._file.read(size) if self._file is not None else b""

    def write(self, data: bytes) -> int:
        if self._file is None:
            raise OSError("udf-agent serves this connection")
        return self._file.write(data)

    def flush(self) -> None:
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        if self._sock is not None:
            self._sock.close()


def _running_script() -> tuple[str, list[str]]:
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not path:
        raise RuntimeError("Agent.start(): udf-agent runs the script this process was started with (python script.py), and this process has none")
    return os.path.abspath(path), sys.argv[1:]


def _run_command(script: str, args: list[str]) -> list[str]:
    options = shlex.split(os.environ.get(RUN_OPTIONS_ENV, ""))
    return [sys.executable, "-m", "udf_agent", "run", *options, script, "--", *args]


def _is_stdio(stream: Any, fd: int) -> bool:
    if stream is None:
        return True
    try:
        return bool(stream.fileno() == fd)
    except (AttributeError, OSError, ValueError):
        return False


def _fd_of(stream: Any) -> int:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):
        raise RuntimeError("Agent(_in, out): udf-agent serves a task over a file descriptor; give streams that have fileno() (a socket's file, a pipe)") from None
