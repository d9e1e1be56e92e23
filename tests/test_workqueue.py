"""The agent's work queue: what the compute thread may take while a micro-batch computes."""

from __future__ import annotations

import time

from udf_agent.runtime.events import Compute, TakeSnapshot
from udf_agent.runtime.workqueue import WorkQueue
from udf_agent.wire.batches import StreamMicroBatch


def _compute() -> Compute:
    return Compute(StreamMicroBatch(opened_at=time.monotonic()))


def test_a_micro_batch_is_taken_early_only_when_it_is_the_next_work():
    work = WorkQueue()
    first, second = _compute(), _compute()
    with work.cond:
        for item in (first, TakeSnapshot(), second):
            work.put(item)
    never_due = lambda now: None  # noqa: E731

    def close() -> None:
        raise AssertionError("nothing is open")

    assert work.take_micro_batch_now(never_due, close) is first
    assert work.take_micro_batch_now(never_due, close) is None  # a snapshot is next: its order holds
    assert work.points() == 0 and work.computing()  # the second is still queued


def test_the_open_micro_batch_is_closed_and_taken_once_due():
    work = WorkQueue()
    closed = []
    opened = _compute()

    def close() -> None:
        closed.append(True)
        work.put(opened)

    assert work.take_micro_batch_now(lambda now: now + 1.0, close) is None and not closed  # not due yet
    assert work.take_micro_batch_now(lambda now: now, close) is opened and closed
    assert not work.computing()  # taken: none queued
