"""The micro-batch policy against arrival timelines, on a fake clock and without threads.

Each timeline is what Kapacitor writes (two writes a point: its length, then its body) and
what a reader does with it: it reads whatever has been written, spends a while on it, and
then, as the inbox does, tells the policy what it found (``input_came``; ``input_paused``
when nothing more is waiting, or has come within ``settle`` in a sustained flow). An idle compute thread takes the
open micro-batch once it is due and spends a while on it. The figures are how long each point
waits from its last write until its micro-batch is taken.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import pytest

from udf_agent.runtime.flushing import GATHER, SETTLE, FlushPolicy
from udf_agent.runtime.pacing import SUSTAINED

# Between a point's two writes, and between points of a burst, as Kapacitor's writer
# goroutine makes them (two system calls a point).
WRITE_GAP = 2e-6
POINT_GAP = 8e-6
POINT_BYTES = 120


def burst_writes(points: int, every: float, bursts: int, start: float = 0.0) -> list[float]:
    """When each point's body is written: ``bursts`` bursts of ``points`` back to back, ``every`` s apart."""
    return [start + b * every + p * POINT_GAP + WRITE_GAP for b in range(bursts) for p in range(points)]


def steady_writes(rate: float, seconds: float) -> list[float]:
    return [i / rate + WRITE_GAP for i in range(int(rate * seconds))]


@dataclass
class Timeline:
    """What the policy made of a timeline: each point's wait, and the micro-batches' sizes."""

    waits: list[float] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)

    @property
    def worst(self) -> float:
        return max(self.waits)


def play(written: list[float], policy: FlushPolicy, read_cost: float = 30e-6, compute_cost: float = 1e-3, reader_wakes_after: float = 0.0) -> Timeline:
    """Plays the reader and an idle-when-done compute thread over points written at ``written``
    (sorted; each point's body, the write that completes it). A reader that found nothing
    waiting reads ``reader_wakes_after`` after the next write (a wake-up on a quiet host)."""
    result = Timeline()
    open_points: list[float] = []  # the open micro-batch: when each of its points was written
    opened_at = 0.0
    read = 0  # points read so far
    now = 0.0
    compute_free_at = 0.0
    end = written[-1] + 10 * policy.flush_interval
    while now < end and (read < len(written) or open_points):
        # The reader: reads what has been written by now (or waits for the next write).
        if read < len(written) and written[read] <= now:
            came = bisect.bisect_right(written, now) - read
            policy.input_came(now, came * POINT_BYTES)
            if not open_points:
                opened_at = now
            open_points += written[read : read + came]
            read += came
            now += read_cost  # framing and acting on what it read
            settle = policy.settle(now)
            if not (read < len(written) and written[read] <= now + settle):
                now += settle  # waited that long for more
                policy.input_paused()
        # An idle compute thread takes the open micro-batch once it is due.
        if open_points and compute_free_at <= now and policy.due(opened_at, now) <= now:
            result.waits += [now - at for at in open_points]
            result.batches.append(len(open_points))
            open_points = []
            compute_free_at = now + compute_cost
        # The next moment anything happens: a write, the compute thread free, a due time.
        upcoming = [max(now, written[read] + reader_wakes_after)] if read < len(written) and written[read] > now else [written[read]] if read < len(written) else []
        if open_points:
            upcoming.append(max(compute_free_at, policy.due(opened_at, now)))
        now = max(now, min(upcoming)) if upcoming else end
    assert len(result.waits) == len(written), "points never taken"
    return result


POLICY = dict(flush_interval=0.5, gather=GATHER)


@pytest.mark.parametrize(
    "points, every",
    [(1, 0.001), (10, 0.01), (100, 0.1), (1_000, 1.0), (10_000, 10.0)],
    ids=["a point every 1 ms", "10 every 10 ms", "100 every 100 ms", "1,000 every s", "10,000 every 10 s"],
)
def test_a_burst_is_taken_when_the_input_pauses_not_when_the_next_one_comes(points, every):
    timeline = play(burst_writes(points, every, bursts=3), FlushPolicy(**POLICY))
    burst_takes = points * POINT_GAP  # the burst's own writes
    # No point waits for more than its burst to arrive, the reader's passes and one micro-batch
    # before it (each taken as soon as the compute thread is free): never for the next burst.
    assert timeline.worst < burst_takes + 2e-3 + 0.05 * every
    assert timeline.worst < GATHER


def test_a_burst_read_as_it_is_written_is_taken_once_it_ends():
    # The reader keeps up with the writer (each read finds the next write already there): the
    # burst gathers while it arrives and goes as one micro-batch the moment it ends.
    timeline = play(burst_writes(1_000, 1.0, bursts=1), FlushPolicy(**POLICY), read_cost=POINT_GAP * 4)
    assert timeline.batches == [1_000]
    assert timeline.worst < 1_000 * POINT_GAP + 1e-3


def test_a_burst_read_whole_long_after_the_last_one_is_no_stream():
    # The reader wakes once the writer has written a whole burst, a second after the last: each
    # burst is one read of 120 KB, and nothing was read between two. It is taken at once, never
    # held a settle time as if a stream were still flowing (it was, for 50 ms, a second ago).
    timeline = play(burst_writes(1_000, 1.0, bursts=3), FlushPolicy(**POLICY), reader_wakes_after=0.01)
    assert timeline.batches == [1_000] * 3
    assert timeline.worst < 0.01 + 1e-3 < SETTLE + 0.01


def test_a_paced_stream_is_no_pause_and_its_end_is_seen_a_settle_time_late():
    # The relay in front of a shared server sends what it read every 2 ms while Kapacitor's
    # feed flows: between two sends the server finds nothing waiting. Once the flow has lasted
    # SUSTAINED, that is no pause: the stream gathers (a worker round trip for 2 ms of input
    # would cost the throughput); a burst's end is still seen at once, a stream's SETTLE late.
    sends = [i * 0.002 for i in range(200)]  # 400 ms of a stream, in the relay's sends
    written = sorted(t + j * 1e-5 for t in sends for j in range(100))
    timeline = play(written, FlushPolicy(**POLICY))
    assert max(timeline.batches) >= 0.9 * GATHER / 0.002 * 100
    # Its first SUSTAINED is a burst, for all the reader knows: taken at each send.
    assert timeline.batches[: int(SUSTAINED / 0.002)] == [100] * int(SUSTAINED / 0.002)
    assert timeline.worst <= GATHER + 2e-3
    assert max(timeline.waits[-100:]) <= SETTLE + 0.002 + 2e-3


def test_a_long_burst_is_computed_in_growing_pieces_as_it_arrives():
    # 10,000 points in ~80 ms: a stream for all the reader can tell, yet a burst. Gathered for
    # ``gather`` its first points would wait past its end; no point waits much longer than the
    # stream had lasted when its micro-batch opened, and the end a settle time.
    timeline = play(burst_writes(10_000, 10.0, bursts=1), FlushPolicy(**POLICY))
    assert len(timeline.batches) >= 3
    assert timeline.worst < 10_000 * POINT_GAP / 2 + SETTLE + 5e-3


def test_a_trickle_never_waits_for_a_settle():
    # 1 k points/s for a second: gaps shorter than SETTLE, yet no stream.
    assert play(steady_writes(1_000, 1.0), FlushPolicy(**POLICY)).worst < 1e-4


def test_a_steady_flood_still_gathers_for_the_gather_time():
    # 100 k points/s without a pause: each read finds more waiting, so micro-batches gather
    # until they are ``gather`` old, as before (a worker round trip for a handful of points
    # would cost the throughput).
    timeline = play(steady_writes(100_000, 1.0), FlushPolicy(**POLICY))
    assert max(timeline.batches) >= 0.9 * GATHER * 100_000
    assert timeline.worst <= GATHER + 2e-3


def test_irregular_bursts_each_go_when_they_end():
    written = sorted(
        burst_writes(37, 1.0, bursts=1, start=0.0)
        + burst_writes(500, 1.0, bursts=1, start=0.013)
        + burst_writes(3, 1.0, bursts=1, start=0.0201)
        + burst_writes(2_000, 1.0, bursts=1, start=0.35)
        + burst_writes(1, 1.0, bursts=1, start=0.36)
    )
    timeline = play(written, FlushPolicy(**POLICY))
    assert timeline.worst < 2_000 * POINT_GAP + 3e-3


def test_the_flush_interval_bounds_every_wait_and_a_fixed_flush_waits_for_it():
    flood = steady_writes(100_000, 0.2)
    assert play(flood, FlushPolicy(flush_interval=0.02, gather=GATHER)).worst <= 0.02 + SETTLE + 2e-3
    # Without the adaptive flush a burst waits for the flush interval, pause or not: the user
    # asked for bigger micro-batches.
    fixed = play(burst_writes(100, 1.0, bursts=1), FlushPolicy(flush_interval=0.05, adaptive=False))
    assert fixed.worst >= 0.05 - 100 * POINT_GAP


def test_a_pause_holds_until_input_comes_again_and_a_flow_that_lasts_settles_before_a_pause():
    policy = FlushPolicy(flush_interval=0.5, gather=0.1)
    policy.input_came(10.0, 12_000)  # more may be waiting: gather (young input: SUSTAINED at most)
    assert policy.due(10.0, 10.001) == pytest.approx(10.0 + SUSTAINED)
    assert policy.settle(10.001) == 0.0  # a young flow: nothing waiting is a pause
    policy.input_paused()
    assert policy.due(10.0, 10.001) == 10.001  # at once
    policy.input_came(10.002, 12_000)  # more: it gathers again until the reader finds none waiting
    assert policy.due(10.0, 10.002) == pytest.approx(10.0 + SUSTAINED)
    for step in range(1, 201):  # the same flow, lasting at 6 MB/s: a stream
        policy.input_came(10.002 + step * SUSTAINED / 20, 6_000)
    assert policy.settle(10.003 + 10 * SUSTAINED) == SETTLE
    # A micro-batch of a young stream gathers as long as the stream had lasted when it opened
    # (a long burst goes in growing pieces); of a stream that has lasted, ``gather``.
    opened = 10.035
    assert opened + SUSTAINED < policy.due(opened, opened + 0.001) < opened + 0.1
    assert policy.due(10.19, 10.191) == pytest.approx(10.19 + 0.1)
    policy.input_paused()
    policy.input_came(11.0, 120)  # after a gap, a new flow
    assert policy.settle(11.0) == 0.0
    # The flush interval bounds the gathering; without the adaptive flush it is the only bound.
    assert FlushPolicy(flush_interval=0.01, gather=0.1).due(10.0, 10.001) == pytest.approx(10.01)
    fixed = FlushPolicy(flush_interval=0.5, adaptive=False)
    fixed.input_paused()
    assert fixed.due(10.0, 10.001) == pytest.approx(10.5)
