"""One agent per Kapacitor connection: a reader, a compute thread, one writer.

The reader never waits on compute: it splits frames, answers keepalives and
management requests at once, and hands closed micro-batches to the compute
thread in order, which runs each on its ``MicroBatchRunner`` (``runner.py``). Past a budget of points waiting for compute it stops
reading (backpressure) and sends heartbeat KeepaliveResponses meanwhile, so
Kapacitor's watchdog never fires. The writer is the only thread that writes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from udf_agent.api import UDFSpec
from udf_agent.runtime.collector import freeze_startup_objects
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.connection import Connection
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.flushing import FlushPolicy
from udf_agent.runtime.logs import TaskLabels, in_task, label_thread
from udf_agent.runtime.pacing import ReadPacer
from udf_agent.runtime.runner import CHECKPOINT_INPUT_BYTES, CHECKPOINT_INTERVAL, CheckpointSink, MicroBatchRunner, UDFError
from udf_agent.runtime.session import Compute, Emit, Event, Fail, Restore, Send, Session, Started, TakeCheckpoint, TakeSnapshot
from udf_agent.runtime.workqueue import Finish, InitReply, WorkQueue
from udf_agent.runtime.writer import Writer
from udf_agent.wire import hotpath
from udf_agent.wire.guard import error_frame, keepalive_frame

log = logging.getLogger(__name__)

# A read takes at most what the pipe or socket holds (PASSTHROUGH_UNREAD_INPUT_BYTES at most).
READ_SIZE = 1024 * 1024
HEARTBEAT_INTERVAL = 0.25
# Over the points budget the reader still reads this often, up to a tenth over it.
TRICKLE_INTERVAL = 0.005
# The longest an InitResponse waits for the hot path (compiled scanner and point
# codec) to load; numba's first compile on a new machine can take longer.
HOT_PATH_WAIT = 3.0
# Input the peer may queue unread: a keepalive request waits behind all of it. A UDF computed
# elsewhere takes input at ~40 MB/s here (1 MiB: ~25 ms), a passthrough one several times faster.
UNREAD_INPUT_BYTES = 256 * 1024
PASSTHROUGH_UNREAD_INPUT_BYTES = 1024 * 1024


# After a protocol error, accepted work gets this long before the ErrorResponse goes out
# anyway: Kapacitor's keepalive watchdog (10 s in its sample configuration) must not fire
# while a backlog is computed for a task that is failing.
ERROR_REPLY_WITHIN = 1.5


class Agent:
    """Serves one connection. ``spec`` may come later (``run(spec)``): the reader
    can start first and answer keepalives while the UDF's module imports."""

    def __init__(self, spec: UDFSpec | None, connection: Connection, engines: Engines, config: AgentConfig | None = None, checkpoints: CheckpointSink | None = None):
        self.config = config or AgentConfig()
        self._checkpoints = checkpoints
        self._next_checkpoint_at = time.monotonic() + CHECKPOINT_INTERVAL
        self._checkpointed_bytes = 0
        self.connection = connection
        self.engines = engines
        self.spec: UDFSpec | None = None
        # Until the spec is known, the session answers keepalives and keeps the rest.
        self.session = Session(
            None, max_batch_points=self.config.max_batch_points, max_frame_size=self.config.max_frame_size, allow_modules=self.config.allow_modules,
        )
        self.flush_policy = FlushPolicy(self.config.flush_interval, self.config.gather, self.config.adaptive_flush)
        # Its Condition guards the session's protocol state too: one order for everything computed.
        self._work = WorkQueue()
        self._cond = self._work.cond
        # Kapacitor's task and node IDs (from the InitRequest) and the UDF: named by every line this task logs.
        self.labels = TaskLabels()
        self.writer = Writer(connection, self.labels)
        self._reader: threading.Thread | None = None
        # The compute thread's side: what it owns, no one else touches.
        self.runner = MicroBatchRunner(self.config, engines, self.writer, self.session.guard, self.labels, checkpoints)
        self.groups = self.runner.groups
        self.stats = self.runner.stats
        self._passed_out = 0  # passthrough points sent (the reader's count; the compute thread counts the rest)
        self._stop_reading = threading.Event()
        self._stop_reason: str | None = None
        self._compute_done = threading.Event()
        # Set when input ends: accepted work is computed and written until then, no longer.
        self._drain_deadline: float | None = None
        self._failure: tuple[str, float] | None = None  # a protocol error's message and its reply deadline
        # Set when the compute thread ends or a deadline for it is set: what the thread that
        # runs the agent waits for, instead of polling (an idle task costs no CPU).
        self._compute_watch = threading.Event()
        self.exit_code = 0
        if spec is not None:
            self._adopt(spec)

    # ---- entry point ----

    def start_reading(self) -> None:
        """Starts the reader now; until the spec arrives it answers keepalives only."""
        if self._reader is None:
            self._reader = threading.Thread(target=in_task(self.labels, self._read_loop), name="reader", daemon=True)
            self._reader.start()

    def run(self, spec: UDFSpec | None = None) -> int:
        """Serves the connection until Kapacitor closes it; returns the exit code."""
        label_thread(self.labels)  # what adopting the spec logs names the task too
        if spec is not None:
            self._adopt(spec)
        if not self.session.adopted:
            raise ValueError("Agent.run needs the UDF spec")
        compute = threading.Thread(target=in_task(self.labels, self._compute_loop), name="compute", daemon=True)
        compute.start()
        self.start_reading()
        not_computed = self._wait_for_compute(compute)
        self.runner.end()
        self.writer.join()
        self._report_drain(not_computed)
        if self.writer.broken is not None and self.exit_code == 0:
            self.exit_code = 1
        return self.exit_code

    def _wait_for_compute(self, compute: threading.Thread) -> int:
        """Joins the compute thread, or abandons it at the drain deadline (or a protocol
        error's reply deadline); the points left uncomputed."""
        while compute.is_alive():
            self._compute_watch.clear()  # before looking: a change after it wakes the wait below
            deadlines = [d for d in (self._drain_deadline, self._failure[1] if self._failure else None) if d is not None]
            if not deadlines:
                self._compute_watch.wait()
                continue
            remaining = min(deadlines) - time.monotonic()
            if remaining <= 0:
                return self._abandon()
            self._compute_watch.wait(remaining)
        return 0

    def _abandon(self) -> int:
        """A deadline passed with work left: it is dropped, and the output closed, after
        the ErrorResponse of a protocol error if there was one."""
        with self._cond:
            self.runner.abandoned = True
            not_computed = self.runner.computing + self._points_waiting()
            self._work.clear()
            self._compute_done.set()
            self._cond.notify_all()
        if self._failure is not None:
            self.exit_code = 1
            self.writer.fail_now(error_frame(self._failure[0]), time.monotonic() + self.config.drain_timeout)
            self.connection.abort_read()
        else:
            self.writer.close()
        return not_computed

    def _report_drain(self, not_computed: int) -> None:
        self.stats.dropped_at_stop += not_computed
        frames, size = self.writer.unwritten_frames, self.writer.unwritten_bytes
        if not_computed or frames:
            after = (
                f"the protocol error (its ErrorResponse is due within {ERROR_REPLY_WITHIN:g} s)"
                if self._failure is not None
                else f"the end of input (drain timeout {self.config.drain_timeout:g} s)"
            )
            log.warning(
                "after %s: %d accepted point(s) not computed, %d output frame(s) (%d bytes) not written; the rest was sent",
                after, not_computed, frames, size,
            )

    def _adopt(self, spec: UDFSpec) -> None:
        self.connection.limit_unread_input(PASSTHROUGH_UNREAD_INPUT_BYTES if spec.passthrough else UNREAD_INPUT_BYTES)
        self.runner.adopt(spec)
        with self._cond:
            self.spec = spec
            self.labels.udf = spec.name
            self._dispatch(self.session.adopt(spec, time.monotonic()))
            self._cond.notify_all()

    def stop_reading(self, reason: str | None = None) -> None:
        """Treats input as ended: what was accepted is computed and sent (within the drain
        timeout), then ``reason``, if given, as an ErrorResponse, and the agent ends."""
        with self._cond:
            if self._stop_reason is None:
                self._stop_reason = reason
        self._stop_reading.set()
        self._input_ended()
        self.connection.abort_read()

    def _input_ended(self) -> None:
        """Starts the drain: from now on nothing may take longer than the drain timeout."""
        with self._cond:
            if self._drain_deadline is None:
                self._drain_deadline = time.monotonic() + self.config.drain_timeout
                self.writer.drain_by(self._drain_deadline)
                self._compute_watch.set()

    # ---- reader ----

    def _read_loop(self) -> None:
        try:
            self._read()
        except BaseException as exc:  # a dead reader would leave the task hanging
            log.exception("internal error in the reader")
            with self._cond:
                self._work.put(Finish(f"udf-agent internal error: {type(exc).__name__}: {exc}"))
                self._cond.notify_all()

    def _read(self) -> None:
        session = self.session
        # Only an end of input the peer made can cut a frame short: a read side we shut down
        # ourselves (a stop), or one that broke, is no truncated input.
        peer_ended = False
        pacer = ReadPacer()
        buffer = memoryview(bytearray(READ_SIZE))
        try:
            while not self._stop_reading.is_set():
                data = buffer[: self.connection.read_into(buffer)]
                if not data:
                    self._input_ended()
                    peer_ended = not self._stop_reading.is_set()
                    break
                pause = pacer.after_read(len(data), time.monotonic())
                # Cut outside the lock: only this thread touches the session's input buffer.
                session.receive_data(data)
                while session.frames_waiting:
                    if not self._act_on_input():
                        return
                if self._checkpoints is not None:
                    self._checkpoint_if_due()
                self._wait_for_room()
                if session.input_broken:
                    self._act_on_input()  # the framing error, after the frames before it
                    return
                if pause:
                    time.sleep(pause)  # input is flowing in small reads: let it gather
        except OSError as exc:
            self._input_ended()
            if not self._stop_reading.is_set():
                log.error("cannot read from Kapacitor: %s", exc)
        with self._cond:
            self._session_ready()
            if not self._dispatch(session.receive_eof(time.monotonic(), truncated_ok=not peer_ended)):
                return
            # An orderly stop (SIGTERM) tells Kapacitor why, yet is no failure of ours.
            self._work.put(Finish(self._stop_reason, code=0))
            self._cond.notify_all()

    def _checkpoint_if_due(self) -> None:
        """Queues a checkpoint of what was read so far once one is due (by time or input)."""
        now = time.monotonic()
        if now < self._next_checkpoint_at and self.session.bytes_acted_on - self._checkpointed_bytes < CHECKPOINT_INPUT_BYTES:
            return
        with self._cond:
            events = self.session.checkpoint()
            if events:
                self._dispatch(events)
                self._checkpointed_bytes = self.session.bytes_acted_on
                self._next_checkpoint_at = now + self.runner.checkpoint_interval

    def _act_on_input(self) -> bool:
        """Acts on a slice of the frames read, under the lock (briefly: the compute thread
        must never wait for it long); False once the session has failed."""
        with self._cond:
            now = time.monotonic()
            alive = self._dispatch(self.session.next_events(now))
            self._work.wake_for(self._micro_batch_due(now))
        return alive

    def _micro_batch_due(self, now: float) -> float | None:
        """When the compute thread, idle, takes the open micro-batch (caller holds ``_cond``)."""
        opened = self.session.open_micro_batch()
        return None if opened is None else self.flush_policy.due(*opened, now)

    def status(self) -> dict[str, Any]:
        """The task as ``udf-agent status`` shows it."""
        found = self.stats.snapshot()
        found["points_out"] += self._passed_out
        found["falling_behind"] = self.falling_behind()
        return {"taskID": self.labels.task_id, "nodeID": self.labels.node_id, "udf": self.labels.udf, **found, "groups": len(self.groups)}

    def falling_behind(self) -> bool:
        """Whether this task's input waits for compute longer than it may gather (``TaskStats``)."""
        with self._cond:
            opened = self._work.opened()
            pending = self.session.open_micro_batch()
        if pending is not None:
            opened.append(pending[0])
        return self.stats.falling_behind(time.monotonic(), min(opened, default=None), self.config.flush_interval)

    @property
    def initialized(self) -> bool:
        """Whether an InitRequest has been accepted."""
        return self.runner.options is not None

    def _loaded(self) -> tuple[UDFSpec, Session]:
        """The UDF and its session, known before any work reaches the compute thread."""
        assert self.spec is not None
        return self.spec, self.session

    def _session_ready(self) -> None:
        """Waits (caller holds ``_cond``) until the spec is known."""
        while not self.session.adopted:
            self._cond.wait()

    def _dispatch(self, events: list[Event]) -> bool:
        """Acts on session events (caller holds ``_cond``); False once the session has failed.

        Work is appended under the same lock that produced it, whether the reader
        or the flush timer closed it, so micro-batches are computed in order.
        """
        alive = True
        if not events:
            return alive
        for event in events:
            # The caller holds the agent's lock: nothing here may wait on the writer.
            if isinstance(event, Send):
                self.writer.send(event.frame, urgent=event.urgent, wait=False)
                if event.asked_at is not None:
                    self.stats.keepalive_answered(event.asked_at)
            elif isinstance(event, Emit):
                self.stats.received(event.points, time.monotonic())
                self._passed_out += event.points
                # Behind the output of micro-batches still being computed, else straight out;
                # with the output queue full, the compute thread waits for room instead.
                if not self._work.idle() or self.writer.full():
                    self._work.put(event)
                else:
                    self.writer.send(event.frames, wait=False)
            elif isinstance(event, Started):
                self._start(event)
            elif isinstance(event, (Compute, TakeSnapshot, Restore, TakeCheckpoint)):
                if isinstance(event, Compute):
                    self.stats.received(event.batch.count, time.monotonic())
                self._work.put(event)
            elif isinstance(event, Fail):
                log.error("protocol error: %s", event.message)
                message = f"protocol error: {event.message}"
                self.stats.last_error = message
                if self._failure is None:
                    self._failure = (message, time.monotonic() + min(ERROR_REPLY_WITHIN, self.config.drain_timeout))
                    self._compute_watch.set()
                self._work.put(Finish(message))
                alive = False
        self._cond.notify_all()
        return alive

    def _wait_for_room(self) -> None:
        """Past the budget of waiting points, not reading is the backpressure: Kapacitor's
        writes block, and heartbeats keep its watchdog fed meanwhile.

        Until the budget is overshot by a tenth, one more read is let through every
        ``TRICKLE_INTERVAL``: a KeepaliveRequest queued behind the input is then answered
        within that, not once compute has made room (a micro-batch later, ~100 ms)."""
        with self._cond:
            budget = self.config.max_pending_points
            trickle_at = time.monotonic() + TRICKLE_INTERVAL
            heartbeat_at = time.monotonic() + HEARTBEAT_INTERVAL
            while (waiting := self._points_waiting()) >= budget and not self._compute_done.is_set() and not self._stop_reading.is_set():
                # Input left unread has an end already: the drain deadline starts now, not
                # when compute has made room for the reader to get there.
                if self._drain_deadline is None and self.connection.input_closed():
                    self._input_ended()
                now = time.monotonic()
                trickle = waiting < budget + budget // 10
                if trickle and now >= trickle_at:
                    return
                if now >= heartbeat_at:
                    self.writer.send(keepalive_frame(time.time_ns()), urgent=True)
                    heartbeat_at = now + HEARTBEAT_INTERVAL
                self._cond.wait(min(trickle_at if trickle else heartbeat_at, heartbeat_at) - now)

    def _points_waiting(self) -> int:
        return self._work.points() + self.session.pending_points()

    def _start(self, event: Started) -> None:
        self.runner.options = event.options
        self.labels.task_id, self.labels.node_id = event.task_id, event.node_id
        # What the task runs: the UDF a stream_fn or batch_fn target named, from its Init on.
        self.spec = self.session.spec
        self.runner.adopt(self.spec)
        self.labels.udf = self.spec.name
        if event.reply is None:
            log.info("task %s node %s: Kapacitor Handler script %s: its Init goes to its handler", event.task_id or "?", event.node_id or "?", self._loaded()[0].name)
        else:
            log.info("task %s node %s: UDF %s initialised with %s", event.task_id or "?", event.node_id or "?", self._loaded()[0].name, dict(event.options.raw()))
        self.engines.warm_up(self._loaded()[0])
        loader = threading.Thread(target=in_task(self.labels, self._load_hot_path), name="hot-path", daemon=True)
        loader.start()
        if event.reply is not None:  # else a Handler script's handler answers the Init
            self._work.put(InitReply(event.reply, loader))

    def _reply_when_loaded(self, item: InitReply) -> None:
        """Sends the InitResponse once the hot path is loaded (or HOT_PATH_WAIT passed), so
        that the points after it all take the fast path; the reader answers keepalives meanwhile."""
        item.loader.join(HOT_PATH_WAIT)
        if item.loader.is_alive():
            log.info("the compiled hot path is still loading after %g s (numba's first compile); answering Init now", HOT_PATH_WAIT)
        self.writer.send(item.reply)

    def _load_hot_path(self) -> None:
        started = time.monotonic()
        try:
            hotpath.load_scanner()
        except Exception as exc:  # a speed-up: the reference frame splitter carries on
            log.warning("the compiled frame scanner cannot load, reading frames with the slower reference code: %s", exc)
            return
        handler = self.spec is not None and self.spec.handler is not None
        self.session.use_compiled_splitter(hotpath.handler_run_splitter if handler else hotpath.compiled_splitter)
        if self.spec is not None and self.spec.compute and not self.spec.passthrough and not handler:
            try:
                hotpath.load_point_codec()
            except Exception as exc:  # no reference twin: its micro-batches will fail, saying why
                log.error("the compiled point codec cannot load, and %s cannot compute without it (run 'udf-agent doctor'): %s", self.spec.name, exc)
                return
        log.debug("compiled hot path loaded in %.2f s", time.monotonic() - started)
        freeze_startup_objects("hot path loaded")

    # ---- compute ----

    def _compute_loop(self) -> None:
        try:
            while True:
                item = self._work.take(self._micro_batch_due, self._close_due, lambda: self.runner.abandoned)
                if isinstance(item, Finish):
                    self._finish(item.error, item.code)
                    return
                if isinstance(item, Emit):
                    self.writer.send(item.frames)
                elif isinstance(item, InitReply):
                    self._reply_when_loaded(item)
                else:
                    self.runner.run(item)
        except UDFError as exc:
            self._finish(str(exc))
        except BaseException as exc:  # even SystemExit from a UDF must end the task, not hang it
            log.exception("internal error")
            self._finish(f"udf-agent internal error: {type(exc).__name__}: {exc}")
        finally:
            self._compute_watch.set()  # the runner's wait ends

    def _close_due(self) -> None:
        """The open micro-batch goes to compute: it is due (caller holds ``_cond``)."""
        self._dispatch(self.session.flush())

    def _finish(self, error: str | None, code: int = 1) -> None:
        if error is not None:
            self.stats.last_error = error
        self._stop_reading.set()
        with self._cond:
            self._compute_done.set()
            self._cond.notify_all()
            if self.runner.abandoned:
                return
        # Even a peer that stopped reading must not hold the last frames (and the exit) for ever.
        self.writer.drain_by(time.monotonic() + self.config.drain_timeout)
        if error is not None:
            self.exit_code = code
            self.writer.close(error_frame(error))
            self.connection.abort_read()
        else:
            self.writer.close()
