"""Who gets the next free resident slot when several tasks share one engine.

Sans-IO bookkeeping (no threads, no clock of its own): ``resident_grants.WorkerGrants`` calls
it under the slots' Condition and wakes the waiters. The policy, max-min fair by slots held:

- A tenant (one task) is *active* while it waits for or holds a slot, and for
  ``ACTIVE_WINDOW`` seconds after its last use: a task streaming a point a second stays
  active between its micro-batches.
- An active tenant holds at most its share, ``ceil(slots / active tenants)`` (at least one):
  two tasks on two slots hold one each, so a task whose UDF takes a second a call never
  holds the slot its neighbour's next micro-batch needs. A task alone has every slot.
- A freed slot goes to the waiting tenant below its share that holds the fewest slots; ties
  go to the tenant that has waited longest (round robin between equals).

Slots are not preempted: a part of a micro-batch, once on a worker, runs to its end. The
engine splits a slow tenant's micro-batch into parts of about ``QUANTUM`` seconds while
others are active, so they get slots between its parts. A micro-batch expected to compute for
``SPLIT_SECONDS`` or more is cut into a part per slot of the tenant's share, whoever else is
active: its groups are independent, so a task whose UDF is the cost computes on every core it
may hold, not on one.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

# A tenant stays active (its share reserved) this long after its last use of a slot.
ACTIVE_WINDOW = 10.0
# A tenant idle this long is forgotten, its estimates with it.
FORGET_AFTER = 6 * ACTIVE_WINDOW
# While other tenants are active, a micro-batch is cut into parts expected to take about this long.
QUANTUM = 0.05
# A micro-batch expected to compute this long is worth a part per slot: a part costs the agent
# ~0.1-0.3 ms more (its send, its answer read, the wait for the slowest part), a few percent of this.
SPLIT_SECONDS = 0.005
# Weight of the newest part in a tenant's running estimates of its parts' cost.
ESTIMATE_WEIGHT = 0.3
# Parts' sizes must spread this much (their deviation over their mean) for a line to be fitted.
FIT_SPREAD = 0.25


@dataclass
class PartCost:
    """A tenant's part time as a line, ``seconds = fixed + per_group * groups``, fitted to its
    recent parts (running means, the newest weighing ``ESTIMATE_WEIGHT``). Taken as a rate per
    group, a trickle's one-group parts (nearly all of them what any part costs: its send, its
    answer, the UDF's call) made a burst's hundred groups look a hundred times as long. While
    the parts are all about one size, the rate per group is all there is to go by."""

    groups: float = 0.0
    seconds: float = 0.0
    groups_squared: float = 0.0
    groups_seconds: float = 0.0
    parts: int = 0

    def add(self, groups: int, seconds: float) -> None:
        weight = 1.0 if self.parts == 0 else ESTIMATE_WEIGHT
        self.groups += weight * (groups - self.groups)
        self.seconds += weight * (seconds - self.seconds)
        self.groups_squared += weight * (groups * groups - self.groups_squared)
        self.groups_seconds += weight * (groups * seconds - self.groups_seconds)
        self.parts += 1

    def expected(self, groups: int) -> float | None:
        """Seconds a part of ``groups`` groups is expected to take (None: nothing measured)."""
        if self.parts == 0:
            return None
        variance = self.groups_squared - self.groups * self.groups
        if variance <= (FIT_SPREAD * self.groups) ** 2:
            return groups * self.seconds / self.groups
        per_group = max(0.0, (self.groups_seconds - self.groups * self.seconds) / variance)
        return max(0.0, self.seconds + per_group * (groups - self.groups))


@dataclass(eq=False)
class Ticket:
    """One waiter for one slot."""

    tenant: Hashable
    number: int
    granted: bool = False
    fresh_after: float | None = None  # only a slot whose worker connected after this will do
    home: object | None = None  # only this worker will do, while it is there (a Handler's)


@dataclass(eq=False)
class _Tenant:
    held: int = 0
    last_used: float = -math.inf
    waiting: deque[Ticket] = field(default_factory=deque)
    cost: PartCost = field(default_factory=PartCost)


class FairShares:
    def __init__(self, active_window: float = ACTIVE_WINDOW):
        self.active_window = active_window
        self._tenants: dict[Hashable, _Tenant] = {}
        self._numbers = itertools.count()

    def wait(self, tenant: Hashable, now: float) -> Ticket:
        state = self._tenant(tenant)
        state.last_used = now
        ticket = Ticket(tenant, next(self._numbers))
        state.waiting.append(ticket)
        return ticket

    def withdraw(self, ticket: Ticket) -> None:
        """A waiter that gives up (its deadline passed, the engine stopped)."""
        state = self._tenants.get(ticket.tenant)
        if state is not None and ticket in state.waiting:
            state.waiting.remove(ticket)

    def next_ticket(self, slots: int, now: float, can_serve: Callable[[Ticket], bool] = lambda ticket: True) -> Ticket | None:
        """The waiter the next free slot goes to (None: none may take one now)."""
        share = self.share(slots, now)
        best: tuple[int, int] | None = None
        chosen: Ticket | None = None
        for state in self._tenants.values():
            if state.held >= share:
                continue
            ticket = next((t for t in state.waiting if can_serve(t)), None)
            if ticket is None:
                continue
            rank = (state.held, ticket.number)
            if best is None or rank < best:
                best, chosen = rank, ticket
        return chosen

    def grant(self, ticket: Ticket, now: float) -> None:
        state = self._tenant(ticket.tenant)
        state.waiting.remove(ticket)
        state.held += 1
        state.last_used = now
        ticket.granted = True

    def release(self, tenant: Hashable, now: float) -> None:
        state = self._tenant(tenant)
        state.held -= 1
        state.last_used = now

    def held(self, tenant: Hashable) -> int:
        state = self._tenants.get(tenant)
        return 0 if state is None else state.held

    def others_waiting(self, tenant: Hashable) -> bool:
        """Whether a tenant other than ``tenant`` waits for a slot."""
        return any(state.waiting for key, state in self._tenants.items() if key != tenant)

    def share(self, slots: int, now: float) -> int:
        """How many slots each active tenant may hold."""
        return max(1, math.ceil(slots / max(1, self.active(now))))

    def active(self, now: float) -> int:
        self._forget_idle(now)
        return sum(1 for state in self._tenants.values() if state.held or state.waiting or now - state.last_used < self.active_window)

    def others_active(self, tenant: Hashable, now: float) -> bool:
        return self.active(now) - (1 if self._is_active(tenant, now) else 0) > 0

    def parts_for(self, tenant: Hashable, groups: int, slots: int, now: float) -> int:
        """How many parts to cut a micro-batch of ``groups`` groups into: one per slot of the
        tenant's share when it is expected to compute for ``SPLIT_SECONDS`` or more, and, while
        other tenants are active, enough that no part is expected to hold a slot much past
        ``QUANTUM``."""
        state = self._tenants.get(tenant)
        expected = None if groups <= 1 or state is None else state.cost.expected(groups)
        if expected is None:
            return 1
        spread = min(groups, self.share(slots, now)) if expected >= SPLIT_SECONDS else 1
        if not self.others_active(tenant, now):
            return spread
        return max(spread, min(groups, math.ceil(expected / QUANTUM)))

    def measured(self, tenant: Hashable, groups: int, seconds: float) -> None:
        """A part of ``groups`` groups took ``seconds`` on its worker."""
        if groups > 0:
            self._tenant(tenant).cost.add(groups, seconds)

    def _is_active(self, tenant: Hashable, now: float) -> bool:
        state = self._tenants.get(tenant)
        return state is not None and bool(state.held or state.waiting or now - state.last_used < self.active_window)

    def _tenant(self, tenant: Hashable) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        return state

    def _forget_idle(self, now: float) -> None:
        """Tenants idle for long are dropped, so a server that saw many tasks keeps no trace of them."""
        stale = [key for key, state in self._tenants.items() if not state.held and not state.waiting and now - state.last_used >= FORGET_AFTER]
        for key in stale:
            del self._tenants[key]
