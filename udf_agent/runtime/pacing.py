"""How long a reader lets input gather before its next read.

Kapacitor writes every point as two small unbuffered writes, as fast as the pipe takes them. A
reader that reads the moment bytes arrive then gets a point or two a read, and pays a system
call and a pass through the framing and session code for each. While reads come back to back
with little in them, a short pause lets the pipe fill and the next read takes many points. At a
trickle the reader never pauses, so latency at low rates is what it was: a point's two writes
make two reads back to back, so it takes three in a row, each within ``flowing_gap`` of the one
before, to count as flowing; and a pause that gathered only a few points ends the flow (a burst
in a trickle, or a rate too low for a pause to be worth it). Nor is a burst paused: Kapacitor
forwards a writer's flush back to back (1,000 points in ~8 ms), and a pause in the middle of
one only makes its rest wait. The reader pauses only in a stream (``StreamWatch``): input that
has come fast for ``SUSTAINED``, where the pause saves CPU. The pause bounds what is added at
high rates.
"""

from __future__ import annotations

from collections import deque

# A pause of a millisecond: at 100 k points/s about 100 points gather meanwhile, and a
# keepalive answer waits at most this much longer.
PAUSE = 0.001
# Reads closer together than this (after the pause, if any) mean input is flowing.
FLOWING_GAP = 0.0005
# Back-to-back reads in a row that make a flow (a point's two writes are two of them).
FLOWING_READS = 3
# A stream: input that has come at STREAM_RATE bytes/s or more (~10 k of Kapacitor's points a
# second; a trickle of 1 k points/s is a tenth of it), over each STREAM_WINDOW, for SUSTAINED:
# longer than a burst of a couple of thousand points takes to arrive. The window is longer than
# any spell the readers hold off for (a 5 ms window lost streams between them).
STREAM_RATE = 1_000_000
STREAM_WINDOW = 0.05
SUSTAINED = 0.02
# A read this big already carried many points: no pause after it.
SMALL_READ = 16 * 1024
# A pause worth its wait gathers at least this much (a few points). A read after a pause that
# brings less is a trickle's: the input no longer flows. At 1 k points/s the relay's 2 ms
# pause gathered 2 or 3 points, the read after it came at once, and without this the relay
# paused before every read from then on: ~1 ms more wait for every point.
FLOWING_AFTER_PAUSE = 1024
# While a micro-batch computes, small reads wait for it to end, this long at most
# (``Inbox._gather_while_computing``): what a keepalive's answer may wait more.
COMPUTE_GATHER = 0.005


class StreamWatch:
    """Sans-IO: told each read's size and time, says whether the input is a stream: it has come
    at ``STREAM_RATE`` or more, over every ``STREAM_WINDOW``, for ``sustained``. A burst or a
    trickle never is. Measured by what reads bring, not by when they are made: what a read
    brings after the reader held off (pacing, gathering while a micro-batch computes, trickling
    reads over the budget: all shorter than ``STREAM_WINDOW``) came while it held off. After no
    read for a whole window a new spell starts, whatever the read brings: a burst after a quiet
    spell is no stream. So does a flood after backpressure held every read for that long (deep
    over the budget); its first micro-batch then gathers ``SUSTAINED`` rather than longer, while
    compute, not gathering, is what it waits for."""

    def __init__(self, sustained: float = SUSTAINED):
        self._sustained = sustained
        self._window: deque[tuple[float, int]] = deque()  # the reads of the last STREAM_WINDOW
        self._bytes = 0  # ... and what they brought
        self._fast_since: float | None = None

    def read(self, size: int, now: float) -> None:
        window = self._window
        while window and window[0][0] <= now - STREAM_WINDOW:
            self._bytes -= window.popleft()[1]
        if not window:
            # No read for a whole window: whatever this one brings starts a new spell. Without
            # this, a burst read whole a second after the last one (nothing read between them
            # to say the input had slowed) continued the last one's spell and counted as a
            # stream: the reader then waited SETTLE for more before it was computed.
            self._fast_since = None
        window.append((now, size))
        self._bytes += size
        if self._bytes < STREAM_RATE * STREAM_WINDOW:
            self._fast_since = None
        elif self._fast_since is None:
            self._fast_since = now

    def streaming(self, now: float) -> bool:
        return self._fast_since is not None and now - self._fast_since >= self._sustained

    def lasted(self, at: float) -> float:
        """How long the input had been coming fast at ``at`` (0 if it was not)."""
        return 0.0 if self._fast_since is None else max(0.0, at - self._fast_since)


class ReadPacer:
    """Sans-IO: told each read's size and time, says how long to pause before the next."""

    def __init__(self, pause: float = PAUSE, flowing_gap: float = FLOWING_GAP, small_read: int = SMALL_READ, sustained: float = SUSTAINED):
        self._pause = pause
        self._flowing_gap = flowing_gap
        self._small_read = small_read
        self._stream = StreamWatch(sustained)
        self._ready_at = float("-inf")
        self._in_a_row = 0
        self._paused = False

    def after_read(self, size: int, now: float) -> float:
        """Seconds to pause before reading again, given a read of ``size`` bytes at ``now``."""
        if self._paused and size < FLOWING_AFTER_PAUSE:
            self._in_a_row = 1  # the pause gathered a trickle's few points
        else:
            self._in_a_row = self._in_a_row + 1 if now - self._ready_at < self._flowing_gap else 1
        self._stream.read(size, now)
        flowing = self._in_a_row >= FLOWING_READS and self._stream.streaming(now)
        pause = self._pause if flowing and size < self._small_read else 0.0
        # From the end of the pause: a reader that paused is flowing if the next read
        # returns at once with what gathered meanwhile, not because of the time it paused.
        self._ready_at = now + pause
        self._paused = pause > 0
        return pause
