"""The reader's side of an agent: Kapacitor's input, read at its pace and acted on.

The inbox owns the session. Its thread reads (pausing while input flows in small reads),
cuts frames, acts on them a slice at a time under the work queue's lock, and turns the
session's events into frames for the writer and work for the compute thread, in input order.
It never waits on compute: past the budget of points waiting for compute it stops reading
(backpressure), sending heartbeat KeepaliveResponses meanwhile so that Kapacitor's watchdog
never fires. While a micro-batch computes it leaves a trickle of input unread, and the compute
thread, once done, reads it itself (``read_ahead``): whoever reads holds the inbox's read turn.
What the task's start and end mean to the rest of the agent, the agent says (``InboxOwner``).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from udf_agent.api import UDFSpec
from udf_agent.logs import TaskLabels, in_task
from udf_agent.runtime.checkpoints import Checkpoints
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.connection import Connection
from udf_agent.runtime.events import Compute, Emit, Event, Fail, Restore, Send, Started, TakeCheckpoint, TakeSnapshot
from udf_agent.runtime.flushing import FlushPolicy
from udf_agent.runtime.pacing import COMPUTE_GATHER, SMALL_READ, ReadPacer
from udf_agent.runtime.session import Session
from udf_agent.runtime.stats import TaskStats
from udf_agent.runtime.workqueue import Finish, WorkQueue
from udf_agent.runtime.writer import Writer
from udf_agent.wire.keepalives import keepalive_frame

log = logging.getLogger(__name__)

# A read takes at most what the pipe or socket holds (PASSTHROUGH_UNREAD_INPUT_BYTES at most).
READ_SIZE = 1024 * 1024
HEARTBEAT_INTERVAL = 0.25
# Over the points budget the reader still reads this often, up to a tenth over it.
TRICKLE_INTERVAL = 0.005
# Input the peer may queue unread: a keepalive request waits behind all of it. A UDF computed
# elsewhere takes input at ~40 MB/s here (1 MiB: ~25 ms), a passthrough one several times faster.
UNREAD_INPUT_BYTES = 256 * 1024
PASSTHROUGH_UNREAD_INPUT_BYTES = 1024 * 1024


class InboxOwner(Protocol):
    """What the inbox tells the agent that runs it (each called holding the work queue's lock)."""

    def started(self, event: Started) -> None:
        """The task's Init was accepted."""

    def failed(self, message: str) -> None:
        """The peer broke the protocol: the task ends with ``message``."""

    def input_ended(self) -> None:
        """No more input will be acted on: the drain starts."""


class Inbox:
    def __init__(self, connection: Connection, work: WorkQueue, writer: Writer, stats: TaskStats, config: AgentConfig, owner: InboxOwner, checkpoints: Checkpoints | None = None):
        self.connection = connection
        self.config = config
        # Until the spec is known, the session answers keepalives and keeps the rest.
        self.session = Session(None, max_batch_points=config.max_batch_points, max_frame_size=config.max_frame_size, allow_modules=config.allow_modules)
        self.flush_policy = FlushPolicy(config.flush_interval, config.gather, config.adaptive_flush)
        self._work = work
        self._writer = writer
        self._stats = stats
        self._owner = owner
        self._checkpoints = checkpoints
        self.passed_out = 0  # passthrough points sent (the compute thread counts the rest)
        self.compute_done = threading.Event()  # no more work will be taken: reading for room is over
        self._stop = threading.Event()
        self.stop_reason: str | None = None
        self._thread: threading.Thread | None = None
        # Whoever reads holds the turn: the reader thread, or the compute thread reading
        # ahead for it (``read_ahead``). It guards the buffer and the session's input side.
        self._read_turn = threading.Lock()
        self._buffer = memoryview(bytearray(READ_SIZE))
        self._read_at = time.monotonic()  # the last read that returned input (under the lock)
        self._reading_over = False  # the reader has acted on the end of input (under the turn)

    def start(self, labels: TaskLabels) -> None:
        """Starts the reader thread (once), its lines labelled with the task's ``labels``;
        until the spec is adopted it answers keepalives only."""
        if self._thread is None:
            self._thread = threading.Thread(target=in_task(labels, self._read_loop), name="reader", daemon=True)
            self._thread.start()

    def adopt(self, spec: UDFSpec) -> None:
        """The UDF is known: what was kept for it is acted on."""
        self.connection.limit_unread_input(PASSTHROUGH_UNREAD_INPUT_BYTES if spec.passthrough else UNREAD_INPUT_BYTES)
        with self._work.cond:
            self.dispatch(self.session.adopt(spec, time.monotonic()))
            self._work.cond.notify_all()  # a reader at the end of input waits for it

    def stop(self, reason: str | None = None) -> None:
        """Reads no more: input counts as ended; ``reason``, if the first given, is the
        ErrorResponse the task ends with once accepted work is out."""
        with self._work.cond:
            if self.stop_reason is None:
                self.stop_reason = reason
            self._stop.set()
            self._work.cond.notify_all()  # a reader gathering input while compute runs

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def micro_batch_due(self, now: float) -> float | None:
        """When the compute thread, idle, takes the open micro-batch (caller holds the lock)."""
        opened = self.session.open_micro_batch()
        return None if opened is None else self.flush_policy.due(opened[0], now)

    def close_micro_batch(self) -> None:
        """The open micro-batch goes to compute: it is due (caller holds the lock). Only the
        compute thread closes one, to take it next: nobody is woken for it (the reader, woken,
        would only find the work queue as it left it and wait again)."""
        self.dispatch(self.session.flush(), wake=False)

    def points_waiting(self) -> int:
        """Points read and not computed yet (caller holds the lock)."""
        return self._work.points() + self.session.pending_points()

    def dispatch(self, events: list[Event], wake: bool = True) -> bool:
        """Acts on session events (caller holds the lock); False once the session has failed.

        Work is queued under the same lock that produced it, whether the reader or the
        compute thread closed it, so micro-batches are computed in order. Nothing here may
        wait on the writer. ``wake``: the threads waiting on the lock are told (not when the
        compute thread itself, the one that would wait for the work, is acting).
        """
        alive = True
        for event in events:
            if isinstance(event, Send):
                self._writer.send(event.frame, urgent=event.urgent, wait=False)
                if event.asked_at is not None:
                    self._stats.keepalive_answered(event.asked_at)
            elif isinstance(event, Emit):
                self._stats.received(event.points, time.monotonic())
                self.passed_out += event.points
                # Behind the output of micro-batches still being computed, else straight out;
                # with the output queue full, the compute thread waits for room instead.
                if not self._work.idle() or self._writer.full():
                    self._work.put(event)
                else:
                    self._writer.send(event.frames, wait=False)
            elif isinstance(event, Started):
                self._owner.started(event)
            elif isinstance(event, (Compute, TakeSnapshot, Restore, TakeCheckpoint)):
                if isinstance(event, Compute):
                    self._stats.received(event.batch.count, time.monotonic())
                self._work.put(event)
            elif isinstance(event, Fail):
                log.error("protocol error: %s", event.message)
                message = f"protocol error: {event.message}"
                self._owner.failed(message)
                self._work.put(Finish(message))
                alive = False
        if events and wake:
            self._work.cond.notify_all()
        return alive

    # ---- the reader thread ----

    def _read_loop(self) -> None:
        try:
            self._read()
        except BaseException as exc:  # a dead reader would leave the task hanging
            log.exception("internal error in the reader")
            with self._work.cond:
                self._work.put(Finish(f"udf-agent internal error: {type(exc).__name__}: {exc}"))
                self._work.cond.notify_all()

    def _read(self) -> None:
        session = self.session
        # Only an end of input the peer made can cut a frame short: a read side we shut down
        # ourselves (a stop), or one that broke, is no truncated input.
        peer_ended = False
        pacer = ReadPacer()
        buffer = self._buffer
        try:
            while not self._stop.is_set():
                with self._read_turn:
                    if session.failed:  # by what a read ahead took in
                        return
                    if session.input_broken:  # found by a read ahead
                        self._act_on_input()
                        return
                    self._look_for_pause()
                    data = buffer[: self.connection.read_into(buffer)]
                    if not data:
                        self._end_input()
                        peer_ended = not self._stop.is_set()
                        break
                    pause = pacer.after_read(len(data), time.monotonic())
                    if not self._take_in(data):
                        return
                    self._look_for_pause()
                    small = len(data) < SMALL_READ
                self._wait_for_room()
                if session.input_broken:
                    self._act_on_input()  # the framing error, after the frames before it
                    return
                if small and self._gather_while_computing():
                    # The compute thread may have read ahead meanwhile, past the budget: the
                    # reader waits for room (with heartbeats) rather than blocking in a read.
                    self._wait_for_room()
                    continue
                if pause:
                    time.sleep(pause)  # input is flowing in small reads: let it gather
        except OSError as exc:
            self._end_input()
            if not self._stop.is_set():
                log.error("cannot read from Kapacitor: %s", exc)
        with self._read_turn, self._work.cond:
            self._reading_over = True
            if session.failed:  # by what a read ahead took in: its Finish is queued
                return
            while not session.adopted:  # what was kept is acted on first
                self._work.cond.wait()
            if not self.dispatch(session.receive_eof(time.monotonic(), truncated_ok=not peer_ended)):
                return
            # An orderly stop (SIGTERM) tells Kapacitor why, yet is no failure of ours.
            self._work.put(Finish(self.stop_reason, code=0))
            self._work.cond.notify_all()

    def _take_in(self, data: memoryview, wake: bool = True) -> bool:
        """Cuts the frames of ``data`` (holding the read turn; outside the lock: only the turn's
        holder touches the session's input side) and acts on them; False once the session has
        failed. ``wake``: the compute thread is told of new work (not when it read it)."""
        with self._work.cond:
            self.flush_policy.input_came(time.monotonic(), len(data))
        self.session.receive_data(data)
        while self.session.frames_waiting:
            if not self._act_on_input(wake):
                return False
        if self._checkpoints is not None:
            self._checkpoint_if_due(self._checkpoints)
        return True

    def read_ahead(self) -> None:
        """The compute thread, done with a micro-batch while the reader leaves input unread
        for it, reads that input itself: the reader's wake-up, and the compute thread's after
        it, are then no longer between one micro-batch and the next. Only a trickle: input that
        fills a small read, an end of input or an error are left to the reader, which then
        reads with its pacing and backpressure; so is input once the budget of waiting points is
        full (a read ahead may overshoot it by one read, as the reader's own reads do)."""
        with self._work.cond:
            # Past the budget the reader's wait for room is the backpressure: never read for it.
            if not self._work.reader_waits() or self._stop.is_set() or self.points_waiting() >= self.config.max_pending_points:
                return
        if not self._read_turn.acquire(blocking=False):
            return  # the reader is reading
        try:
            if self._reading_over or self.session.input_broken:
                return
            read = self.connection.read_ready_into(self._buffer[:SMALL_READ])
            if not read:
                return
            with self._work.cond:
                self._read_at = time.monotonic()
            self._take_in(self._buffer[:read], wake=False)
            self._look_for_pause(wake=False)
            with self._work.cond:
                if self.points_waiting() >= self.config.max_pending_points:
                    self._work.cond.notify_all()  # the reader's gathering ends: it waits for room instead, with heartbeats
        finally:
            self._read_turn.release()

    def _look_for_pause(self, wake: bool = True) -> None:
        """After each read (holding the read turn), and before the reader's next one (for what
        the compute thread read ahead): if nothing more is waiting (within the policy's settle
        time, ``FlushPolicy.settle``), the input has paused, and what was read is all there is
        for now: the open micro-batch is due at once. One poll a read, none once paused.
        ``wake``: the reader tells the compute thread; the compute thread, reading ahead, looks
        only at what is waiting now, and leaves a settle wait to the reader."""
        with self._work.cond:
            if self.flush_policy.paused or self.session.open_micro_batch() is None:
                return
            settle = self.flush_policy.settle(time.monotonic())
        if (settle and not wake) or self.connection.input_waiting(settle):
            return
        with self._work.cond:
            self.flush_policy.input_paused()
            if wake:
                self._work.wake_for(time.monotonic())

    def _gather_while_computing(self) -> bool:
        """While a micro-batch is computing (or queued, or due: the compute thread takes it at
        once), what comes in would only wait for the next one: it is left unread until the
        compute thread is free (``COMPUTE_GATHER`` at most, a keepalive's longest extra wait),
        then read at once. A point then costs the agent a share of one read a micro-batch, not
        a read (and a wake-up) of its own. Whether the reader waited."""
        with self._work.cond:
            if not self._computing_soon():
                return False
            self._read_at = time.monotonic()
            self._work.reader_waits_while(self._gathering, lambda: self._read_at + COMPUTE_GATHER)
        return True

    def _gathering(self) -> bool:
        """Whether the reader goes on leaving input unread for the compute thread: a micro-batch
        is computing soon and the budget has room (past it, a read ahead having filled it, the
        reader waits for room instead, with heartbeats). Caller holds the lock."""
        return self._computing_soon() and self.points_waiting() < self.config.max_pending_points

    def _computing_soon(self) -> bool:
        """Whether a micro-batch is computing, queued or due now, and the task goes on (caller holds the lock)."""
        if self._stop.is_set() or self.compute_done.is_set():
            return False
        if self._work.computing():
            return True
        now = time.monotonic()
        due = self.micro_batch_due(now)
        return due is not None and due <= now

    def _end_input(self) -> None:
        with self._work.cond:
            self._owner.input_ended()

    def _act_on_input(self, wake: bool = True) -> bool:
        """Acts on a slice of the frames read, under the lock (briefly: the compute thread
        must never wait for it long); False once the session has failed."""
        with self._work.cond:
            now = time.monotonic()
            alive = self.dispatch(self.session.next_events(now), wake)
            if wake:
                self._work.wake_for(self.micro_batch_due(now))
        return alive

    def _checkpoint_if_due(self, checkpoints: Checkpoints) -> None:
        """Queues a checkpoint of what was read so far once one is due (by time or input)."""
        now = time.monotonic()
        if not checkpoints.due(now, self.session.bytes_acted_on):
            return
        with self._work.cond:
            events = self.session.checkpoint()
            if events:
                self.dispatch(events)
                checkpoints.queued(now, self.session.bytes_acted_on)

    def _wait_for_room(self) -> None:
        """Past the budget of waiting points, not reading is the backpressure: Kapacitor's
        writes block, and heartbeats keep its watchdog fed meanwhile.

        Until the budget is overshot by a tenth, one more read is let through every
        ``TRICKLE_INTERVAL``: a KeepaliveRequest queued behind the input is then answered
        within that, not once compute has made room (a micro-batch later, ~100 ms)."""
        with self._work.cond:
            budget = self.config.max_pending_points
            trickle_at = time.monotonic() + TRICKLE_INTERVAL
            heartbeat_at = time.monotonic() + HEARTBEAT_INTERVAL
            input_closed = False
            while (waiting := self.points_waiting()) >= budget and not self.compute_done.is_set() and not self._stop.is_set():
                # Input left unread has an end already: the drain deadline starts now, not
                # when compute has made room for the reader to get there.
                if not input_closed and self.connection.input_closed():
                    input_closed = True
                    self._owner.input_ended()
                now = time.monotonic()
                trickle = waiting < budget + budget // 10
                if trickle and now >= trickle_at:
                    return
                if now >= heartbeat_at:
                    self._writer.send(keepalive_frame(time.time_ns()), urgent=True)
                    heartbeat_at = now + HEARTBEAT_INTERVAL
                self._work.cond.wait(min(trickle_at if trickle else heartbeat_at, heartbeat_at) - now)

