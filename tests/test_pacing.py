"""The read pacer: a pause only while input flows in small reads; and the reader, while a
micro-batch computes, leaves input unread until it is done (but answers keepalives)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pandas as pd
import pytest

from udf_agent.api import Context, stream_udf
from udf_agent.compute.engine import LocalEngine
from udf_agent.runtime import inbox
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.engines import Engines
from udf_agent.runtime.pacing import PAUSE, SMALL_READ, STREAM_WINDOW, SUSTAINED, ReadPacer, StreamWatch
from udf_agent.testing import InProcessAgent


def test_fast_input_is_a_stream_while_every_window_has_it_and_a_read_after_a_quiet_window_starts_anew():
    watch = StreamWatch()
    for step in range(4):  # 200 KB every 10 ms: 20 MB/s
        watch.read(200_000, step * 0.01)
    assert watch.streaming(0.03) and watch.lasted(0.03) == pytest.approx(0.03)
    # A read held off for less than a window brings what came meanwhile: the spell goes on.
    watch.read(400_000, 0.03 + STREAM_WINDOW * 0.9)
    assert watch.streaming(0.03 + STREAM_WINDOW * 0.9)
    # A second later, nothing read between: the burst it brings is no stream, whatever its size.
    watch.read(200_000, 1.0)
    assert not watch.streaming(1.0) and watch.lasted(1.0) == 0.0
    watch.read(200_000, 1.0 + SUSTAINED)  # ... until it has come fast for SUSTAINED
    assert watch.streaming(1.0 + SUSTAINED)


def test_a_trickle_is_never_paused():
    pacer = ReadPacer()
    # A point every millisecond (1 k points/s), each in two reads as Kapacitor writes it: the
    # body's read follows its length's at once.
    pauses = [pacer.after_read(size, t / 1000 + dt) for t in range(100) for size, dt in ((2, 0.0), (150, 0.00002))]
    assert pauses == [0.0] * 200


def test_back_to_back_small_reads_pause_once_they_last_and_keep_pausing_while_input_flows():
    pacer = ReadPacer()
    now = 0.0
    assert pacer.after_read(300, now) == 0  # the first read after a quiet spell
    now += 0.00003
    assert pacer.after_read(300, now) == 0  # two in a row may be one point's two writes
    # A burst (a couple of thousand points: ~SUSTAINED of back-to-back reads) is read at once to its end.
    while now + 0.00003 < SUSTAINED:
        now += 0.00003
        assert pacer.after_read(300, now) == 0
    while not pacer.after_read(300, now):  # past that, the flow is a stream: paused
        now += 0.00003
        assert now < 2 * SUSTAINED
    pauses = []
    for _ in range(50):
        now += 0.00003  # read, handled, and the next read returns at once
        pause = pacer.after_read(12_000, now)  # what gathered during the pause: 100 points at 100 k/s
        pauses.append(pause)
        now += pause
    assert pauses == [PAUSE] * 50  # the pause itself does not end the flow


def test_a_burst_is_never_paused_and_a_pause_that_gathers_a_trickle_ends_the_flow():
    """A burst (a writer's flush, forwarded back to back) is read to its end without a pause:
    its rest would only wait. And at 1 k points/s after a flow, the pause gathers two points,
    read at once after it: counted as flowing, every read from then on was paused (the relay,
    2 ms, made each point wait ~1 ms more)."""
    pacer = ReadPacer(pause=0.002)
    now = 0.0
    assert [pacer.after_read(181, now + i * 0.00003) for i in range(300)] == [0.0] * 300  # 9 ms
    now += 0.5
    pauses = []
    while not pauses or not pauses[-1]:  # a flow that lasts is paused
        pauses.append(pacer.after_read(181, now))
        now += 0.00003
    assert pauses[-1] == 0.002 and now > 0.5 + SUSTAINED
    now += 0.002  # paused: two points came meanwhile, read at once
    assert pacer.after_read(362, now) == 0.0
    # The trickle goes on, a point a millisecond, read as it comes.
    assert [pacer.after_read(181, now + t / 1000) for t in range(1, 100)] == [0.0] * 99


def test_a_big_read_is_not_paused_after():
    pacer = ReadPacer(sustained=0.0)
    for i in range(5):  # a stream
        pacer.after_read(12_000, i * 0.00001)
    assert pacer.after_read(SMALL_READ, 0.00006) == 0
    assert pacer.after_read(300, 0.00007) == PAUSE


# ---- the reader while a micro-batch computes (``Inbox._gather_while_computing``) ----

COMPUTE_SECONDS = 0.6
# Cleared, a micro-batch of _slow_echo does not end until the test sets it: what the test
# sends meanwhile comes during the compute however slow the machine.
_compute_may_end = threading.Event()
_compute_may_end.set()


@stream_udf()
def _slow_echo(df: pd.DataFrame, ctx: Context) -> pd.DataFrame:
    """Echoes its points after a pause: a micro-batch that computes long enough to send more meanwhile."""
    time.sleep(COMPUTE_SECONDS)
    _compute_may_end.wait(60)
    return df


class _CountedReads:
    """The agent's connection, counting its reads that brought input: the reader's (``reads``)
    and the compute thread's reads ahead (``reads_ahead``)."""

    def __init__(self, connection: Any):
        self.reads = 0
        self.reads_ahead = 0
        self._read_into = connection.read_into
        self._read_ready_into = connection.read_ready_into
        connection.read_into = self.read_into
        connection.read_ready_into = self.read_ready_into

    def read_into(self, buffer: memoryview) -> int:
        read = int(self._read_into(buffer))
        self.reads += read > 0
        return read

    def read_ready_into(self, buffer: memoryview) -> int | None:
        read = self._read_ready_into(buffer)
        self.reads_ahead += bool(read)
        return read


def _agent_computing_its_first_point(**config: Any) -> tuple[InProcessAgent, _CountedReads]:
    agent = InProcessAgent(_slow_echo, Engines(LocalEngine), AgentConfig(drain_timeout=60, **config))
    assert agent.driver.init().success
    counted = _CountedReads(agent.connection)
    agent.driver.point(**_point(0))
    deadline = time.monotonic() + 30
    while not agent.agent.runner.computing:  # the first micro-batch is computing
        assert time.monotonic() < deadline, "the first point was never computed"
        time.sleep(0.005)
    return agent, counted


def _point(number: int) -> dict[str, Any]:
    return {"time": number, "name": "cpu", "group": "", "fieldsDouble": {"value": float(number)}}


def test_points_that_come_while_a_micro_batch_computes_are_read_once_it_is_done(monkeypatch):
    monkeypatch.setattr(inbox, "COMPUTE_GATHER", 60.0)  # gather for as long as compute takes
    _compute_may_end.clear()
    try:
        agent, counted = _agent_computing_its_first_point()
        reads_before = counted.reads
        for number in range(1, 6):  # five points, each written on its own during the compute
            agent.driver.point(**_point(number))
    finally:
        _compute_may_end.set()
    agent.driver.responses.wait_for("point", 6, timeout=60)
    # One read takes all five once the first micro-batch is out (a reader that read each as
    # it came made five), and the compute thread makes it (``Inbox.read_ahead``): the reader
    # is not woken for it. The second micro-batch holds them all.
    assert (counted.reads - reads_before, counted.reads_ahead) == (0, 1)
    assert agent.agent.stats.micro_batches == 2
    assert [point.time for point in agent.driver.responses.of("point")] == list(range(6))
    assert agent.finish() == 0


def test_past_the_budget_after_a_read_ahead_the_reader_waits_for_room_with_heartbeats(monkeypatch):
    monkeypatch.setattr(inbox, "COMPUTE_GATHER", 60.0)  # the compute thread reads what comes meanwhile
    agent, counted = _agent_computing_its_first_point(max_batch_points=1, max_pending_points=2)
    for number in range(1, 6):  # five points over a budget of two, left unread during the compute
        agent.driver.point(**_point(number))
        time.sleep(0.02)
    agent.driver.responses.wait_for("point", 6, timeout=60)
    assert counted.reads_ahead == 1  # the compute thread took all five in, past the budget
    # The reader then waited for room, feeding Kapacitor's watchdog while the four micro-batches
    # over the budget computed (~2 s), instead of blocking in a read with no input left to come.
    heartbeats = [k.time for k in agent.driver.responses.of("keepalive") if k.time > 10**18]
    assert len(heartbeats) >= 2, heartbeats
    assert [point.time for point in agent.driver.responses.of("point")] == list(range(6))
    assert agent.finish() == 0


def test_broken_framing_found_by_a_read_ahead_ends_the_task_after_the_points_before_it(monkeypatch):
    monkeypatch.setattr(inbox, "COMPUTE_GATHER", 60.0)  # the compute thread reads what comes meanwhile
    agent, counted = _agent_computing_its_first_point()
    agent.driver.point(**_point(1))
    agent.driver.send_raw(b"\x80" * 11)  # a length varint longer than ten bytes
    errors = agent.driver.responses.wait_for("error", timeout=60)
    assert "frame 4 starts with a malformed varint length" in errors[0].error
    assert counted.reads_ahead == 1
    # Both points accepted before the fault came out, before the error.
    assert [point.time for point in agent.driver.responses.of("point")] == [0, 1]
    assert agent.driver.responses.kinds()[-1] == "error"
    assert agent.finish() == 1


def test_a_keepalive_is_answered_while_a_micro_batch_computes():
    agent, _ = _agent_computing_its_first_point()
    agent.driver.keepalive(7)
    answered = agent.driver.responses.wait_for("keepalive", 1, timeout=60)
    # The gather is bounded (COMPUTE_GATHER): the answer does not wait for the micro-batch.
    assert answered and not agent.driver.responses.of("point"), "the keepalive waited for compute"
    assert agent.finish() == 0
