"""When the compute thread takes the open micro-batch: scheduling, not protocol (the session
only says what is open and since when; the reader says when input came and when, after a read,
it found none waiting).

Kapacitor's writer is the clock. It forwards a writer's flush (a point for each of many series)
back to back, two small writes a point, then nothing until the next flush; a trickle is the
same with a point a flush. So when the reader finds nothing more to read, what it has read is
all there is for now: the open micro-batch is due at once, however it arrived (one read or
many, a point or a thousand). While bytes are still waiting to be read, an idle compute thread
lets it gather, until it is ``gather`` old at most: under Kapacitor's feed flat out, input is
always waiting, and a compute thread that took what was read each time it was free would pay a
worker round trip for a handful of points. ``flush_interval`` bounds every wait; without the
adaptive flush a micro-batch waits for it (bigger micro-batches, by the user's choice).

Input that has come fast for a while is a stream, not a burst (a thousand points arrive in
less) nor a trickle (``pacing.StreamWatch``), and readers pace a stream: the relay in front of
a shared server reads Kapacitor's pipe every 2 ms, so the server's reader finds nothing waiting
between two of its sends. In a stream nothing waiting counts as a pause only once nothing has
come for ``SETTLE``, longer than any reader's pacing pause: the stream keeps gathering, and its
end is seen ``SETTLE`` late. A young stream gathers no longer than it has lasted (a long burst
goes in growing pieces).
"""

from __future__ import annotations

from udf_agent.runtime.pacing import SUSTAINED, StreamWatch

# What a micro-batch costs is mostly per group in it: under Kapacitor's feed of 1,000 series,
# gathering 50 ms took 8 us of CPU a point and 150 ms 5 us (the official agent: 14).
GATHER = 0.15
# In a stream, how long nothing must come to count as a pause: more than the relay's pacing
# pause (2 ms), a late wake-up from it, and the readers' holding off while a micro-batch
# computes (5 ms at most). At 5 ms, a third of the micro-batches under Kapacitor's feed through
# the relay were closed by such false pauses (points/s 1.04x the official agent's, CPU a point
# 0.67x); at 10 ms, 1.50x and 0.30x.
SETTLE = 0.01


class FlushPolicy:
    """Sans-IO: told when input came and when the reader found none waiting, says when an idle
    compute thread takes the open micro-batch. Its input side is written by whoever holds the
    read turn and read by the compute thread, both holding the work queue's lock."""

    def __init__(self, flush_interval: float, gather: float = GATHER, adaptive: bool = True):
        self.flush_interval = flush_interval
        self.gather = gather
        self.adaptive = adaptive
        # Whether the reader, after its last read that brought input, found none waiting.
        self.paused = False
        self._stream = StreamWatch()

    def input_came(self, now: float, size: int) -> None:
        """A read brought ``size`` bytes at ``now``: more may be waiting, until the reader looks."""
        self._stream.read(size, now)
        self.paused = False

    def settle(self, now: float) -> float:
        """How long the reader, finding nothing waiting after a read at ``now``, waits for more
        before the input counts as paused: ``SETTLE`` in a stream (which its readers pace), else
        nothing (a burst, a trickle's point)."""
        return SETTLE if self._stream.streaming(now) else 0.0

    def input_paused(self) -> None:
        """The reader found nothing more to read: what it read is all there is for now."""
        self.paused = True

    def due(self, opened_at: float, now: float) -> float:
        """When an idle compute thread takes a micro-batch opened at ``opened_at``, asked at ``now``."""
        latest = opened_at + self.flush_interval
        if not self.adaptive:
            return latest
        if self.paused:
            return min(latest, now)
        # A young stream may be a long burst (10,000 points take ~90 ms to arrive): a
        # micro-batch gathers no longer than the input had come fast when it opened, so the
        # burst is computed in growing pieces as it arrives, not all after its end; a flood
        # soon gathers for ``gather``.
        return min(latest, opened_at + min(self.gather, max(SUSTAINED, self._stream.lasted(opened_at))))
