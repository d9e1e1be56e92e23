"""The compute thread's side of a task: each micro-batch run on its engine, the groups' state
kept, the output written in order; snapshots, restores and checkpoints of that state.

It holds no lock: the agent's work queue hands it one item at a time, in the order the input
came, and nothing else touches what it owns (the task's UDF job or Handler, its group store).
The agent reads ``computing`` and ``held`` and sets ``abandoned``, each a single attribute.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from udf_agent.api import UDFSpec
from udf_agent.compute.engine import CHAINED_SLICE_BYTES, ComputeFailed, EngineStartError
from udf_agent.errors import first_line
from udf_agent.logs import TaskLabels
from udf_agent.runtime.checkpoints import Checkpoints
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.events import Compute, Event, Restore, Send, TakeCheckpoint, TakeSnapshot
from udf_agent.runtime.groups import GroupStore
from udf_agent.runtime.stats import TaskStats
from udf_agent.runtime.writer import Writer
from udf_agent.wire import hotpath
from udf_agent.wire.batches import HandlerMicroBatch

if TYPE_CHECKING:  # the compute contract loads with the first micro-batch, off the Info path
    import numpy as np

    from udf_agent.compute.contract import Job
    from udf_agent.compute.engine import Engine
    from udf_agent.compute.packed import ResultColumns, StreamTasks
    from udf_agent.options import OptionValues
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.handler_task import HandlerTask
    from udf_agent.runtime.tasks import MicroBatch, Tasks, TaskTables
    from udf_agent.wire.hotpath import WireKernels

log = logging.getLogger(__name__)

class Replies(Protocol):
    """The session's side of the replies the compute thread's work answers: the frames to send
    (``Session``; each refused unless Kapacitor awaits it)."""

    def snapshot_taken(self, snapshot: bytes) -> list[Event]: ...

    def restored(self, error: str | None) -> list[Event]: ...


class UDFError(RuntimeError):
    """A UDF call or a compute job failed: the task cannot go on."""


@dataclass
class _Computed:
    """What the slices of one micro-batch gave, in group order."""

    frames: list[tuple[bytes, np.ndarray]] = field(default_factory=list)  # each slice's, and where each group's end
    counts: list[np.ndarray] = field(default_factory=list)  # ... and how many frames each group gave
    failure: str | None = None  # the error of the first failed group, when it ends the task
    set_aside: bool = False  # some groups' points were skipped (--on-error)


@dataclass
class _Prepared:
    """What a task's micro-batches are computed with, made at the first one (to keep the
    compute contract and pyarrow off the Info path)."""

    job: Job
    task_tables: Callable[[MicroBatch, GroupStore, WireKernels], TaskTables]  # by the edge the UDF wants


@dataclass
class _Link:
    """A micro-batch the compute thread took: its task tables, the engine it runs on, when it
    was taken, and what its slices gave."""

    batch: MicroBatch
    task_tables: TaskTables
    engine: Engine
    started: float
    done: _Computed = field(default_factory=_Computed)


def _no_next_micro_batch() -> MicroBatch | None:
    return None


class MicroBatchRunner:
    """Runs a task's work items, one at a time, on the compute thread; UDFError when the
    task cannot go on."""

    def __init__(self, config: AgentConfig, engines: Engines, writer: Writer, replies: Replies, labels: TaskLabels, stats: TaskStats, checkpoints: Checkpoints | None = None):
        self.config = config
        self.engines = engines
        self.writer = writer
        self.replies = replies
        self.labels = labels
        self.checkpoints = checkpoints
        self.groups = GroupStore(config.max_groups)
        self.stats = stats  # the reader counts what comes in, this what goes out
        self.spec: UDFSpec | None = None
        self.options: OptionValues | None = None  # set by a successful Init, before any work
        self.handler: HandlerTask | None = None  # a Kapacitor Handler script's task
        self._compute_batch: Callable[[MicroBatch], None] = self._not_adopted
        self._prepared: _Prepared | None = None  # the UDF's job and kind of task tables, at the first micro-batch
        self.computing = 0  # points of the micro-batches being computed
        # A micro-batch taken to chain and not chained: it waits here, not in the agent's
        # queue, until the one computing is done (the task's status counts its wait).
        self.held: MicroBatch | None = None
        self.abandoned = False  # the agent gave up waiting: drop the rest
        # The next micro-batch, taken while one computes if it is the next work and ready now
        # (the agent's: it reads the input ahead for it), to chain behind it on the engine.
        self.take_next: Callable[[], MicroBatch | None] = _no_next_micro_batch

    def adopt(self, spec: UDFSpec) -> None:
        """The UDF the task serves (a stream_fn or batch_fn target's, once its Init named it):
        how its micro-batches are computed is chosen here, once (the kind of task tables at
        the first micro-batch, to keep pyarrow off the Info path)."""
        self.spec = spec
        self._prepared = None
        if spec.handler is not None:
            if self.handler is None:
                from udf_agent.runtime.handler_task import HandlerTask

                self.handler = HandlerTask(spec.handler)
            self._compute_batch = self._compute_handler
        else:
            self._compute_batch = self._compute

    def run(self, item: Compute | TakeSnapshot | Restore | TakeCheckpoint) -> None:
        if isinstance(item, Compute):
            self._compute_batch(item.batch)
        elif isinstance(item, TakeSnapshot):
            self._snapshot()
        elif isinstance(item, Restore):
            self._restore(item.snapshot)
        else:
            self._checkpoint(item)

    def end(self) -> None:
        """The task is over: a Handler script's handler is let go."""
        if self.handler is not None and self.spec is not None:
            self.handler.end(self.engines.engine_for(self.spec))

    def _loaded(self) -> UDFSpec:
        assert self.spec is not None  # known before any work reaches the compute thread
        return self.spec

    @staticmethod
    def _not_adopted(batch: MicroBatch) -> None:
        raise AssertionError("no work reaches the compute thread before the UDF is known")

    def _prepare(self, spec: UDFSpec) -> _Prepared:
        from udf_agent.compute.contract import Job
        from udf_agent.runtime.tasks import task_tables_for

        assert self.options is not None  # points are refused before a successful Init
        return _Prepared(Job(spec, self.options.raw(), self.labels.task_id, self.labels.node_id), task_tables_for(spec))

    def _compute(self, batch: MicroBatch) -> None:
        link: _Link | None = self._take(batch)
        try:
            while link is not None:
                chained = link.task_tables.single_slice()
                if chained is None:
                    self._compute_link(link)
                    return
                link = self._compute_chain(link, chained)
                if link is not None:  # held while the chain computed: its input waited until now
                    self.held = None
                    self.stats.micro_batch_taken(time.monotonic() - link.batch.opened_at)
        finally:
            self.held = None

    def _take(self, batch: MicroBatch) -> _Link:
        spec = self._loaded()
        if self._prepared is None:
            self._prepared = self._prepare(spec)
        started = time.monotonic()
        self.stats.micro_batch_taken(started - batch.opened_at)
        task_tables = self._prepared.task_tables(batch, self.groups, hotpath.kernels())
        return _Link(batch, task_tables, self.engines.engine_for(spec, batch.count), started)

    def _job(self) -> Job:
        assert self._prepared is not None  # made by the first _take
        return self._prepared.job

    def _compute_link(self, link: _Link) -> None:
        """The micro-batch slice after slice, then its output."""
        job = self._job()
        self.computing = link.batch.count
        try:
            for tasks in link.task_tables:
                if not self._compute_slice(job, link.engine, tasks, link.task_tables, link.done) or self.abandoned:
                    break
        finally:
            self.computing = 0
        if not self.abandoned:
            self._output(link)

    def _compute_chain(self, first: _Link, tasks: StreamTasks) -> _Link | None:
        """``first``'s one slice on its engine's chain (``Engine.chain_stream``), with each
        micro-batch that is the next work and ready while one computes sent behind it, when its
        engine is the same and none of its groups is in a micro-batch still out (its history
        would be the one before that micro-batch) and it is small enough to be sent while the
        worker answers (``CHAINED_SLICE_BYTES``); each output in turn. What the chain did
        not answer (its engine failed) is computed as any micro-batch is. The micro-batch
        taken and not chained, to compute next."""
        job = self._job()
        out: deque[tuple[_Link, StreamTasks]] = deque([(first, tasks)])
        unchained: _Link | None = None
        broken: list[BaseException] = []  # an error of our own while taking the next: not the engine's

        def follow() -> StreamTasks | None:
            nonlocal unchained
            if self.abandoned or unchained is not None:
                return None
            batch = self.take_next()
            if batch is None:
                return None
            try:
                link = self._take(batch)
            except BaseException as exc:
                broken.append(exc)
                raise
            following = link.task_tables.single_slice() if link.engine is first.engine else None
            if following is None or following.payload_bytes() > CHAINED_SLICE_BYTES or any(not set(following.keys).isdisjoint(sent.keys) for _, sent in out):
                unchained, self.held = link, batch
                return None
            out.append((link, following))
            self.computing += batch.count
            return following

        self.computing = first.batch.count
        chain = first.engine.chain_stream(job, tasks, self.stats, follow)
        try:
            while out:
                try:
                    results = next(chain)
                except StopIteration:
                    break
                except Exception as exc:
                    if broken:
                        raise  # the micro-batch taken is not the engine's to lose: the task fails, saying why
                    if isinstance(exc, ComputeFailed):  # the first not answered: computed again, it would fail again
                        link, failed = out.popleft()
                        self.computing -= link.batch.count
                        self._engine_failed(job, exc, failed, link.task_tables, link.done)
                        self._output(link)
                    log.warning("chained micro-batches' engine call failed (%s): the %d not answered are computed one by one", first_line(exc), len(out))
                    break
                link, computed = out.popleft()
                self.computing -= link.batch.count
                if self.abandoned:
                    return None
                self._keep_results(job, computed, link.task_tables, results, link.done)
                self._output(link)
        finally:
            chain.close()  # what is still out is answered and dropped
            self.computing = 0
        while out:
            self._compute_link(out.popleft()[0])
        return unchained

    def _output(self, link: _Link) -> None:
        """The micro-batch's output, queued; UDFError if a group's failure ends the task."""
        done, engine = link.done, link.engine
        self.groups.evict()
        # In arrival order only when every group gave one frame per new point and none failed.
        import numpy as np

        from udf_agent.runtime.output import output_pieces

        self.stats.micro_batches += 1
        counts = np.concatenate(done.counts) if done.counts else np.zeros(0, np.int64)
        self.stats.points_out += int(counts.sum())
        self.stats.computed = engine.name
        in_order_of = link.task_tables.arrival if done.failure is None and not done.set_aside else None
        for piece in output_pieces(done.frames, counts, in_order_of, hotpath.kernels()):
            self.writer.send_now(piece)
        self.stats.compute_seconds.observe(time.monotonic() - link.started)  # task tables to output queued
        if done.failure is not None:
            log.error("%s", done.failure)
            raise UDFError(_error_summary(done.failure))
        if log.isEnabledFor(logging.DEBUG):  # its arguments cost a numpy call and a clock read a micro-batch
            log.debug(
                "micro-batch: %d point(s) in %d task(s) -> %d point(s) in %.3f s %s",
                link.batch.count, len(counts), counts.sum(), time.monotonic() - link.started, engine.name,
            )

    def _compute_handler(self, batch: MicroBatch) -> None:
        from udf_agent.runtime.handler_task import HandlerFailed

        assert self.handler is not None and isinstance(batch, HandlerMicroBatch)
        spec = self._loaded()
        started = time.monotonic()
        self.stats.micro_batch_taken(started - batch.opened_at)
        self.computing = batch.count
        try:
            outcome = self.handler.compute(batch, self.engines.engine_for(spec), self.stats)
        except HandlerFailed as failed:
            message, output = failed.args
            if output:
                self.writer.send(output)
            log.error("%s", message)
            raise UDFError(message) from None
        finally:
            self.computing = 0
        self.stats.micro_batches += 1
        self.stats.computed = self.handler.where
        self.stats.points_out += outcome.written
        if outcome.output:
            self.writer.send(outcome.output)
        self.stats.compute_seconds.observe(time.monotonic() - started)

    def _compute_slice(self, job: Job, engine: Engine, tasks: Tasks, task_tables: TaskTables, done: _Computed) -> bool:
        """Runs one slice of tasks and keeps its groups' new history and state; False once a
        failure ends the micro-batch (``done.failure``)."""
        try:
            results = task_tables.run(engine, job, tasks, self.stats)
        except Exception as exc:
            self._engine_failed(job, exc, tasks, task_tables, done)
            return True
        if self.abandoned:
            return False
        return self._keep_results(job, tasks, task_tables, results, done)

    def _engine_failed(self, job: Job, exc: Exception, tasks: Tasks, task_tables: TaskTables, done: _Computed) -> None:
        """The engine failed a slice: UDFError with --on-error fail, else its points set aside."""
        if isinstance(exc, EngineStartError):
            log.error("compute engine failed: %s", exc)
        else:
            log.error("compute engine failed", exc_info=exc)
        keys = task_tables.keys(tasks)
        every = range(len(keys))
        points = sum(task_tables.points_in(tasks, every))
        message = f"compute engine failed on {len(keys)} group(s), {points} point(s): {first_line(exc)}"
        if self.config.on_error == "fail":
            raise UDFError(message) from exc
        self._set_aside(job.spec.name, message, task_tables.points(tasks, every), points)
        done.set_aside = True

    def _keep_results(self, job: Job, tasks: Tasks, task_tables: TaskTables, results: ResultColumns, done: _Computed) -> bool:
        """Keeps a slice's groups' new history and state and its output frames; False once a
        failure ends the micro-batch (``done.failure``)."""
        keys = task_tables.keys(tasks)
        outputs = results.output
        errors: list[str | None] = [None] * len(keys) if results.errors.all_missing() else results.errors.texts()
        bad = [i for i, error in enumerate(errors) if error is not None]
        if bad and self.config.on_error != "fail":
            # The failed groups are set aside; the others go on as if nothing happened.
            more = f" (and {len(bad) - 1} more group(s))" if len(bad) > 1 else ""
            points = sum(task_tables.points_in(tasks, bad))
            first_error = errors[bad[0]]
            assert first_error is not None
            self._set_aside(job.spec.name, _error_summary(first_error) + more, task_tables.points(tasks, bad), points, first_error + more)
            outputs = outputs.without(bad)
            done.set_aside = True
            bad = []
        ended = bad[0] if bad else len(keys)
        for key, history, state, error in zip(keys[:ended], results.histories.tolist(), results.states.texts(), errors):
            if error is None:  # a set-aside group keeps what it had
                self.groups.keep(key, history, state)
        # The frames are copied out now: the results' buffers, histories included, are let go.
        kept = outputs.slice(0, ended)
        done.frames.append((kept.data.tobytes(), kept.ends))
        done.counts.append(results.emitted[:ended])
        if bad:
            done.failure = errors[bad[0]]
            return False
        return True

    def _set_aside(self, udf_name: str, summary: str, points: list[bytes], count: int, detail: str | None = None) -> None:
        """``--on-error skip`` or ``dead-letter``: failed input is logged and counted (and written out)."""
        self.stats.skipped += count
        self.stats.last_error = summary
        where = ""
        if self.config.on_error == "dead-letter" and self.config.dead_letter_dir is not None:
            from udf_agent.runtime.deadletter import write_dead_letter

            try:
                where = f"; written to {write_dead_letter(self.config.dead_letter_dir, udf_name, detail or summary, points)}"
            except OSError as exc:
                where = f"; the dead letter could not be written: {exc}"
        log.error("UDF failure set aside (--on-error %s): %d point(s), %d so far: %s%s", self.config.on_error, count, self.stats.skipped, summary, where)

    def _options_fingerprint(self) -> dict[str, Any] | None:
        """The options snapshots are checked against; None before a successful Init
        (Kapacitor may send Restore after a refused Init)."""
        return self.options.raw() if self.options is not None else None

    def _send(self, replies: list[Event]) -> None:
        """The session's replies, behind the output before them."""
        for reply in replies:
            assert isinstance(reply, Send)
            self.writer.send(reply.frame)

    def _snapshot(self) -> None:
        data = self.groups.snapshot(self._loaded().name, self._options_fingerprint())
        self._send(self.replies.snapshot_taken(data))

    def _checkpoint(self, item: TakeCheckpoint) -> None:
        """The task's state after everything before ``item``, to its relay, behind that input's output."""
        assert self.checkpoints is not None
        spec = self._loaded()
        started = time.monotonic()
        if self.handler is not None:
            state = self.handler.checkpoint(self.engines.engine_for(spec), self.stats)

            def write_state(out: bytearray) -> None:
                out += state
        else:
            name, options = spec.name, self._options_fingerprint()

            def write_state(out: bytearray) -> None:
                self.groups.snapshot_into(out, name, options)

        message = self.checkpoints.sink.checkpoint_message(item.input_bytes, item.init_frame, write_state)
        self.writer.send(message)
        took = time.monotonic() - started
        self.stats.checkpointed(took, len(message))
        self.checkpoints.took(took)

    def _restore(self, data: bytes) -> None:
        from udf_agent.runtime.snapshot import SnapshotError

        spec = self._loaded()
        if self.handler is not None:  # a relay's checkpoint (a Handler's own restores go to it)
            self.handler.adopt(data)
            self._send(self.replies.restored(None))
            return
        try:
            restored = self.groups.restore(spec.name, data, self._options_fingerprint())
        except SnapshotError as exc:
            log.error("restore refused: %s", exc)
            self._send(self.replies.restored(f"restore refused: {exc}"))
        else:
            log.info("restored state of %d group(s)", restored)
            self._send(self.replies.restored(None))


def _error_summary(error: str) -> str:
    """'UDF x failed on group g: ValueError: boom' from a full traceback."""
    lines = [line for line in error.splitlines() if line.strip()]
    return f"{lines[0]} {lines[-1]}" if len(lines) > 1 else error
