"""The compute thread's runner, on its own: what it measures of a micro-batch, and a relayed
task's checkpoint schedule."""

from __future__ import annotations

import time

from udf_agent.compute.engine import LocalEngine
from udf_agent.library.builtins import moving_avg
from udf_agent.options import parse_options
from udf_agent.runtime.checkpoints import CHECKPOINT_INPUT_BYTES, CHECKPOINT_INTERVAL, Checkpoints
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.events import Compute
from udf_agent.runtime.logs import TaskLabels
from udf_agent.runtime.runner import MicroBatchRunner
from udf_agent.runtime.stats import TaskStats
from udf_agent.testing import grouped_point, option
from udf_agent.wire.batches import StreamMicroBatch

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
