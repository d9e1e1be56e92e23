"""Who gets which resident worker: the slots shared fairly between the tasks of a server
(``fairness.FairShares``), a worker granted at a time, given back or given up."""

from __future__ import annotations

import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from spark_backend.fairness import FairShares, Ticket
from spark_backend.resident_protocol import FAILURE, OVER_MEMORY
from spark_backend.resident_slots import (
    FORCED_RELAUNCH_INTERVAL,
    START_TIMEOUT,
    ResidentSlots,
    Worker,
    WorkerLost,
    WorkerLostTwice,
    WorkerOverMemory,
    WorkerTimedOut,
)
from udf_agent.errors import first_line

if TYPE_CHECKING:
    from udf_agent.compute.engine import Tenant


class WorkerGrants:
    """Grants the slots' workers to tasks (``key``), fairly, under the slots' Condition: a
    waiter wakes when a worker is given back or joins."""

    def __init__(self, slots: ResidentSlots, batch_timeout: float):
        self._slots = slots
        self._cond = slots.cond
        self._fair = FairShares()
        self.batch_timeout = batch_timeout

    def held(self, key: Hashable) -> int:
        with self._cond:
            return self._fair.held(key)

    def others_waiting(self, key: Hashable) -> bool:
        """Whether another task waits for a worker: a task sending micro-batch after micro-batch
        to the worker it holds (``ResidentWorkers.chain_stream``) then gives it back."""
        with self._cond:
            return self._fair.others_waiting(key)

    def parts_for(self, key: Hashable, rows: int) -> tuple[int, int]:
        """The slots a micro-batch of ``rows`` groups may use now, and the parts it is cut
        into at least: one per slot when its compute is worth spreading, and enough that a slow
        task's micro-batch lets other tasks' parts run between its own."""
        with self._cond:
            now = time.monotonic()
            return self._fair.share(self._slots.count, now), self._fair.parts_for(key, rows, self._slots.serving(), now)

    def measured(self, key: Hashable, rows: int, seconds: float) -> None:
        """A part of ``rows`` groups took ``seconds``: what the task's next parts are sized by."""
        with self._cond:
            self._fair.measured(key, rows, seconds)

    def acquire(self, key: Hashable, tenant: Tenant | None, until: float, block: bool, fresh_after: float | None, home: Worker | None = None) -> Worker | None:
        """A free worker granted to this task by the fair shares (None if ``block`` is False
        and none is granted at once), ``home`` while it is there; WorkerLost past ``until``."""
        with self._cond:
            asked = time.monotonic()
            ticket = self._fair.wait(key, asked)
            ticket.fresh_after = fresh_after
            ticket.home = home
            try:
                while True:
                    if self._slots.stopped.is_set():
                        raise WorkerLost("the engine was stopped")
                    now = time.monotonic()
                    if self._fair.next_ticket(self._slots.count, now, self._can_serve) is ticket:
                        worker = self._free_worker(fresh_after, home)
                        assert worker is not None
                        self._fair.grant(ticket, now)
                        self._slots.set_busy(worker, True)
                        self._slots.last_used = now
                        if tenant is not None:
                            tenant.slot_waited(now - asked)
                            tenant.slots_now(self._fair.held(key))
                        return worker
                    if not block:
                        return None
                    if fresh_after is not None:
                        self._slots.revive(now, force=True)
                    if now >= until:
                        raise WorkerLost(self._no_slot_cause(fresh_after))
                    self._cond.wait(min(until - now, FORCED_RELAUNCH_INTERVAL) if fresh_after is not None else until - now)
            finally:
                if not ticket.granted:
                    self._fair.withdraw(ticket)
                    self._cond.notify_all()  # the next waiter may be served now

    def _can_serve(self, ticket: Ticket) -> bool:
        return self._free_worker(ticket.fresh_after, ticket.home) is not None

    def _free_worker(self, fresh_after: float | None, home: object | None = None) -> Worker | None:
        """``home`` while it is there; else, of the free workers, the one fewest Handler
        scripts' handlers live on: a handler made here stays for its task's life, and a slow
        one holds up only the handlers that share its worker."""
        if isinstance(home, Worker) and self._slots.holds(home):
            return None if home.busy else home
        free = [worker for worker in self._slots.workers() if not worker.busy and (fresh_after is None or worker.connected_at > fresh_after)]
        return min(free, key=lambda worker: len(worker.handlers), default=None)

    def _no_slot_cause(self, fresh_after: float | None) -> str:
        if fresh_after is None:
            return f"no resident slot was free for this task within the batch timeout ({self.batch_timeout:g} s)"
        errors = self._slots.job_errors()
        reason = first_line(errors[0]) if errors else f"no worker connected within {START_TIMEOUT:g} s"
        return f"relaunching the resident workers failed: {reason}"

    def release(self, worker: Worker, key: Hashable, tenant: Tenant | None) -> None:
        with self._cond:
            self._slots.set_busy(worker, False)
            now = time.monotonic()
            self._fair.release(key, now)
            self._slots.last_used = now
            if tenant is not None:
                tenant.slots_now(self._fair.held(key))
            self._cond.notify_all()

    def lose(self, worker: Worker, key: Hashable, tenant: Tenant | None) -> None:
        """Gives up a worker this task held, launching its slot again unless that happened
        already (its job ended first); its job is ended, cancelled if it must be."""
        worker.link.close()
        with self._cond:
            self._slots.set_busy(worker, False)
            now = time.monotonic()
            self._fair.release(key, now)
            if tenant is not None:
                tenant.slots_now(self._fair.held(key))
            relaunched = self._slots.relaunch_lost(worker)
            self._cond.notify_all()
        if relaunched:
            self._slots.end_job_soon(worker)

    def lost_computing(self, worker: Worker, key: Hashable, tenant: Tenant | None, lost: WorkerLost, what: str, work: str, retry_of: str | None) -> str:
        """``worker`` was lost computing ``what``: it is given up, and what happened is said
        for the retry to carry; WorkerLost naming ``work`` if this was the retry (``retry_of``
        saying what happened the first time)."""
        self.lose(worker, key, tenant)
        # A worker that ended says how (its job fails at once); a stuck one was cancelled.
        report = "" if isinstance(lost, WorkerTimedOut) else worker.crash_report()
        happened = f"{lost} while computing {what}{report}"
        if retry_of is not None:
            raise WorkerLostTwice(f"{work} failed twice on Spark's resident workers: {retry_of}; then {happened}") from None
        return happened

    def answered(self, worker: Worker, key: Hashable, tenant: Tenant | None, kind: int, payload: bytes | bytearray, what: str) -> None:
        """``worker`` answered a call for ``what``: given back (or up, over memory); the answer
        is a result unless WorkerOverMemory or RuntimeError (a failure outside the UDF) says otherwise."""
        if kind == OVER_MEMORY:
            self.lose(worker, key, tenant)
            raise WorkerOverMemory(f"{what}: {payload.decode(errors='replace')}")
        self.release(worker, key, tenant)
        if kind == FAILURE:
            raise RuntimeError(f"{worker} failed outside the UDF: {payload.decode(errors='replace')}")
