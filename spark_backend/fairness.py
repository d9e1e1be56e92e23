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
others are active, so they get slots between its parts.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

# A tenant stays active (its share reserved) this long after its last use of a slot.
ACTIVE_WINDOW = 10.0
# While other tenants are active, a micro-batch is cut into parts expected to take about this long.
QUANTUM = 0.05
# Weight of the newest part in a tenant's running seconds-per-group estimate.
ESTIMATE_WEIGHT = 0.3


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
    seconds_per_group: float | None = None


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

    def parts_for(self, tenant: Hashable, groups: int, now: float) -> int:
        """How many parts to cut a micro-batch of ``groups`` groups into so that, while other
        tenants are active, no part is expected to hold a slot much past ``QUANTUM``."""
        state = self._tenants.get(tenant)
        if groups <= 1 or state is None or state.seconds_per_group is None or not self.others_active(tenant, now):
            return 1
        return max(1, min(groups, math.ceil(groups * state.seconds_per_group / QUANTUM)))

    def measured(self, tenant: Hashable, groups: int, seconds: float) -> None:
        """A part of ``groups`` groups took ``seconds`` on its worker."""
        if groups <= 0:
            return
        state = self._tenant(tenant)
        per_group = seconds / groups
        previous = state.seconds_per_group
        state.seconds_per_group = per_group if previous is None else previous + ESTIMATE_WEIGHT * (per_group - previous)

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
        stale = [key for key, state in self._tenants.items() if not state.held and not state.waiting and now - state.last_used >= 6 * self.active_window]
        for key in stale:
            del self._tenants[key]
