"""One agent per Kapacitor connection: it starts, drains and stops three threads.

The reader (``inbox.Inbox``, which owns the protocol session) never waits on compute: it
answers keepalives and management requests at once and queues work in input order on the
``WorkQueue``, whose Condition is the agent's one lock. The compute thread takes that work and
runs each micro-batch on its ``MicroBatchRunner`` (``runner.py``), holding no lock while it
computes; done with a micro-batch it reads the trickle that came meanwhile itself
(``Inbox.read_ahead``). The writer writes, one write at a time (a small output the compute thread
writes itself while the writer is idle: ``Writer.send_now``). The agent itself keeps the
deadlines: the drain after input ends and the reply to a protocol error.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from udf_agent.api import UDFSpec
from udf_agent.collector import freeze_startup_objects
from udf_agent.logs import TaskLabels, in_task, label_thread
from udf_agent.runtime.checkpoints import Checkpoints, CheckpointSink
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.connection import Connection
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.events import Emit, Started
from udf_agent.runtime.inbox import Inbox
from udf_agent.runtime.runner import MicroBatchRunner, UDFError
from udf_agent.runtime.session import Session
from udf_agent.runtime.stats import TaskStats
from udf_agent.runtime.workqueue import Finish, InitReply, WorkQueue
from udf_agent.runtime.writer import Writer
from udf_agent.wire import hotpath
from udf_agent.wire.guard import error_frame

if TYPE_CHECKING:  # the task tables load with the first micro-batch, off the Info path
    from udf_agent.runtime.tasks import MicroBatch

log = logging.getLogger(__name__)

# The longest an InitResponse waits for the hot path (compiled scanner and point
# codec) to load; numba's first compile on a new machine can take longer.
HOT_PATH_WAIT = 3.0

# After a protocol error, accepted work gets this long before the ErrorResponse goes out
# anyway: Kapacitor's keepalive watchdog (10 s in its sample configuration) must not fire
# while a backlog is computed for a task that is failing.
ERROR_REPLY_WITHIN = 1.5


class Agent:
    """Serves one connection. ``spec`` may come later (``run(spec)``): the reader
    can start first and answer keepalives while the UDF's module imports."""

    def __init__(self, spec: UDFSpec | None, connection: Connection, engines: Engines, config: AgentConfig | None = None, checkpoints: CheckpointSink | None = None):
        self.config = config or AgentConfig()
        self.connection = connection
        self.engines = engines
        self.spec: UDFSpec | None = None
        # Its Condition (``cond``) guards the session's protocol state too: one order for everything computed.
        self._work = WorkQueue()
        # Kapacitor's task and node IDs (from the InitRequest) and the UDF: named by every line this task logs.
        self.labels = TaskLabels()
        self.writer = Writer(connection, self.labels)
        self.stats = TaskStats()
        relayed = Checkpoints(checkpoints, time.monotonic()) if checkpoints is not None else None
        self.inbox = Inbox(connection, self._work, self.writer, self.stats, self.config, self, relayed)
        # The compute thread's side: what it owns, no one else touches.
        self.runner = MicroBatchRunner(self.config, engines, self.writer, self.inbox.session, self.labels, self.stats, relayed)
        self.runner.take_next = self._next_micro_batch
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

    @property
    def session(self) -> Session:
        return self.inbox.session

    def start_reading(self) -> None:
        """Starts the reader now; until the spec arrives it answers keepalives only."""
        self.inbox.start(self.labels)

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
        with self._work.cond:
            self.runner.abandoned = True
            held = self.runner.held
            not_computed = self.runner.computing + (held.count if held is not None else 0) + self.inbox.points_waiting()
            self._work.clear()
            self.inbox.compute_done.set()
            self._work.cond.notify_all()
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
        self.runner.adopt(spec)
        with self._work.cond:
            self.spec = spec
            self.labels.udf = spec.name
        self.inbox.adopt(spec)

    def stop_reading(self, reason: str | None = None) -> None:
        """Treats input as ended: what was accepted is computed and sent (within the drain
        timeout), then ``reason``, if given, as an ErrorResponse, and the agent ends."""
        self.inbox.stop(reason)
        with self._work.cond:
            self.input_ended()
        self.connection.abort_read()

    # ---- what the inbox tells (holding the lock) ----

    def input_ended(self) -> None:
        """Starts the drain: from now on nothing may take longer than the drain timeout."""
        if self._drain_deadline is None:
            self._drain_deadline = time.monotonic() + self.config.drain_timeout
            self.writer.drain_by(self._drain_deadline)
            self._compute_watch.set()

    def failed(self, message: str) -> None:
        self.stats.last_error = message
        if self._failure is None:
            self._failure = (message, time.monotonic() + min(ERROR_REPLY_WITHIN, self.config.drain_timeout))
            self._compute_watch.set()

    def started(self, event: Started) -> None:
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

    def status(self) -> dict[str, Any]:
        """The task as ``udf-agent status`` shows it."""
        found = self.stats.snapshot()
        found["points_out"] += self.inbox.passed_out
        found["falling_behind"] = self.falling_behind()
        return {"taskID": self.labels.task_id, "nodeID": self.labels.node_id, "udf": self.labels.udf, **found, "groups": len(self.runner.groups)}

    def falling_behind(self) -> bool:
        """Whether this task's input waits for compute longer than it may gather (``TaskStats``)."""
        with self._work.cond:
            opened = self._work.opened()
            pending = self.session.open_micro_batch()
        held = self.runner.held
        if held is not None:
            opened.append(held.opened_at)
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
                from udf_agent.compute import packed

                hotpath.load_point_codec()
                packed.warm_up()  # the results' unpacking
            except Exception as exc:  # no reference twin: its micro-batches will fail, saying why
                log.error("the compiled point codec cannot load, and %s cannot compute without it (run 'udf-agent doctor'): %s", self.spec.name, exc)
                return
        log.debug("compiled hot path loaded in %.2f s", time.monotonic() - started)
        freeze_startup_objects("hot path loaded")

    # ---- compute ----

    def _compute_loop(self) -> None:
        try:
            while True:
                item = self._work.take(self.inbox.micro_batch_due, self.inbox.close_micro_batch, lambda: self.runner.abandoned)
                if isinstance(item, Finish):
                    self._finish(item.error, item.code)
                    return
                if isinstance(item, Emit):
                    self.writer.send(item.frames)
                elif isinstance(item, InitReply):
                    self._reply_when_loaded(item)
                else:
                    self.runner.run(item)
                    self.inbox.read_ahead()
        except UDFError as exc:
            self._finish(str(exc))
        except BaseException as exc:  # even SystemExit from a UDF must end the task, not hang it
            log.exception("internal error")
            self._finish(f"udf-agent internal error: {type(exc).__name__}: {exc}")
        finally:
            self._compute_watch.set()  # the runner's wait ends

    def _next_micro_batch(self) -> MicroBatch | None:
        """While a micro-batch computes: the input the reader left for the compute thread read
        ahead, and the next work if it is a micro-batch ready now (``MicroBatchRunner.take_next``)."""
        self.inbox.read_ahead()
        item = self._work.take_micro_batch_now(self.inbox.micro_batch_due, self.inbox.close_micro_batch)
        return None if item is None else item.batch

    def _finish(self, error: str | None, code: int = 1) -> None:
        if error is not None:
            self.stats.last_error = error
        self.inbox.stop()
        with self._work.cond:
            self.inbox.compute_done.set()
            self._work.cond.notify_all()
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
