"""The agent's work queue: what the compute thread may take while a micro-batch computes."""

from __future__ import annotations

import threading
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


class CountedCondition(threading.Condition):
    """A Condition that counts its notify_all calls (each wakes every waiting thread)."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.wakes = 0

    def notify_all(self) -> None:
        self.wakes += 1
        super().notify_all()


def test_a_reader_gathering_input_is_woken_only_once_no_micro_batch_is_left_to_compute():
    """Woken while a micro-batch still computes, the reader would only find that and wait
    again, costing the compute thread a preemption and the GIL; a reader waiting for room
    (not gathering) is woken whenever an item is taken."""
    work = WorkQueue()
    work.cond = counted = CountedCondition()
    with work.cond:
        for item in (_compute(), _compute(), TakeSnapshot()):
            work.put(item)
    never_due = lambda now: None  # noqa: E731

    def close() -> None:
        raise AssertionError("nothing is open")

    assert isinstance(work.take(never_due, close, lambda: False), Compute)
    assert counted.wakes == 1  # no reader gathering yet: whoever waits for room is told

    def gather() -> None:
        with work.cond:
            work.reader_waits_while(work.computing, lambda: time.monotonic() + 60)

    reader = threading.Thread(target=gather, daemon=True)
    reader.start()
    deadline = time.monotonic() + 30
    while not work.reader_waits():
        assert time.monotonic() < deadline, "the reader never began gathering"
        time.sleep(0.01)
    assert work.take_micro_batch_now(never_due, close) is not None  # chained behind the first
    assert isinstance(work.take(never_due, close, lambda: False), TakeSnapshot)  # both done
    assert counted.wakes == 2  # once: when no micro-batch was left, not when the second was taken
    reader.join(30)
    assert not reader.is_alive()


def test_the_compute_thread_closing_the_open_micro_batch_to_take_it_wakes_nobody_for_it():
    """The compute thread closes a due micro-batch only to take it next: waking the reader for
    it (as closing one used to) sent the reader after the GIL to find nothing new, a futex wake
    and a preemption a micro-batch at a trickle."""
    import socket

    from udf_agent import udf_pb2
    from udf_agent.library.builtins import moving_avg
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.inbox import Inbox
    from udf_agent.runtime.stats import TaskStats
    from udf_agent.runtime.transports import SocketConnection
    from udf_agent.runtime.writer import Writer
    from udf_agent.wire.frames import encode_frame

    class Owner:
        def started(self, event: object) -> None:
            pass

        def failed(self, message: str) -> None:
            raise AssertionError(message)

        def input_ended(self) -> None:
            pass

    ours, theirs = socket.socketpair()
    connection = SocketConnection(ours)
    work = WorkQueue()
    inbox = Inbox(connection, work, Writer(connection), TaskStats(), AgentConfig(), Owner())
    inbox.adopt(moving_avg)
    init = udf_pb2.InitRequest(options=[udf_pb2.Option(name="field", values=[udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue="v")]), udf_pb2.Option(name="size", values=[udf_pb2.OptionValue(type=udf_pb2.INT, intValue=3)])])
    point = udf_pb2.Point(time=1, name="m", group="", fieldsDouble={"v": 1.0})
    inbox.session.receive_data(encode_frame(udf_pb2.Request(init=init)) + encode_frame(udf_pb2.Request(point=point)))
    with work.cond:
        assert inbox.dispatch(inbox.session.next_events(time.monotonic()))
    assert inbox.session.open_micro_batch() is not None  # the point waits in the open micro-batch
    work.cond = counted = CountedCondition()
    taken = work.take_micro_batch_now(lambda now: now, inbox.close_micro_batch)  # due: closed and taken
    assert isinstance(taken, Compute) and taken.batch.count == 1
    assert counted.wakes == 1  # the take's own (room for a reader waiting for it), none for the closing
    ours.close()
    theirs.close()
