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
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from udf_agent.logs import configure_logging, label_thread, log_forwarded
from udf_agent.serve.failover import CarryOverError
from udf_agent.serve.relay_input import RelayInput
from udf_agent.serve.relay_link import ChunkSplitter, LinkError
from udf_agent.serve.relay_output import STOPPED_READER_TIMEOUT, OutputAbandoned
from udf_agent.serve.shared import Launch, ServerOptions, ServerStart, SharedServerError, Welcome, locate, options_not_used, remember_launch, server_alive
from udf_agent.wire.frames import ERROR_KEY, encode_varint, last_frame_key

log = logging.getLogger(__name__)

# The most of the server's output one receive takes, into a buffer kept for it: a receive of
# a new 256 KiB each time cost 16 µs more (an allocation that size, then shrunk) a chunk.
CHUNK = 256 * 1024
# Input waiting for the server, between Kapacitor's writes and the server's reads: a
# KeepaliveRequest waits behind all of it, and while the server's reader waits for compute to
# make room, it waits as long. A read of stdin at most ``relay_input.INPUT_CHUNK``, and a
# socket send buffer of SERVER_SEND_BUFFER, keep it small (flat out: keepalive p99 51 -> 25 ms,
# the rate alike); Kapacitor's writes then wait in its pipe, as they would for a UDF of its own.
SERVER_SEND_BUFFER = 32 * 1024
# Carry-overs of one task before a dying server fails it as it did before carry-overs.
MAX_CARRY_OVERS = 5
SERVER_END_GRACE = 0.5


def relay_launch(target: str, agent_options: dict[str, Any], start: ServerStart, log_level: str, log_format: str, asked_of_server: ServerOptions, argv: list[str] | None, script_args: tuple[str, ...] = (), started: RelayInput | None = None) -> NoReturn:
    """The task as a relay to the shared Spark server for ``start``'s settings (started if none
    is up), which it asks to run ``target`` with ``agent_options``; exits. The launch is
    remembered for the next task started with ``argv``, the raw command line (see entry.py).
    ``started``: the task's input, if entry.py started reading it already."""
    hello = {"target": target, "agent": agent_options, **({"script_args": list(script_args)} if script_args else {})}

    def join_server() -> Welcome:
        server = locate(start.settings)
        welcome = start.join(server, hello)
        if argv is not None:
            remember_launch(argv, Launch(server, hello, log_level, log_format, asked_of_server, start))
        return welcome

    relay_stdio(join_server, log_level, log_format, asked_of_server, rejoin=lambda: start.join(locate(start.settings), hello), started=started)


def relay_stdio(join: Callable[[], Welcome], log_level: str, log_format: str, asked_of_server: ServerOptions, rejoin: Callable[[], Welcome] | None = None, started: RelayInput | None = None) -> NoReturn:
    """The task's process as a relay: claims stdin and stdout (unless ``started`` holds them,
    its input read since the process's first moment), joins its server with ``join`` (saying
    what of ``asked_of_server`` that server, started earlier, does otherwise) and relays until
    the server closes the task's connection, carrying the task over to a new server with
    ``rejoin`` if it dies; exits. Kapacitor's input is read and kept, its keepalives answered,
    from the first: joining (a server to start, Spark's JVM behind it) takes as long as it takes."""
    task_input = started or RelayInput.from_stdio()
    configure_logging(log_level, log_format)
    # The relay's own lines name the task once the server's records have told its IDs.
    label_thread(task_input.labels)
    relay = Relay(task_input, rejoin)
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
    """The task's output side: whole frames of the server's answers to stdout, the task's
    records it sends logged; carries the task over to a new server if this one dies
    (``failover``), when given how to ``rejoin``. The input side is ``relay_input``."""

    def __init__(self, task_input: RelayInput, rejoin: Callable[[], Welcome] | None = None):
        self._input = task_input
        self._carry = task_input.carry
        self._output = task_input.output
        self._labels = task_input.labels
        self._rejoin = rejoin
        self._chunks = ChunkSplitter()
        self.carry_overs = 0
        self._carry_started = 0.0  # when the last carry-over began

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
        if last_frame_key(self._chunks.last_chunk) == ERROR_KEY:
            return 1  # the task failed, and the server said why
        partial = self._chunks.buffered
        finished = self._input.ended.is_set() and not partial and not self._carry.catching_up
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
            self._input.checkpointed(checkpoint)

    def _carry_over(self, dead: Welcome) -> Welcome | int:
        """Joins a new server in place of ``dead`` (starting it, or waiting for the relay that
        does), to be given the task back (``_hand_over``). Until it catches up the relay
        answers Kapacitor's watchdog itself. The new server, or the exit code if none."""
        self.carry_overs += 1
        self._carry_started = time.monotonic()
        kept = self._input.carry_over()
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
        self._chunks = ChunkSplitter()
        snapshot = self._carry.snapshot
        restore = b"" if snapshot is None else restore_frame(snapshot)
        try:
            replayed = self._input.hand_over(_input_link(welcome), restore)
        except OSError as exc:
            log.warning("the shared server (pid %d) took the task's replay only in part (%s)", welcome.pid, exc)  # its end is seen by the output loop
            return
        if self.carry_overs:
            log.warning("carried over to the shared Spark server (pid %d) in %.1f s: %d bytes replayed; its log: %s", welcome.pid, time.monotonic() - self._carry_started, replayed, welcome.log)

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


def _input_link(welcome: Welcome) -> socket.socket:
    """The server's connection, its send buffer sized to hold little of the task's input."""
    welcome.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SERVER_SEND_BUFFER)
    return welcome.sock


def restore_frame(snapshot: bytes | memoryview) -> bytes:
    """A RestoreRequest of ``snapshot``, framed: Request.restore (field 5) holding
    RestoreRequest.snapshot (field 1), written out so the relay needs no protobuf for it."""
    inner_length = 1 + len(encode_varint(len(snapshot))) + len(snapshot)
    body_length = 1 + len(encode_varint(inner_length)) + inner_length
    return b"".join((encode_varint(body_length), b"\x2a", encode_varint(inner_length), b"\x0a", encode_varint(len(snapshot)), snapshot))
