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
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from udf_agent.runtime.logs import TaskLabels, configure_logging, in_task, label_thread, log_forwarded
from udf_agent.runtime.pacing import ReadPacer
from udf_agent.runtime.stop_signals import on_stop_signals
from udf_agent.runtime.transports import claim_stdio_fds
from udf_agent.serve.failover import CarryOver, CarryOverError
from udf_agent.serve.relay_link import ChunkSplitter, LinkError
from udf_agent.serve.relay_output import STOPPED_READER_TIMEOUT, KapacitorOutput, OutputAbandoned
from udf_agent.serve.shared import Launch, ServerOptions, ServerStart, SharedServerError, Welcome, locate, options_not_used, remember_launch, server_alive
from udf_agent.wire.frames import FrameSplitter, encode_varint

log = logging.getLogger(__name__)

# The most of the server's output one receive takes, into a buffer kept for it: a receive of
# a new 256 KiB each time cost 16 µs more (an allocation that size, then shrunk) a chunk.
CHUNK = 256 * 1024
# Input waiting for the server, between Kapacitor's writes and the server's reads: a
# KeepaliveRequest waits behind all of it, and while the server's reader waits for compute to
# make room, it waits as long. A read of stdin at most INPUT_CHUNK, and a socket send buffer
# of SERVER_SEND_BUFFER, keep it small (flat out: keepalive p99 51 -> 25 ms, the rate alike);
# Kapacitor's writes then wait in its pipe, as they would for a UDF of its own.
INPUT_CHUNK = 64 * 1024
SERVER_SEND_BUFFER = 32 * 1024
# The relay's pause between small reads while input flows (the agent's reader pauses
# PAUSE, 1 ms): twice the points a read and half the wake-ups, here and in the server's
# reader that takes what the relay sends; a keepalive waits at most 1 ms longer.
RELAY_READ_PAUSE = 0.002
# Input kept since the last checkpoint before reading waits for the next one: four times what
# makes a checkpoint due (``checkpoints.CHECKPOINT_INPUT_BYTES``), so that only a checkpoint
# slow to come holds the input, and the relay's footprint stays bounded whatever the stream.
MAX_KEPT_INPUT = 64 * 1024 * 1024
# Carry-overs of one task before a dying server fails it as it did before carry-overs.
MAX_CARRY_OVERS = 5
# The field tag that starts an ErrorResponse's frame body (Response.error, field 6, bytes).
ERROR_TAG = (6 << 3) | 2
SERVER_END_GRACE = 0.5


def relay_launch(target: str, agent_options: dict[str, Any], start: ServerStart, log_level: str, log_format: str, asked_of_server: ServerOptions, argv: list[str] | None, script_args: tuple[str, ...] = ()) -> NoReturn:
    """The task as a relay to the shared Spark server for ``start``'s settings (started if none
    is up), which it asks to run ``target`` with ``agent_options``; exits. The launch is
    remembered for the next task started with ``argv``, the raw command line (see entry.py)."""
    hello = {"target": target, "agent": agent_options, **({"script_args": list(script_args)} if script_args else {})}

    def join_server() -> Welcome:
        server = locate(start.settings)
        welcome = start.join(server, hello)
        if argv is not None:
            remember_launch(argv, Launch(server, hello, log_level, log_format, asked_of_server, start))
        return welcome

    relay_stdio(join_server, log_level, log_format, asked_of_server, rejoin=lambda: start.join(locate(start.settings), hello))


def relay_stdio(join: Callable[[], Welcome], log_level: str, log_format: str, asked_of_server: ServerOptions, rejoin: Callable[[], Welcome] | None = None) -> NoReturn:
    """The task's process as a relay: claims stdin and stdout, joins its server with
    ``join`` (saying what of ``asked_of_server`` that server, started earlier, does otherwise)
    and relays until the server closes the task's connection, carrying the task over to a new
    server with ``rejoin`` if it dies; exits. It reads and keeps Kapacitor's input, answering
    its keepalives, from the first moment: joining (a server to start, Spark's JVM behind it)
    takes as long as it takes."""
    read_fd, write_fd = claim_stdio_fds()
    configure_logging(log_level, log_format)
    # The relay's own lines name the task once the server's records have told its IDs.
    labels = TaskLabels()
    label_thread(labels)
    relay = Relay(read_fd, write_fd, labels, rejoin)
    try:
        welcome = join()
    except SharedServerError as exc:
        code = relay.fail(f"udf-agent: {exc}")
    else:
        log.info("computing on the shared Spark server (pid %d); its log: %s", welcome.pid, welcome.log)
        for notice in options_not_used(welcome, asked_of_server):
            log.warning("%s", notice)
        code = relay.run(welcome)
    sys.stderr.flush()
    os._exit(code)


class Relay:
    """Copies stdin to the server's socket, whole frames of its answers to stdout, and logs the
    task's records it sends; keeps what it needs to carry the task over to a new server if
    this one dies (``failover``), and does so when given how to ``rejoin``."""

    def __init__(self, read_fd: int, write_fd: int, labels: TaskLabels, rejoin: Callable[[], Welcome] | None = None):
        self._labels = labels
        self._read_fd = read_fd
        self._rejoin = rejoin
        self._input_ended = threading.Event()
        self._output = KapacitorOutput(write_fd, self._input_ended)
        self._output.open()
        # Guards the carry-over's kept input and whether input goes to a server now.
        self._lock = threading.Condition()
        self._carry = CarryOver()
        # Until a server takes the input (the first, or a new one), the relay keeps it and
        # answers the keepalives in it; the server gets it all once joined.
        self._carrying_over = True
        self._keepalives_scanned = 0  # of the kept input, while no server takes it
        self._sock: socket.socket | None = None
        self._chunks = ChunkSplitter()
        self.carry_overs = 0
        self._carry_started = 0.0  # when the last carry-over began
        threading.Thread(target=in_task(self._labels, self._forward_input), name="relay-input", daemon=True).start()
        # SIGTERM ends the input as Kapacitor closing stdin would.
        on_stop_signals(lambda reason: self._end_input(), "the shared server finishes this task's accepted work")

    def run(self, welcome: Welcome) -> int:
        """Gives ``welcome``'s server the task's input so far, then relays until the server
        closes the connection; the exit code for the process."""
        server: Welcome | int = welcome
        while not isinstance(server, int):
            self._hand_over(server)
            code = self._relay_output(server)
            server = code if code is not None else self._carry_over(server)
        return server

    def _relay_output(self, server: Welcome) -> int | None:
        """Relays the server's output until its connection ends: the exit code, or None when
        the server died in the middle of the task and the task is to be carried over."""
        received = bytearray(CHUNK)
        chunk = memoryview(received)
        try:
            while size := server.sock.recv_into(received):
                self._take(chunk[:size])
        except ConnectionResetError:
            pass  # the server died with our input unread: judged below, as an end
        except BrokenPipeError:
            return 1  # Kapacitor no longer reads our output: nothing to tell it
        except OutputAbandoned:
            log.warning("input closed and no output taken for %g s (a task abort): the rest of this task's output is dropped", STOPPED_READER_TIMEOUT)
            server.sock.close()
            return 0
        except CarryOverError as exc:
            return self.fail(f"udf-agent: this task could not be carried over to a new shared Spark server: {exc}")
        except LinkError as exc:
            return self.fail(f"udf-agent: the shared Spark server (pid {server.pid}) sent what this task's process cannot read ({exc}); its log: {server.log}")
        _, last_tag = FrameSplitter(max_frame_size=2**62).feed_whole(self._chunks.last_chunk)
        if last_tag == ERROR_TAG:
            return 1  # the task failed, and the server said why
        partial = self._chunks.buffered
        finished = self._input_ended.is_set() and not partial and not self._carry.catching_up
        if finished and server_alive(server):
            return 0  # the session's orderly end
        died = self._server_ended(server)
        if died and self._rejoin is not None and self.carry_overs < MAX_CARRY_OVERS:
            # Even a task that was stopping: its drain may have been cut short, and a new
            # server recomputing what Kapacitor already has sends it nothing twice.
            return None
        if finished:
            log.warning("the shared server (pid %d) ended while this task was stopping; its log: %s", server.pid, server.log)
            return 0
        cause = "was killed or crashed" if died else "closed this task's connection"
        return self.fail(f"udf-agent: the shared Spark server (pid {server.pid}) {cause} in the middle of the task; its log: {server.log}")

    def _take(self, chunk: bytes | memoryview) -> None:
        """What the server sent, in order: log records to stderr, output to Kapacitor (less
        what it saw already, while catching up after a carry-over), checkpoints kept."""
        while True:
            frames, counted, records, checkpoint = self._chunks.feed(chunk)
            chunk = b""
            for record in records:  # first: Kapacitor may end the process once it reads an ErrorResponse
                log_forwarded(record, self._labels)
            if frames:
                out = self._carry.passed(frames, counted)
                if out:
                    self._output.write(out)
                if not self._carry.catching_up:
                    self._output.heartbeat("carry-over", False)
            if checkpoint is None:
                return
            with self._lock:
                self._carry.checkpointed(checkpoint)
                self._lock.notify_all()  # an input held for room goes on

    def _carry_over(self, dead: Welcome) -> Welcome | int:
        """Joins a new server in place of ``dead`` (starting it, or waiting for the relay that
        does), to be given the task back (``_hand_over``). Until it catches up the relay
        answers Kapacitor's watchdog itself. The new server, or the exit code if none."""
        self.carry_overs += 1
        self._carry_started = time.monotonic()
        with self._lock:
            self._carrying_over = True
            kept = self._carry.kept_input
            self._keepalives_scanned = 0
            self._answer_keepalives()
        self._output.heartbeat("carry-over", True)
        log.warning(
            "the shared Spark server (pid %d) died in the middle of the task: carrying the task over to a new one (its last checkpoint and %d bytes of input since)", dead.pid, kept
        )
        assert self._rejoin is not None
        try:
            return self._rejoin()
        except SharedServerError as exc:
            return self.fail(f"udf-agent: the shared Spark server (pid {dead.pid}) died and no new one could be joined: {exc}")

    def _hand_over(self, welcome: Welcome) -> None:
        """``welcome``'s server takes the task: it gets the last checkpoint and the input kept
        since (everything, before the first checkpoint), then the input goes straight to it."""
        self._sock, self._chunks = _input_link(welcome), ChunkSplitter()
        snapshot = self._carry.snapshot
        restore = b"" if snapshot is None else _restore_frame(snapshot)
        with self._lock:
            replay = self._carry.replay(restore)
            mark = self._carry.kept_input
        try:
            self._sock.sendall(replay)
            while True:  # input that came meanwhile, then the input goes straight on
                with self._lock:
                    more = self._carry.since(mark)
                    if not more:
                        self._carrying_over = False
                        ended = self._input_ended.is_set()
                        break
                    mark += len(more)
                self._sock.sendall(more)
            if ended:
                self._sock.shutdown(socket.SHUT_WR)
        except OSError as exc:
            log.warning("the shared server (pid %d) took the task's replay only in part (%s)", welcome.pid, exc)  # its end is seen by the output loop
        if self.carry_overs:
            log.warning("carried over to the shared Spark server (pid %d) in %.1f s: %d bytes replayed; its log: %s", welcome.pid, time.monotonic() - self._carry_started, len(replay), welcome.log)

    def fail(self, message: str) -> int:
        """Ends the task with ``message`` as its last frame."""
        log.error("%s", message)
        from udf_agent.wire.guard import error_frame  # protobuf, only when there is this to tell

        self._output.heartbeat("carry-over", False)
        try:
            self._output.write(error_frame(message))
        except (BrokenPipeError, OutputAbandoned):
            pass
        return 1

    def _server_ended(self, server: Welcome) -> bool:
        """Whether the server died: a killed process closes its sockets a moment before the
        kernel marks it dead, so a connection that ends abruptly is given a short grace."""
        deadline = time.monotonic() + SERVER_END_GRACE
        while server_alive(server):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def _forward_input(self) -> None:
        pacer = ReadPacer(pause=RELAY_READ_PAUSE)
        try:
            while data := self._read_input():
                pause = pacer.after_read(len(data), time.monotonic())
                with self._lock:
                    self._hold_for_room()
                    self._carry.sent(data)  # kept first: a carry-over replays it
                    sock = None if self._carrying_over else self._sock
                    if sock is None:
                        self._answer_keepalives()
                if sock is not None:
                    try:
                        sock.sendall(data)
                    except OSError as exc:  # the server is gone: the output side sees it (what it missed is kept)
                        log.debug("relaying input to the server stopped: %s", exc)
                if pause:
                    time.sleep(pause)  # input is flowing in small reads: let it gather
        except OSError as exc:
            log.debug("reading Kapacitor's input stopped: %s", exc)
        self._end_input()

    def _read_input(self) -> bytes:
        while True:
            try:
                return os.read(self._read_fd, INPUT_CHUNK)
            except BlockingIOError:
                # stdin and stdout are one socket (a Handler script's Server hands the
                # connection over so), and stdout's writes are non-blocking: wait for input.
                select.select([self._read_fd], [], [])

    def _answer_keepalives(self) -> None:
        """While no server takes the task's input, the KeepaliveRequests in it are answered
        here (caller holds ``_lock``); those kept from before too, once (a server may have
        answered them already: an extra answer is harmless)."""
        from udf_agent.wire.guard import keepalive_frame  # protobuf, only on a carry-over

        times, self._keepalives_scanned = self._carry.keepalive_requests(self._keepalives_scanned)
        for stamp in times:
            try:
                self._output.write(keepalive_frame(stamp))
            except (OSError, OutputAbandoned):
                return

    def _hold_for_room(self) -> None:
        """Past MAX_KEPT_INPUT kept for a carry-over, reading waits for the next checkpoint
        (caller holds ``_lock``): Kapacitor's writes wait, and the relay answers its watchdog."""
        if self._carry.kept_input <= MAX_KEPT_INPUT:
            return
        log.warning("%d bytes of input since this task's last checkpoint: input is held until the next one", self._carry.kept_input)
        self._output.heartbeat("held", True)
        while self._carry.kept_input > MAX_KEPT_INPUT:
            self._lock.wait()
        self._output.heartbeat("held", False)

    def _end_input(self) -> None:
        """The server's agent sees end of input: it finishes accepted work, then closes."""
        with self._lock:
            self._input_ended.set()
            sock = None if self._carrying_over else self._sock  # else the carry-over ends it after its replay
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _input_link(welcome: Welcome) -> socket.socket:
    """The server's connection, its send buffer sized to hold little of the task's input."""
    welcome.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SERVER_SEND_BUFFER)
    return welcome.sock


def _restore_frame(snapshot: bytes) -> bytes:
    """A RestoreRequest of ``snapshot``, framed: Request.restore (field 5) holding
    RestoreRequest.snapshot (field 1), written out so the relay needs no protobuf for it."""
    inner = b"\x0a" + encode_varint(len(snapshot)) + snapshot
    body = b"\x2a" + encode_varint(len(inner)) + inner
    return encode_varint(len(body)) + body
