"""Resident workers: Spark tasks that stay up and compute one micro-batch after another.

A Spark job per micro-batch costs 0.2-0.5 s here before any work is done (planning,
scheduling, every row through the JVM twice), which caps a stream at a few
micro-batches a second. Instead the engine launches, per slot, one long-running
``mapInPandas`` job of one task (``resident_slots.py``: launches, relaunches, idle release).
Each task, inside Spark's Python worker, connects back to the agent over TCP, proves it was
launched by this agent (a random token), and computes the parts of micro-batches sent to it
with ``compute.run_partition``'s code until the agent closes the connection. Spark still
places, starts and supervises the workers.

This module feeds them. A worker lost while computing has its slot launched again at once,
and the part it was computing is retried once on a fresh worker: a micro-batch's output is
used only once every part of it has come back, so a retry never emits anything twice.

Many tasks share one engine on a server: slots go to them fairly (``resident_grants.py``,
``fairness.py``), and a micro-batch is cut into parts: one per slot of the task's share when
its compute is worth spreading, and so that no task holds more than its share of the slots
while another task has work waiting.

Messages, both ways: ``resident_protocol``. The job (the UDF and its options) travels once
per worker, pickled by Spark's own cloudpickle as Spark ships any pandas UDF; a stream
micro-batch's tasks and results travel packed (``compute/packed.py``), a batch's as Arrow IPC.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Generator, Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import pyarrow as pa

from spark_backend.growth import CoreGrowth, Holding
from spark_backend.resident_grants import WorkerGrants
from spark_backend.resident_handlers import ResidentHandlers
from spark_backend.resident_protocol import FAILURE, JOB, JOB_KEY_BYTES, KEPT_JOBS, OVER_MEMORY, STREAM_TASKS, TASKS, read_stream_result
from spark_backend.resident_slots import FIRST_WORKER_WAIT, START_TIMEOUT, ResidentSlots, Worker, WorkerLost, WorkerOverMemory
from udf_agent.compute.contract import RESULT_SCHEMA, Job
from udf_agent.compute.packed import ResultColumns, StreamTasks
from udf_agent.wire.columns import message_table, table_message

if TYPE_CHECKING:  # the workers import this module: no Spark session code there
    from spark_backend.sessions import SparkSession
    from udf_agent.compute.engine import Tenant
    from udf_agent.compute.handlers import HandlerCall, HandlerOutcome

log = logging.getLogger(__name__)

# Under twice this many bytes of points, only its expected compute (``fairness.SPLIT_SECONDS``)
# cuts a micro-batch; over it, its bytes alone do, a part per SPLIT_BYTES at most.
SPLIT_BYTES = 512 * 1024


# A micro-batch's tasks as an engine is handed them: a task table, or a stream slice packed.
Tasks: TypeAlias = "pa.Table | StreamTasks"
Results: TypeAlias = "pa.Table | ResultColumns"


@dataclass(eq=False)
class _Part:
    index: int
    tasks: Tasks
    retry_of: str | None = None  # what was lost the first time
    fresh_after: float | None = None  # a retry runs on a worker that connected after this


class _ChainPace:
    """When a chain takes the next slice: as late as lets it reach the worker as the slice
    before it ends, so that it holds what came meanwhile. Taken at once, a trickle's slices
    were one point each, the worker never idle and each point waiting behind the slice before
    it; taken after the answer, the worker waits for the agent's work between slices.

    A slice's time is the worker's own account of it (``STREAM_RESULT``): timed from the
    agent's side, from its send to its reading of the answer, it took in however long the
    answer waited for the compute thread, and each late read made the next take later still.
    One pace a task, kept from chain to chain."""

    # Weight of the newest figure in each running estimate.
    WEIGHT = 0.2

    def __init__(self) -> None:
        self.computes: float | None = None  # the worker's seconds a slice
        self.takes = 0.0  # the agent's seconds to take and send the next one

    def take_at(self, began: float) -> float | None:
        """When to take the slice to follow the one that began computing at ``began``: as it is
        about to end. None while the worker's time is not known: at once."""
        return None if self.computes is None else began + self.computes - self.takes

    def wait_to_follow(self, began: float, answered: Callable[[float], bool]) -> None:
        """Waits until ``take_at(began)``, or until the slice's answer comes (``answered(seconds)``
        waits that long at most for it): an estimate too long never holds an answer back. A
        burst's slice is many times a trickle's, so the estimate is often off."""
        at = self.take_at(began)
        if at is not None and (left := at - time.monotonic()) > 0:
            answered(left)

    def followed(self, seconds: float) -> None:
        self.takes += self.WEIGHT * (seconds - self.takes)

    def computed(self, seconds: float) -> None:
        """The worker took ``seconds`` over a slice, by its own clock."""
        self.computes = seconds if self.computes is None else self.computes + self.WEIGHT * (seconds - self.computes)


def _slice_end(told: float, began: float, answered: float, same_clock: bool) -> float:
    """When a slice ended, in the agent's clock: as the worker ``told``, if it runs on the
    agent's clock and that lies between the slice's start and its answer read (a worker in
    another time namespace of the same kernel would not), else when its answer was read."""
    return told if same_clock and began <= told <= answered else answered


# Tasks whose chain pace is kept (one engine serves every task of a shared server).
KEPT_PACES = 256

# The task whose tenant is not named (a caller outside an agent: tests, benchmarks).
_ANONYMOUS = object()


class ResidentWorkers:
    """The agent's end of the resident jobs: shares their slots between tasks and feeds
    them; a worker lost with a part is given up (its slot relaunched) and the part retried.

    Workers join as Spark gives their tasks a core. ``slots`` should be the cores the
    application has: a resident task holds its core for as long as it lives.
    """

    def __init__(self, session: SparkSession, slots: int, host: str, batch_timeout: float, idle_release: float | None = None, first_worker_wait: float = FIRST_WORKER_WAIT, worker_memory: int | None = None, growth: CoreGrowth | None = None):
        self._slots = ResidentSlots(session, slots, idle_release, first_worker_wait, worker_memory, growth)
        self.slots = slots
        self._host = host
        # The slots' Condition guards the fair shares and the Handlers' homes too: a waiter
        # for a worker wakes when one is released or joins.
        self._cond = self._slots.cond
        self._grants = WorkerGrants(self._slots, batch_timeout)
        self._pickled: OrderedDict[int, tuple[Job, bytes, bytes]] = OrderedDict()
        self._handlers = ResidentHandlers(self._slots, self._grants)
        self._pickle_lock = threading.Lock()
        self._paces: OrderedDict[Hashable, _ChainPace] = OrderedDict()  # by task, the latest chained last
        self._paces_lock = threading.Lock()

    @property
    def batch_timeout(self) -> float:
        """How long a part may compute, and wait for a slot (the grants' to enforce too)."""
        return self._grants.batch_timeout

    @batch_timeout.setter
    def batch_timeout(self, seconds: float) -> None:
        self._grants.batch_timeout = seconds

    @property
    def launches(self) -> int:
        """Slot launches so far: each slot's first, then each relaunch."""
        return self._slots.launches

    @property
    def worker_losses(self) -> int:
        """Workers lost while computing or serving (crashed, killed, stuck, over memory)."""
        return self._slots.worker_losses

    @property
    def released(self) -> bool:
        """Whether the workers were let go after an idle spell (relaunched on demand)."""
        return self._slots.released

    def worker_pids(self) -> list[int]:
        return self._slots.worker_pids()

    def holding(self) -> Holding:
        """The slots wanted and connected, and why so many."""
        return self._slots.holding()

    def start(self) -> None:
        """Opens the workers' port and launches every slot; workers connect in the background."""
        self._slots.start(self._host)

    def wait_for_workers(self, count: int, timeout: float) -> bool:
        """Whether ``count`` workers are connected within ``timeout`` seconds."""
        return self._slots.wait_for_workers(count, timeout)

    def connected(self) -> bool:
        """Whether a worker is connected now."""
        with self._cond:
            return self._slots.connected() > 0

    def held_by(self, tenant: Hashable) -> int:
        return self._grants.held(tenant)

    def run(self, job: Job, tasks: Tasks, tenant: Tenant | None = None) -> Results:
        """The micro-batch's results, computed in parts on the slots this task may hold; in the
        form its tasks came in (a table, or packed)."""
        key, parts = self._parts(tasks, tenant)
        return self._run_split(job, tasks, parts, key, tenant)

    def _parts(self, tasks: Tasks, tenant: Tenant | None) -> tuple[Hashable, list[Tasks]]:
        """The task's key in the fair shares, and the parts its micro-batch is cut into, once a
        worker has joined."""
        if self._slots.stopped.is_set():
            raise WorkerLost("the engine was stopped")
        key: Hashable = tenant if tenant is not None else _ANONYMOUS
        self._slots.await_first_worker()
        share, at_least = self._grants.parts_for(key, tasks.num_rows)
        return key, _split(tasks, share, at_least)

    def _run_split(self, job: Job, tasks: Tasks, parts: list[Tasks], key: Hashable, tenant: Tenant | None) -> Results:
        results = self._run_parts(job, [_Part(i, part) for i, part in enumerate(parts)], key, tenant)
        if len(results) == 1:
            return results[0]
        return ResultColumns.concat(results) if isinstance(tasks, StreamTasks) else pa.concat_tables(results)

    def chain_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None, follow: Callable[[], StreamTasks | None]) -> Generator[ResultColumns, None, None]:
        """Stream slices computed one after another on one worker, each sent while the one
        before it computes, so the worker goes from one to the next without waiting for the
        agent: the results of ``tasks``, then of each slice ``follow()`` gives (asked while one
        slice is out; None ends the chain). The worker is held from the first send to the last
        answer; the chain ends once another task waits for a worker. A slice worth splitting
        is computed as ``run`` computes it, alone. A worker lost mid-chain: each slice it held is computed
        again, in order, as a lost part is (once more, on a fresh worker)."""
        key, parts = self._parts(tasks, tenant)
        if len(parts) > 1:
            yield self._run_split(job, tasks, parts, key, tenant)
            return
        worker: Worker | None = self._grants.acquire(key, tenant, time.monotonic() + self.batch_timeout, block=True, fresh_after=None)
        assert worker is not None  # a blocking acquire grants one or raises
        # The slices out on the worker, in order, and when each began (or will begin) computing.
        out: deque[tuple[StreamTasks, float]] = deque()
        chaining = True
        pace = self._pace(key)
        sent = 0.0  # when the last slice chained was sent
        try:
            # Each slice is counted out before it is sent: a worker lost sending it owes it too.
            out.append((tasks, time.monotonic()))
            self._send(worker, job, _Part(0, tasks), out[0][1] + self.batch_timeout)
            while out:
                if chaining and len(out) == 1:
                    pace.wait_to_follow(out[0][1], worker.link.message_waiting)
                    asked = time.monotonic()
                    following = None if self._grants.others_waiting(key) else follow()
                    if following is None:
                        chaining = False
                    else:
                        out.append((following, out[0][1]))
                        self._send(worker, job, _Part(0, following), out[0][1] + 2 * self.batch_timeout)
                        sent = time.monotonic()
                        pace.followed(sent - asked)
                computing, began = out[0]
                kind, payload = worker.exchange(began + self.batch_timeout, self.batch_timeout, worker.next_message)
                answered = time.monotonic()
                out.popleft()
                if kind == OVER_MEMORY:
                    lost, worker = worker, None
                    self._grants.lose(lost, key, tenant)
                    raise WorkerOverMemory(f"UDF {job.spec.name!r}: {payload.decode(errors='replace')}")
                if kind == FAILURE:
                    raise RuntimeError(f"{worker} failed outside the UDF: {payload.decode(errors='replace')}")
                took, ended, columns = read_stream_result(payload)
                pace.computed(ended - took)
                if out:  # the next slice computes from this one's end on, or from its send if later
                    out[0] = (out[0][0], max(_slice_end(ended, began, answered, worker.same_clock), sent))
                self._grants.measured(key, computing.num_rows, answered - began)
                yield ResultColumns.unpack(columns)
        except WorkerLost as lost:
            if worker is None:
                raise
            lost_at, slot = time.monotonic(), worker.slot
            work = f"UDF {job.spec.name!r}: a micro-batch of {out[0][0].num_rows} group(s)"
            what = self._grants.lost_computing(worker, key, tenant, lost, f"UDF {job.spec.name!r}", work, None)
            worker = None
            log.warning("%s; slot %d launched again and the %d micro-batch(es) it held computed again", what, slot, len(out))
            while out:
                again, _ = out.popleft()
                yield self._run_parts(job, [_Part(0, again, retry_of=what, fresh_after=lost_at)], key, tenant)[0]
        finally:
            if worker is not None:
                self._settle(worker, key, tenant, len(out), time.monotonic() + self.batch_timeout)

    def _pace(self, key: Hashable) -> _ChainPace:
        """The chain pace of the task of ``key``, kept for the next chain (its estimates hold)."""
        with self._paces_lock:
            pace = self._paces.pop(key, None) or _ChainPace()
            self._paces[key] = pace
            while len(self._paces) > KEPT_PACES:
                self._paces.popitem(last=False)
            return pace

    def run_handler(self, call: HandlerCall, tenant: Tenant | None = None) -> HandlerOutcome:
        """A Handler script's requests, on the worker its handler lives on (``resident_handlers``)."""
        if self._slots.stopped.is_set():
            raise WorkerLost("the engine was stopped")
        return self._handlers.call(call, tenant if tenant is not None else _ANONYMOUS, tenant)

    def forget_handler(self, task: str) -> None:
        """The task ended: its handler is let go with its home worker's next call."""
        self._handlers.forget(task)

    def stop(self) -> None:
        self._slots.stop()

    # ---- a micro-batch's parts ----

    def _run_parts(self, job: Job, parts: list[_Part], key: Hashable, tenant: Tenant | None) -> list[Results]:
        """Each part on a worker of its own as slots are granted; the parts' results in order.
        A part has the batch timeout to compute from when it is sent."""
        pending = deque(parts)
        in_flight: deque[tuple[_Part, Worker, float]] = deque()
        results: list[Results | None] = [None] * len(parts)
        slot_wait_until = time.monotonic() + self.batch_timeout
        try:
            while pending or in_flight:
                # Take slots for waiting parts: waiting for one only when none is computing.
                while pending:
                    part = pending[0]
                    until = slot_wait_until if part.fresh_after is None else max(slot_wait_until, time.monotonic() + START_TIMEOUT)
                    worker = self._grants.acquire(key, tenant, until, block=not in_flight, fresh_after=part.fresh_after)
                    if worker is None:
                        break
                    pending.popleft()
                    sent_at = time.monotonic()
                    try:
                        self._send(worker, job, part, sent_at + self.batch_timeout)
                    except WorkerLost as lost:
                        self._after_loss(job, part, worker, key, tenant, lost, pending)
                        continue
                    in_flight.append((part, worker, sent_at))
                part, worker, sent_at = in_flight.popleft()
                try:
                    kind, payload = worker.exchange(sent_at + self.batch_timeout, self.batch_timeout, worker.next_message)
                except WorkerLost as lost:
                    self._after_loss(job, part, worker, key, tenant, lost, pending)
                    slot_wait_until = time.monotonic() + self.batch_timeout
                    continue
                self._grants.answered(worker, key, tenant, kind, payload, f"UDF {job.spec.name!r}")
                self._grants.measured(key, part.tasks.num_rows, time.monotonic() - sent_at)
                results[part.index] = ResultColumns.unpack(read_stream_result(payload)[2]) if isinstance(part.tasks, StreamTasks) else message_table(payload, RESULT_SCHEMA)
        finally:
            # A part still out when the micro-batch fails: its answer is read and dropped
            # (or its worker given up), so the connection is ready for the next one.
            for _, worker, sent_at in in_flight:
                self._settle(worker, key, tenant, 1, sent_at + self.batch_timeout)
        assert all(result is not None for result in results)
        return [result for result in results if result is not None]

    def _after_loss(self, job: Job, part: _Part, worker: Worker, key: Hashable, tenant: Tenant | None, lost: WorkerLost, pending: deque[_Part]) -> None:
        """A worker was lost with ``part``: its slot is launched again and the part retried
        once, on a fresh worker; the second loss fails the micro-batch."""
        lost_at = time.monotonic()
        work = f"UDF {job.spec.name!r}: a micro-batch of {part.tasks.num_rows} group(s)"
        what = self._grants.lost_computing(worker, key, tenant, lost, f"UDF {job.spec.name!r}", work, part.retry_of)
        log.warning("%s; slot %d launched again and the part of %d group(s) retried once", what, worker.slot, part.tasks.num_rows)
        pending.appendleft(_Part(part.index, part.tasks, retry_of=what, fresh_after=lost_at))

    def _send(self, worker: Worker, job: Job, part: _Part, deadline: float) -> None:
        key, pickled = self._job_pickle(job)
        tasks = part.tasks
        kind, payload = (STREAM_TASKS, tasks.pack()) if isinstance(tasks, StreamTasks) else (TASKS, [table_message(tasks)])
        worker.exchange(deadline, self.batch_timeout, functools.partial(self._send_tasks, worker, key, pickled, kind, payload))

    def _send_tasks(self, worker: Worker, key: bytes, pickled: bytes, kind: int, payload: list[Any], deadline: float) -> None:
        if key not in worker.jobs:
            worker.link.send(JOB, key, pickled, deadline=deadline)
            worker.jobs.add(key, None)
        worker.jobs.use(key)  # as the worker will on reading the tasks: the two caches stay alike
        worker.link.send(kind, key, *payload, deadline=deadline)

    def _settle(self, worker: Worker, key: Hashable, tenant: Tenant | None, owed: int, deadline: float) -> None:
        """``worker`` still owes ``owed`` answers when its caller stops waiting for them (a
        failure, or the caller gone): each is read and dropped, the first by ``deadline`` and
        each next within the batch timeout of the one before, so the connection is ready for
        the next use; then the worker is given back, or given up if lost or over its memory."""
        for _ in range(owed):
            try:
                kind, _ = worker.exchange(deadline, self.batch_timeout, worker.next_message)
            except WorkerLost:
                self._grants.lose(worker, key, tenant)
                return
            if kind == OVER_MEMORY:
                self._grants.lose(worker, key, tenant)
                return
            deadline = time.monotonic() + self.batch_timeout
        self._grants.release(worker, key, tenant)

    def _job_pickle(self, job: Job) -> tuple[bytes, bytes]:
        with self._pickle_lock:
            cached = self._pickled.get(id(job))
            if cached is None or cached[0] is not job:
                from pyspark import cloudpickle

                pickled = cloudpickle.dumps(job)
                cached = (job, hashlib.sha256(pickled).digest()[:JOB_KEY_BYTES], pickled)
                self._pickled[id(job)] = cached  # the job is held, so its id is not reused meanwhile
                while len(self._pickled) > KEPT_JOBS:
                    self._pickled.popitem(last=False)
            return cached[1], cached[2]


def _split(tasks: Tasks, workers: int, at_least: int = 1) -> list[Tasks]:
    """Consecutive runs of tasks with about the same bytes of points: one per worker used
    (when the points are worth splitting), and at least ``at_least`` (the fair shares' count:
    a part per slot when the compute is worth spreading, or enough that a slow task's
    micro-batch lets other tasks' parts run between its own)."""
    import numpy as np

    # A packed slice's points lie in one buffer: its size is their bytes, without a sum.
    total = len(tasks.data.data) if isinstance(tasks, StreamTasks) else int(np.sum(_points_bytes(tasks)))
    if at_least <= 1 and (workers <= 1 or total < 2 * SPLIT_BYTES):
        return [tasks]  # under 2 * SPLIT_BYTES of points: never worth splitting
    sizes = np.cumsum(_points_bytes(tasks))
    parts = max(1, min(workers, tasks.num_rows, total // SPLIT_BYTES), min(at_least, tasks.num_rows))
    if parts == 1:
        return [tasks]
    cuts = np.searchsorted(sizes, [total * i // parts for i in range(1, parts)], side="left") + 1
    bounds = [0, *sorted(set(cuts.tolist())), tasks.num_rows]
    return [tasks.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def _points_bytes(tasks: Tasks) -> Any:
    """Each task's bytes of points."""
    if isinstance(tasks, StreamTasks):
        return tasks.sizes()
    import pyarrow.compute as pc

    return pc.binary_length(tasks.column("data")).fill_null(0).to_numpy(zero_copy_only=False)
