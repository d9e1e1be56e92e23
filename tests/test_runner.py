"""The compute thread's runner, on its own: what it measures of a micro-batch, and a relayed
task's checkpoint schedule."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from udf_agent import udf_pb2
from udf_agent.compute.engine import CHAINED_SLICE_BYTES, ComputeFailed, LocalEngine
from udf_agent.library.builtins import moving_avg
from udf_agent.logs import TaskLabels
from udf_agent.options import parse_options
from udf_agent.runtime.checkpoints import CHECKPOINT_INPUT_BYTES, CHECKPOINT_INTERVAL, Checkpoints
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.events import Compute
from udf_agent.runtime.runner import MicroBatchRunner, UDFError
from udf_agent.runtime.stats import TaskStats
from udf_agent.testing import grouped_point, option
from udf_agent.wire.batches import StreamMicroBatch
from udf_agent.wire.frames import FrameDecoder

WRITER_WAIT = 0.3


class _KapacitorNotReading:
    """A writer whose queue is full: each frame waits, as when Kapacitor does not read."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, frame: bytes, urgent: bool = False, wait: bool = True) -> None:
        time.sleep(WRITER_WAIT)
        self.frames.append(frame)

    def send_now(self, frame: bytes) -> None:
        self.send(frame)  # a full queue: nothing goes out at once


def test_a_micro_batchs_compute_time_runs_until_its_output_is_queued():
    """udf_agent_compute_seconds is "from taking it to queueing its output": a compute thread
    held up handing output to the writer shows in it, and so does building task tables."""
    stats = TaskStats()
    writer = _KapacitorNotReading()
    runner = MicroBatchRunner(AgentConfig(), Engines(LocalEngine), writer, replies=None, labels=TaskLabels(), stats=stats)  # type: ignore[arg-type]
    runner.options = parse_options(moving_avg.options, [option("field", "value"), option("size", 2)])
    runner.adopt(moving_avg)

    def micro_batch(first: int) -> Compute:
        batch = StreamMicroBatch(opened_at=time.monotonic())
        for t in range(first, first + 3):
            point = grouped_point(t, "a", float(t))
            batch.append(point.group, point.SerializeToString())
        return Compute(batch)

    runner.run(micro_batch(0))  # the first loads pandas and the compiled codec
    before, written = stats.compute_seconds.sum, len(writer.frames)
    runner.run(micro_batch(3))
    assert len(writer.frames) > written and stats.micro_batches == 2
    assert stats.compute_seconds.sum - before >= WRITER_WAIT * (len(writer.frames) - written)


def test_a_relayed_tasks_checkpoints_are_due_by_time_or_by_input_and_a_slow_one_spaces_the_next() -> None:
    checkpoints = Checkpoints(sink=None, now=100.0)  # type: ignore[arg-type]
    assert not checkpoints.due(100.0 + CHECKPOINT_INTERVAL - 0.1, CHECKPOINT_INPUT_BYTES - 1)
    assert checkpoints.due(100.0 + CHECKPOINT_INTERVAL, 0)
    assert checkpoints.due(100.1, CHECKPOINT_INPUT_BYTES)
    checkpoints.queued(101.0, CHECKPOINT_INPUT_BYTES)
    assert not checkpoints.due(102.0, 2 * CHECKPOINT_INPUT_BYTES - 1)  # input counts from the last one
    assert checkpoints.due(102.0, 2 * CHECKPOINT_INPUT_BYTES)
    checkpoints.took(1.0)  # a checkpoint that took 1 s: the next is 50 s away (2 % of the time)
    checkpoints.queued(110.0, 2 * CHECKPOINT_INPUT_BYTES)
    assert not checkpoints.due(110.0 + 49.9, 2 * CHECKPOINT_INPUT_BYTES)
    assert checkpoints.due(160.0, 2 * CHECKPOINT_INPUT_BYTES)
    checkpoints.took(0.001)  # a fast one: back to the interval
    assert checkpoints.interval == CHECKPOINT_INTERVAL


class _Collecting:
    """A writer that takes every frame at once."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def send(self, frame: bytes, urgent: bool = False, wait: bool = True) -> None:
        self.frames.append(frame)

    def send_now(self, frame: bytes) -> None:
        self.frames.append(frame)


def _moving_avg_runner(engines: Engines, config: AgentConfig | None = None) -> MicroBatchRunner:
    runner = MicroBatchRunner(config or AgentConfig(), engines, _Collecting(), replies=None, labels=TaskLabels(), stats=TaskStats())  # type: ignore[arg-type]
    runner.options = parse_options(moving_avg.options, [option("field", "value"), option("size", 2)])
    runner.adopt(moving_avg)
    return runner


def _micro_batch(points: list[tuple[int, str]]) -> StreamMicroBatch:
    batch = StreamMicroBatch(opened_at=time.monotonic())
    for t, group in points:
        point = grouped_point(t, group, float(t))
        batch.append(point.group, point.SerializeToString())
    return batch


# The second shares no group with the first: chained behind it. The third shares "c" with the
# second, still out when it is taken: computed after it, and the fourth chained behind it. Only
# the first has two groups: a task's later micro-batch of several groups is cut into parts, not
# chained, once its slices measured slow while another task (an earlier test's) was active.
CHAIN = [[(0, "a"), (1, "b")], [(2, "c")], [(3, "c")], [(4, "d")]]


def _run_chain(runner: MicroBatchRunner, taken: Callable[[], None] | None = None) -> list[bytes]:
    batches = [_micro_batch(points) for points in CHAIN]

    def take_next() -> StreamMicroBatch | None:
        if taken is not None:
            taken()
        return batches.pop(0) if batches else None

    runner.take_next = take_next
    while batches:  # as the agent's compute loop takes what the runner left queued
        runner.run(Compute(batches.pop(0)))
    frames = runner.writer.frames  # type: ignore[attr-defined]
    assert isinstance(frames, list)
    return frames


def _output_times(frames: list[bytes]) -> list[int]:
    return [response.point.time for frame in frames for response in FrameDecoder(udf_pb2.Response).feed(frame)]


@pytest.mark.spark
def test_micro_batches_ready_while_one_computes_are_chained_unless_one_out_shares_a_group(spark_engine):
    runner = _moving_avg_runner(Engines(lambda: spark_engine))
    held = []
    frames = _run_chain(runner, lambda: held.append(spark_engine.resident.held_by(runner.stats)))
    # Each next micro-batch was taken while one computed on the worker the chain held.
    assert held == [1, 1, 1, 1]
    unchained = _moving_avg_runner(Engines(LocalEngine))
    expected = []
    for points in CHAIN:
        unchained.run(Compute(_micro_batch(points)))
    expected = unchained.writer.frames  # type: ignore[attr-defined]
    assert b"".join(frames) == b"".join(expected)
    assert _output_times(frames) == list(range(5))
    assert runner.stats.micro_batches == len(CHAIN)


@pytest.mark.spark
def test_a_micro_batch_too_big_to_send_while_the_worker_answers_is_not_chained(spark_engine):
    # Two micro-batches of 8,000 groups each (neither shares a group; not worth splitting), each
    # slice and each answer several times the link's buffers. Chained, the second would be sent
    # while the worker writes the first's answer, each waiting for the other to read until the
    # batch timeout, and the worker lost; it is computed after the first instead.
    groups = 8_000
    runner = _moving_avg_runner(Engines(lambda: spark_engine))
    first = _micro_batch([(t, f"a{t}") for t in range(groups)])
    second = _micro_batch([(t, f"b{t}") for t in range(groups)])
    weighed = _moving_avg_runner(Engines(LocalEngine))._take(_micro_batch([(t, f"b{t}") for t in range(groups)]))
    assert weighed.task_tables.single_slice().payload_bytes() > 8 * CHAINED_SLICE_BYTES
    queued = [second]
    runner.take_next = lambda: queued.pop(0) if queued else None
    losses = spark_engine.resident.worker_losses
    runner.run(Compute(first))
    assert not queued  # taken while the first computed, not chained: computed next, in order
    assert spark_engine.resident.worker_losses == losses
    assert sorted(_output_times(runner.writer.frames)) == sorted(list(range(groups)) * 2)  # type: ignore[attr-defined]


class _ChainBreaksAfterOne(LocalEngine):
    """Answers a chain's first slice and takes the next, then fails, as an engine whose worker
    failed outside the UDF does."""

    def chain_stream(self, job, tasks, tenant, follow):  # type: ignore[no-untyped-def]
        following = follow()
        yield self.run_stream(job, tasks, tenant)
        if following is not None:
            raise RuntimeError("resident worker 0 failed outside the UDF")


def test_what_a_failed_chain_did_not_answer_is_computed_as_any_micro_batch_is():
    runner = _moving_avg_runner(Engines(_ChainBreaksAfterOne))
    frames = _run_chain(runner)
    assert _output_times(frames) == list(range(5))  # nothing taken was lost, nothing twice
    assert runner.stats.micro_batches == len(CHAIN)


def test_an_error_of_the_runners_own_taking_the_next_micro_batch_fails_the_task_not_the_engine():
    """The micro-batch taken to chain is no longer queued: an error making its task tables is
    raised (the task ends, saying why), never taken for the engine's and the micro-batch lost."""
    runner = _moving_avg_runner(Engines(_ChainBreaksAfterOne))
    take = runner._take

    def take_only_the_first(batch):  # type: ignore[no-untyped-def]
        if runner.stats.micro_batches or batch is not first:
            raise RuntimeError("cannot group it")
        return take(batch)

    first = _micro_batch([(0, "a")])
    runner._take = take_only_the_first  # type: ignore[method-assign]
    runner.take_next = lambda: _micro_batch([(1, "b")])
    with pytest.raises(RuntimeError, match="cannot group it"):
        runner.run(Compute(first))


class _SlowChain(LocalEngine):
    """Takes the next micro-batch as a chain does, then computes the first for ``SLOW_CALL`` s,
    noting what the runner shows it holds meanwhile."""

    held_meanwhile: list[StreamMicroBatch | None] = []

    def chain_stream(self, job, tasks, tenant, follow):  # type: ignore[no-untyped-def]
        follow()  # the second shares the first's group: held, not chained
        time.sleep(SLOW_CALL)
        self.held_meanwhile.append(self.runner.held)  # type: ignore[attr-defined]
        yield self.run_stream(job, tasks, tenant)


SLOW_CALL = 0.3


class _CrashingChain(LocalEngine):
    """Chains the next micro-batch, then fails the first for good (as the resident workers do
    when the UDF crashed a fresh worker after the first); notes every other call."""

    def __init__(self) -> None:
        super().__init__()
        self.computed: list[int] = []  # the points of each micro-batch computed outside the chain

    def chain_stream(self, job, tasks, tenant, follow):  # type: ignore[no-untyped-def]
        assert follow() is not None  # no group in common: chained behind
        raise ComputeFailed("UDF 'moving_avg': a micro-batch of 1 group(s) failed twice on Spark's resident workers")
        yield  # a generator, as chains are

    def run_stream(self, job, tasks, tenant=None):  # type: ignore[no-untyped-def]
        self.computed.append(tasks.num_rows)
        return super().run_stream(job, tasks, tenant)


@pytest.mark.parametrize("on_error", ["fail", "skip"])
def test_a_chained_micro_batch_that_failed_for_good_is_not_computed_again(on_error):
    """A micro-batch the engine failed for good (its UDF crashed a fresh worker after the
    first) is never computed again after the chain: on the resident workers that took down a
    third worker, perhaps the one a neighbour's micro-batch was waiting for. It fails as any
    engine failure does; the micro-batch chained behind it is computed on its own."""
    engine = _CrashingChain()
    runner = _moving_avg_runner(Engines(lambda: engine), AgentConfig(on_error=on_error))
    queued = [_micro_batch([(1, "b")])]
    runner.take_next = lambda: queued.pop() if queued else None
    if on_error == "fail":
        with pytest.raises(UDFError, match="failed twice on Spark's resident workers"):
            runner.run(Compute(_micro_batch([(0, "a")])))
        assert engine.computed == []
        return
    runner.run(Compute(_micro_batch([(0, "a")])))
    assert engine.computed == [1]  # the second, alone
    assert runner.stats.skipped == 1  # the first's point, set aside
    assert _output_times(runner.writer.frames) == [1]  # type: ignore[attr-defined]


def test_a_micro_batch_taken_while_one_computes_and_held_shows_its_wait():
    """A micro-batch taken to chain and held (it shares a group with the one out) is in no
    queue while the first computes: the task shows it waiting (falling behind, the points left
    if abandoned), and its input lag counts until it is computed, not until it was taken."""
    engine = _SlowChain()
    runner = _moving_avg_runner(Engines(lambda: engine))
    engine.runner = runner  # type: ignore[attr-defined]
    second = _micro_batch([(1, "a")])
    queued = [second]
    runner.take_next = lambda: queued.pop() if queued else None
    runner.run(Compute(_micro_batch([(0, "a")])))
    assert engine.held_meanwhile == [second, None]
    assert runner.held is None  # computed since
    assert runner.stats.input_lag >= SLOW_CALL  # the second's, taken at once and computed after the first
    assert _output_times(runner.writer.frames) == [0, 1]  # type: ignore[attr-defined]
