"""How many resident slots an engine on a cluster wants: one to start, one more while the
workers it holds are busy nearly all the time, one fewer once its work fits in fewer.

Spark does the rest. A slot is a one-task job; a slot launched beyond the executors the
application has is a pending task, for which Spark's dynamic allocation asks the cluster for
an executor (never past ``spark.cores.max``, never past the cluster's free cores); a slot
retired leaves its executor idle, and dynamic allocation gives it back to the cluster after
``spark.dynamicAllocation.executorIdleTimeout``.

The signal is the engine's, not a task's: the busy share of the workers held, over windows
of ``WINDOW`` seconds. Workers busy nearly all the time are what a task falling behind on
compute looks like from here (its input waits, so its next micro-batch is ready when a part
ends), and one engine serves every task of a shared server, which is what holds the cores. A
task whose agent, not its UDF, is the cost leaves its workers idle between micro-batches, and
more cores would not help it: it does not grow.

Sans-IO: told the time and what happened, it answers; tested on a fake clock.
"""

from __future__ import annotations

from dataclasses import dataclass

# The busy share of the workers held is measured over windows this long.
WINDOW = 5.0
# Workers busy this share of a window (or more) want one more slot.
GROW_BUSY = 0.85
# Work that would keep one fewer slot no busier than this share, for SHRINK_WINDOWS windows
# in a row, gives one back: well under GROW_BUSY, so that a slot given back is not wanted
# again at once.
SHRINK_BUSY = 0.6
SHRINK_WINDOWS = 2
# A slot launched to grow whose worker has not connected within this long gets no core
# (the cluster has none free, or spark.cores.max is reached): it is retired, and no slot
# is added for CAPPED_PAUSE.
PATIENCE = 45.0
CAPPED_PAUSE = 60.0


@dataclass(frozen=True)
class Holding:
    """The slots wanted, and why: what ``udf-agent status`` and the metrics show."""

    wanted: int
    connected: int
    reason: str
    busy_share: float | None  # the last full window's, None before one
    cores: int | None = None  # of the executors Spark has given the application, if known


class CoreGrowth:
    """The slots wanted by an engine whose cores may grow (a cluster's, by default), from one
    up to ``cap`` (None: as many as Spark grants)."""

    def __init__(self, cap: int | None, now: float):
        self.cap = cap
        self.wanted = 1
        self.reason = "starting: one slot"
        self._connected = 0
        self._busy_workers = 0
        self._busy_seconds = 0.0
        self._integrated_to = now
        self._window_start = now
        self._busy_share: float | None = None
        self._quiet_windows = 0
        self._grown_at: float | None = None  # while a slot launched to grow waits for its worker
        self._capped_until = -float("inf")

    def busy_workers(self, now: float, count: int) -> None:
        """``count`` workers compute from ``now`` on."""
        self._integrate(now)
        self._busy_workers = count

    def released(self, now: float) -> None:
        """Every worker was let go after an idle spell: the next launch is one slot again."""
        self._integrate(now)
        self.wanted = 1
        self.reason = "released: idle"
        self._grown_at = None
        self._quiet_windows = 0
        self._restart_window(now)

    def tick(self, now: float, connected: int) -> int:
        """The slots wanted now, ``connected`` workers being connected."""
        self._integrate(now)
        if connected != self._connected:
            # A worker joined or left: measure the set as it is now.
            self._connected = connected
            self._restart_window(now)
        if self._grown_at is not None:
            if connected >= self.wanted:
                self._grown_at = None
                self.reason = f"grown: {self.wanted} slot(s)"
            elif now - self._grown_at >= PATIENCE:
                self.wanted = max(1, connected)
                self._grown_at = None
                self._capped_until = now + CAPPED_PAUSE
                self.reason = f"capped: Spark granted no core for another slot within {PATIENCE:g} s (the cluster has none free, or spark.cores.max is reached)"
                return self.wanted
        if now - self._window_start < WINDOW or connected == 0:
            return self.wanted
        share = self._busy_seconds / ((now - self._window_start) * connected)
        self._busy_share = share
        self._restart_window(now)
        if self._grown_at is not None:
            if share < GROW_BUSY:  # the load fell while the slot waited for its core
                self.wanted = max(1, connected)
                self._grown_at = None
                self.reason = f"steady: the load fell (busy {share:.0%}) before another slot's worker came"
        elif share >= GROW_BUSY and connected >= self.wanted:
            self._quiet_windows = 0
            if self.cap is not None and self.wanted >= self.cap:
                self.reason = f"capped: --max-cores {self.cap} reached, its workers busy {share:.0%}"
            elif now < self._capped_until:
                pass  # the capped reason stands until the pause ends
            else:
                self.wanted += 1
                self._grown_at = now
                self.reason = f"growing: its {connected} worker(s) busy {share:.0%} of {WINDOW:g} s"
        elif self.wanted > 1 and share * connected <= SHRINK_BUSY * (self.wanted - 1):
            self._quiet_windows += 1
            if self._quiet_windows >= SHRINK_WINDOWS:
                self._quiet_windows = 0
                self.wanted -= 1
                self.reason = f"shrinking: its work fits in {self.wanted} slot(s) (busy {share:.0%})"
        else:
            self._quiet_windows = 0
            if now >= self._capped_until:
                self.reason = f"steady: {self.wanted} slot(s), busy {share:.0%}"
        return self.wanted

    def holding(self, connected: int, cores: int | None) -> Holding:
        return Holding(self.wanted, connected, self.reason, self._busy_share, cores)

    def _integrate(self, now: float) -> None:
        if now > self._integrated_to:
            self._busy_seconds += (now - self._integrated_to) * self._busy_workers
            self._integrated_to = now

    def _restart_window(self, now: float) -> None:
        self._window_start = now
        self._busy_seconds = 0.0
