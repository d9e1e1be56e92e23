"""A relayed task's input: Kapacitor's bytes on to the shared server, from the process's first moment.

The input thread starts before the rest of the process loads (``entry.py``): until a server
takes the task (the first one, or a new one after a carry-over) it keeps the input and answers
the KeepaliveRequests in it itself, so Kapacitor's watchdog is answered as soon as the
interpreter is up, however long a server takes to start. This module and what it imports are
that first moment's cost: no protobuf, no socket module, nothing of the output side.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from typing import TYPE_CHECKING

from udf_agent.logs import TaskLabels, in_task
from udf_agent.runtime.pacing import ReadPacer
from udf_agent.runtime.stdio import claim_stdio_fds
from udf_agent.runtime.stop_signals import on_stop_signals
from udf_agent.serve.failover import CarryOver
from udf_agent.serve.relay_output import KapacitorOutput, OutputAbandoned
from udf_agent.wire.keepalives import keepalive_frame

if TYPE_CHECKING:
    import socket

    from udf_agent.serve.relay_link import Checkpoint

log = logging.getLogger(__name__)

# A read of stdin takes at most this: input waiting for the server, between Kapacitor's
# writes and the server's reads, delays a KeepaliveRequest behind it (the relay's socket send
# buffer, ``relay.SERVER_SEND_BUFFER``, is kept small for the same reason).
INPUT_CHUNK = 64 * 1024
# The relay's pause between small reads while input flows (the agent's reader pauses
# PAUSE, 1 ms): twice the points a read and half the wake-ups, here and in the server's
# reader that takes what the relay sends; a keepalive waits at most 1 ms longer.
RELAY_READ_PAUSE = 0.002
# Input kept since the last checkpoint before reading waits for the next one: four times what
# makes a checkpoint due (``checkpoints.CHECKPOINT_INPUT_BYTES``), so that only a checkpoint
# slow to come holds the input, and the relay's footprint stays bounded whatever the stream.
MAX_KEPT_INPUT = 64 * 1024 * 1024
_SHUT_WR = 1  # socket.SHUT_WR, without the socket module's import


class RelayInput:
    """Reads Kapacitor's input on its own thread, keeps what a carry-over replays (``carry``),
    and sends it on to the server that has the task, if one has."""

    def __init__(self, read_fd: int, write_fd: int, labels: TaskLabels):
        self.labels = labels
        self.ended = threading.Event()  # Kapacitor closed the input (or a stop signal came)
        self.output = KapacitorOutput(write_fd, self.ended)
        self.output.open()
        self.carry = CarryOver()
        self._read_fd = read_fd
        # Guards ``carry``'s kept input and where the input goes now.
        self._lock = threading.Condition()
        self._sock: socket.socket | None = None
        self._carrying_over = True  # no server takes the input: keep it, answer its keepalives
        self._keepalives_scanned = 0  # of the kept input, while no server takes it
        threading.Thread(target=in_task(labels, self._forward), name="relay-input", daemon=True).start()
        # SIGTERM ends the input as Kapacitor closing stdin would.
        on_stop_signals(lambda reason: self.end(), "the shared server finishes this task's accepted work")

    @classmethod
    def from_stdio(cls) -> RelayInput:
        """Claims stdin and stdout (nothing else can reach Kapacitor's end) and starts reading."""
        read_fd, write_fd = claim_stdio_fds()
        return cls(read_fd, write_fd, TaskLabels())

    def hand_over(self, sock: socket.socket, restore: bytes) -> int:
        """``sock``'s server takes the task: it is sent ``restore`` and the input kept (the
        carry-over's replay), then what came meanwhile, then the input goes straight to it.
        The bytes replayed; OSError if the server took them only in part."""
        with self._lock:
            replay = self.carry.replay(restore)
            mark = self.carry.kept_input
            self._sock = sock
        sock.sendall(replay)
        while True:
            with self._lock:
                more = self.carry.since(mark)
                if not more:
                    self._carrying_over = False
                    ended = self.ended.is_set()
                    break
                mark += len(more)
            sock.sendall(more)
        if ended:
            sock.shutdown(_SHUT_WR)
        return len(replay)

    def carry_over(self) -> int:
        """The server died: input is kept, its keepalives answered here (those kept since the
        checkpoint too: an extra answer is harmless), until ``hand_over``. The bytes kept."""
        with self._lock:
            self._carrying_over = True
            self._keepalives_scanned = 0
            self._answer_keepalives()
            return self.carry.kept_input

    def checkpointed(self, checkpoint: Checkpoint) -> None:
        """The server's checkpoint, read among its output: what is kept starts after it."""
        with self._lock:
            self.carry.checkpointed(checkpoint)
            self._lock.notify_all()  # an input held for room goes on

    def end(self) -> None:
        """The server's agent sees the end of input: it finishes accepted work, then closes."""
        with self._lock:
            self.ended.set()
            sock = None if self._carrying_over else self._sock  # else the hand-over ends it after its replay
        if sock is not None:
            try:
                sock.shutdown(_SHUT_WR)
            except OSError:
                pass

    def _forward(self) -> None:
        pacer = ReadPacer(pause=RELAY_READ_PAUSE)
        try:
            while data := self._read():
                pause = pacer.after_read(len(data), time.monotonic())
                with self._lock:
                    self._hold_for_room()
                    self.carry.sent(data)  # kept first: a carry-over replays it
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
        self.end()

    def _read(self) -> bytes:
        while True:
            try:
                return os.read(self._read_fd, INPUT_CHUNK)
            except BlockingIOError:
                # stdin and stdout are one socket (a Handler script's Server hands the
                # connection over so), and stdout's writes are non-blocking: wait for input.
                select.select([self._read_fd], [], [])

    def _answer_keepalives(self) -> None:
        """While no server takes the input, the KeepaliveRequests in it are answered here
        (caller holds ``_lock``), each once."""
        times, self._keepalives_scanned = self.carry.keepalive_requests(self._keepalives_scanned)
        for stamp in times:
            try:
                self.output.write(keepalive_frame(stamp))
            except (OSError, OutputAbandoned):
                return

    def _hold_for_room(self) -> None:
        """Past MAX_KEPT_INPUT kept for a carry-over, reading waits for the next checkpoint
        (caller holds ``_lock``): Kapacitor's writes wait, and the relay answers its watchdog."""
        if self.carry.kept_input <= MAX_KEPT_INPUT:
            return
        log.warning("%d bytes of input since this task's last checkpoint: input is held until the next one", self.carry.kept_input)
        self.output.heartbeat("held", True)
        while self.carry.kept_input > MAX_KEPT_INPUT:
            self._lock.wait()
        self.output.heartbeat("held", False)
