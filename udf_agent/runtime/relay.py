"""A task's process when its Spark is shared: Kapacitor's bytes to the shared server and back.

Imports neither pandas nor numpy (a relay holds ~20 MB) and never parses a request: the
server's agent speaks the protocol. Output is passed on in whole frames only (the server sends
them in chunks, ``relay_link``), so that if the server dies mid-write the task's last frame is
still a well-formed ErrorResponse that says so. What the server logs for the task comes along
and is logged on the task's stderr, in the task's own format: Kapacitor keeps it under the task.
"""

from __future__ import annotations

import logging
import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import NoReturn

from udf_agent.runtime.logs import TaskLabels, configure_logging, in_task, label_thread, log_forwarded
from udf_agent.runtime.pacing import ReadPacer
from udf_agent.runtime.relay_link import ChunkSplitter
from udf_agent.runtime.shared import ServerOptions, SharedServerError, Welcome, options_not_used, server_alive
from udf_agent.runtime.transports import claim_stdio_fds
from udf_agent.wire.frames import FrameSplitter

log = logging.getLogger(__name__)

CHUNK = 256 * 1024
# The field tag that starts an ErrorResponse's frame body (Response.error, field 6, bytes).
ERROR_TAG = (6 << 3) | 2
SERVER_END_GRACE = 0.5
# After Kapacitor closed our input, output it takes none of for this long is dropped: a task
# abort stops reading first (as the agent's own writer does at a stop).
STOPPED_READER_TIMEOUT = 1.0
WRITE_POLL = 0.1


def relay_stdio(join: Callable[[], Welcome], log_level: str, log_format: str, asked_of_server: ServerOptions) -> NoReturn:
    """The task's process as a relay: claims stdin and stdout, joins its server with
    ``join`` (saying what of ``asked_of_server`` that server, started earlier, does otherwise)
    and relays until the server closes the task's connection; exits."""
    read_fd, write_fd = claim_stdio_fds()
    configure_logging(log_level, log_format)
    # The relay's own lines name the task once the server's records have told its IDs.
    labels = TaskLabels()
    label_thread(labels)
    try:
        welcome = join()
    except SharedServerError as exc:
        from udf_agent.wire.guard import error_frame

        log.error("%s", exc)
        os.write(write_fd, error_frame(f"udf-agent: {exc}"))
        sys.stderr.flush()
        os._exit(1)
    log.info("computing on the shared Spark server (pid %d); its log: %s", welcome.pid, welcome.log)
    for notice in options_not_used(welcome, asked_of_server):
        log.warning("%s", notice)
    code = Relay(welcome, read_fd, write_fd, labels).run()
    sys.stderr.flush()
    os._exit(code)


class _OutputAbandoned(Exception):
    """Kapacitor closed the input and stopped reading the output: the task was aborted."""


class Relay:
    """Copies stdin to the server's socket, whole frames of its answers to stdout, and logs the
    task's records it sends."""

    def __init__(self, welcome: Welcome, read_fd: int, write_fd: int, labels: TaskLabels):
        self._welcome = welcome
        self._labels = labels
        self._sock = welcome.sock
        self._read_fd = read_fd
        self._write_fd = write_fd
        self._input_ended = threading.Event()
        self._chunks = ChunkSplitter()

    def run(self) -> int:
        """Relays until the server closes the connection; the exit code for the process."""
        os.set_blocking(self._write_fd, False)  # a write must notice an abort (see _write_all)
        threading.Thread(target=in_task(self._labels, self._forward_input), name="relay-input", daemon=True).start()
        self._on_stop_signals()
        try:
            while chunk := self._sock.recv(CHUNK):
                whole, log_records = self._chunks.feed(chunk)
                for record in log_records:  # first: Kapacitor may end the process once it reads an ErrorResponse
                    log_forwarded(record, self._labels)
                if whole:
                    self._write_all(whole)
        except ConnectionResetError:
            pass  # the server died with our input unread: judged below, as an end
        except BrokenPipeError:
            return 1  # Kapacitor no longer reads our output: nothing to tell it
        except _OutputAbandoned:
            log.warning("input closed and no output taken for %g s (a task abort): the rest of this task's output is dropped", STOPPED_READER_TIMEOUT)
            self._sock.close()
            return 0
        _, last_tag = FrameSplitter(max_frame_size=2**62).feed_whole(self._chunks.last_chunk)
        if last_tag == ERROR_TAG:
            return 1  # the task failed, and the server said why
        partial = self._chunks.buffered
        if self._input_ended.is_set() and not partial:
            if not server_alive(self._welcome):
                log.warning("the shared server (pid %d) ended while this task was stopping; its log: %s", self._welcome.pid, self._welcome.log)
            return 0
        cause = "was killed or crashed" if self._server_ended() else "closed this task's connection"
        message = f"udf-agent: the shared Spark server (pid {self._welcome.pid}) {cause} in the middle of the task; its log: {self._welcome.log}"
        log.error("%s", message)
        from udf_agent.wire.guard import error_frame  # protobuf, only when there is this to tell

        try:
            self._write_all(error_frame(message))
        except (BrokenPipeError, _OutputAbandoned):
            pass
        return 1

    def _write_all(self, data: bytes) -> None:
        """Writes all of DATA, waiting for Kapacitor to read as long as it may (backpressure);
        _OutputAbandoned once the input has ended and no byte is taken for a second."""
        view = memoryview(data)
        stalled_since: float | None = None
        while view:
            try:
                view = view[os.write(self._write_fd, view) :]
                stalled_since = None
                continue
            except BlockingIOError:
                pass
            select.select([], [self._write_fd], [], WRITE_POLL)
            if self._input_ended.is_set():
                now = time.monotonic()
                stalled_since = stalled_since or now
                if now - stalled_since >= STOPPED_READER_TIMEOUT:
                    raise _OutputAbandoned

    def _server_ended(self) -> bool:
        """Whether the server died: a killed process closes its sockets a moment before the
        kernel marks it dead, so a connection that ends abruptly is given a short grace."""
        deadline = time.monotonic() + SERVER_END_GRACE
        while server_alive(self._welcome):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _forward_input(self) -> None:
        pacer = ReadPacer()
        try:
            while data := os.read(self._read_fd, CHUNK):
                pause = pacer.after_read(len(data), time.monotonic())
                self._sock.sendall(data)
                if pause:
                    time.sleep(pause)  # input is flowing in small reads: let it gather
        except OSError as exc:  # the server is gone: the output side sees it and says so
            log.debug("relaying input stopped: %s", exc)
        self._end_input()

    def _end_input(self) -> None:
        """The server's agent sees end of input: it finishes accepted work, then closes."""
        self._input_ended.set()
        try:
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _on_stop_signals(self) -> None:
        """SIGTERM/SIGINT end the input as Kapacitor closing stdin would (an orderly drain);
        a second exits at once."""
        received: list[int] = []

        def handle(signum: int, frame: FrameType | None) -> None:
            if received:
                os._exit(128 + signum)
            received.append(signum)
            log.warning("%s received: the shared server finishes this task's accepted work (send it again to exit at once)", signal.Signals(signum).name)
            self._end_input()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, handle)
