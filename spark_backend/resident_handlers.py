"""Kapacitor Handler scripts' handlers on the resident workers.

A Handler script's task keeps its handler, and so its state, on one worker (its home): each
call of its requests goes there, the slot granted fairly like any part of a micro-batch
(``resident_grants.py``). A task without a home (its first call, or its worker lost or
released) is given the free worker fewest handlers live on, where its handler is built, or
rebuilt from its last snapshot.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Hashable
from typing import TYPE_CHECKING

from spark_backend.resident_grants import WorkerGrants
from spark_backend.resident_protocol import HANDLER, handler_call_parts, read_handler_outcome
from spark_backend.resident_slots import START_TIMEOUT, NoResidentWorker, ResidentSlots, Worker, WorkerLost

if TYPE_CHECKING:  # the workers import the resident modules: no Spark session code there
    from udf_agent.compute.engine import Tenant
    from udf_agent.compute.handlers import HandlerCall, HandlerOutcome

log = logging.getLogger(__name__)


class ResidentHandlers:
    def __init__(self, slots: ResidentSlots, grants: WorkerGrants):
        self._slots = slots
        self._grants = grants
        self._cond = slots.cond  # guards the homes too
        self._homes: dict[str, Worker] = {}  # where each Handler script's task's handler lives

    def call(self, call: HandlerCall, key: Hashable, tenant: Tenant | None) -> HandlerOutcome:
        """The task's requests, on its home (given one if it has none). A worker lost during
        the call: the call is retried once, on the first worker free."""
        self._await_a_worker(time.monotonic() + START_TIMEOUT)
        retry_of: str | None = None
        while True:
            with self._cond:
                home = self._homes.get(call.task)
            batch_timeout = self._grants.batch_timeout
            # A retry may wait for the lost worker's slot to come back (when it was the only one).
            until = time.monotonic() + (batch_timeout if retry_of is None else max(batch_timeout, START_TIMEOUT))
            worker = self._grants.acquire(key, tenant, until, block=True, fresh_after=None, home=home)
            assert worker is not None
            rebuild = call.task not in worker.handlers
            if rebuild and call.rebuild.lost is not None and (home is not None or retry_of is not None):
                self._grants.release(worker, key, tenant)
                raise WorkerLost(f"the handler's worker was lost and the handler cannot be rebuilt: {call.rebuild.lost}")
            with self._cond:
                forget, worker.forget = tuple(worker.forget), []
            parts = handler_call_parts(dataclasses.replace(call, forget=call.forget + forget), rebuild)
            deadline = time.monotonic() + batch_timeout
            try:
                worker.exchange(deadline, batch_timeout, functools.partial(worker.link.send, HANDLER, *parts))
                kind, payload = worker.exchange(deadline, batch_timeout, worker.next_message)
            except WorkerLost as lost:
                with self._cond:
                    self._homes.pop(call.task, None)
                name = call.script.name
                retry_of = self._grants.lost_computing(worker, key, tenant, lost, f"{name}'s handler", f"{name}: its handler's requests", retry_of)
                # Any live worker will do (the lost one is gone from its slot, launched again):
                # the handler is rebuilt on the first one free.
                log.warning("%s; slot %d launched again and the handler rebuilt from its last snapshot on the first worker free", retry_of, worker.slot)
                continue
            self._grants.answered(worker, key, tenant, kind, payload, call.script.name)
            return self._settled(call.task, worker, read_handler_outcome(payload))

    def _settled(self, task: str, worker: Worker, outcome: HandlerOutcome) -> HandlerOutcome:
        """A handler that failed is let go; one that answered lives on ``worker`` from now on."""
        outcome.where = f"on {worker}"
        with self._cond:
            if outcome.error is None:
                worker.handlers.add(task)
                self._homes[task] = worker
            else:
                worker.handlers.discard(task)
                self._homes.pop(task, None)
        return outcome

    def forget(self, task: str) -> None:
        """The task ended: its handler is let go with its home worker's next call."""
        with self._cond:
            home = self._homes.pop(task, None)
            if home is not None:
                home.handlers.discard(task)
                home.forget.append(task)

    def _await_a_worker(self, deadline: float) -> None:
        """A Handler's state lives on a worker: it waits for one (no Spark job stands in)."""
        while True:
            try:
                self._slots.await_first_worker()
                return
            except NoResidentWorker:
                if time.monotonic() >= deadline:
                    raise
                self._slots.wait_for_workers(1, 1.0)
