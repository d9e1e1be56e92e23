"""What a task has done so far, as ``udf-agent status`` and the metrics show it.

Each count has one writer at a time: whoever acts on input (the agent's reader, or its compute
thread reading ahead) counts what comes in, under the agent's lock; the compute thread what goes out. Readers take a snapshot whenever they like.
"""

from __future__ import annotations

import bisect
import time
from typing import Any

# The input rate is points over the last window of at least this many seconds.
RATE_WINDOW = 5.0
# Upper bounds (seconds) of the histograms' buckets: a micro-batch's compute, a keepalive's answer.
COMPUTE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
KEEPALIVE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# ... and a part of a micro-batch's wait for a resident slot of a shared engine.
SLOT_WAIT_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A task is falling behind when its micro-batch waited this long after its first point
# arrived before it was taken to compute: its input comes faster than it computes (a slow
# UDF, or a busy engine), and past --max-pending-points its reader stops reading.
BEHIND_AFTER = 2.0
# A keepalive's time is Kapacitor's clock when it sent it; an answer time past this is another clock's.
KEEPALIVE_CLOCK_SKEW = 600.0


class Histogram:
    """Counts of observations per bucket (Prometheus's ``le`` bounds), and their sum."""

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        """(upper bound, observations at or under it), ending with "+Inf"."""
        found, total = [], 0
        for bound, count in zip([*map(str, self.bounds), "+Inf"], self._counts):
            total += count
            found.append((bound, total))
        return found


class TaskStats:
    def __init__(self) -> None:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.points_in = 0
        self.points_out = 0
        self.micro_batches = 0
        self.skipped = 0  # --on-error skip or dead-letter
        self.dropped_at_stop = 0  # accepted but not computed within the drain timeout
        self.compute_seconds = Histogram(COMPUTE_BUCKETS)
        self.keepalive_seconds = Histogram(KEEPALIVE_BUCKETS)
        self.slot_wait_seconds = Histogram(SLOT_WAIT_BUCKETS)
        self.slots_held = 0
        self.checkpoints = 0  # of a relayed task, for its relay
        self.checkpoint_seconds = 0.0  # the last one's
        self.checkpoint_bytes = 0
        self.input_lag = 0.0  # how long the last micro-batch taken had waited since its first point
        self.computed = ""  # where the last micro-batch ran ("on Spark's resident workers")
        self.last_error: str | None = None
        self._window_at = self.started
        self._window_points = 0
        self._last_rate = 0.0

    def received(self, points: int, now: float) -> None:
        self.points_in += points
        if now - self._window_at >= RATE_WINDOW:
            self._last_rate = (self.points_in - self._window_points) / (now - self._window_at)
            self._window_at, self._window_points = now, self.points_in

    def checkpointed(self, seconds: float, size: int) -> None:
        self.checkpoints += 1
        self.checkpoint_seconds, self.checkpoint_bytes = seconds, size

    def slot_waited(self, seconds: float) -> None:
        self.slot_wait_seconds.observe(seconds)

    def slots_now(self, held: int) -> None:
        self.slots_held = held

    def micro_batch_taken(self, waited: float) -> None:
        """The compute side took a micro-batch whose first point arrived ``waited`` seconds ago."""
        self.input_lag = waited

    def falling_behind(self, now: float, oldest_waiting: float | None, flush_interval: float) -> bool:
        """Whether input waits for compute BEHIND_AFTER longer than a micro-batch may gather:
        the last micro-batch taken did, or the oldest still waiting (opened at ``oldest_waiting``) does."""
        late = flush_interval + BEHIND_AFTER
        return self.input_lag >= late or (oldest_waiting is not None and now - oldest_waiting >= late)

    def keepalive_answered(self, asked_at_ns: int) -> None:
        """A keepalive Kapacitor stamped ``asked_at_ns`` (its wall clock) is answered now."""
        took = (time.time_ns() - asked_at_ns) / 1e9
        if 0 <= took <= KEEPALIVE_CLOCK_SKEW:
            self.keepalive_seconds.observe(took)

    def rate(self, now: float) -> float:
        """Points/s received over the last window: a spell with none counts as it comes."""
        elapsed = now - self._window_at
        if elapsed >= RATE_WINDOW:
            return (self.points_in - self._window_points) / elapsed
        return self._last_rate

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "started": self.started_wall,
            "uptime_s": round(now - self.started, 3),
            "points_in": self.points_in,
            "points_out": self.points_out,
            "rate_in_per_s": round(self.rate(now), 1),
            "micro_batches": self.micro_batches,
            "slots_held": self.slots_held,
            "checkpoints": self.checkpoints,
            "last_checkpoint": {"seconds": round(self.checkpoint_seconds, 6), "bytes": self.checkpoint_bytes},
            "input_lag_s": round(self.input_lag, 3),
            "skipped": self.skipped,
            "computed": self.computed,
            "last_error": self.last_error,
        }
