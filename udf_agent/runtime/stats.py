"""What a task has done so far, as ``udf-agent status`` shows it.

Each count has one writer: the agent's reader counts what comes in (under the agent's lock),
its compute thread what goes out. Readers take a snapshot whenever they like.
"""

from __future__ import annotations

import time
from typing import Any

# The input rate is points over the last window of at least this many seconds.
RATE_WINDOW = 5.0


class TaskStats:
    def __init__(self) -> None:
        self.started_wall = time.time()
        self.started = time.monotonic()
        self.points_in = 0
        self.points_out = 0
        self.micro_batches = 0
        self.skipped = 0  # --on-error skip or dead-letter
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
            "skipped": self.skipped,
            "computed": self.computed,
            "last_error": self.last_error,
        }
