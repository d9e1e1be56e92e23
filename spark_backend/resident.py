"""Resident workers: Spark tasks that stay up and compute one micro-batch after another.

A Spark job per micro-batch costs 0.2-0.5 s here before any work is done (planning,
scheduling, every row through the JVM twice), which caps a stream at a few
micro-batches a second. Instead the engine launches, per slot, one long-running
``mapInPandas`` job of one task. Each task, inside Spark's Python worker, connects back to
the agent over TCP, proves it was launched by this agent (a random token), and computes the
parts of micro-batches sent to it with ``compute.run_partition``'s code until the agent
closes the connection. Spark still places, starts and supervises the workers.

A job per slot, not one job of every slot: a worker that crashes (a UDF that segfaults,
exits, runs out of memory) fails its own job only, so the other slots' workers, and the
tasks computing on them, go on. The lost slot is launched again at once, and the part it
was computing is retried once on a fresh worker: a micro-batch's output is used only once
every part of it has come back, so a retry never emits anything twice.

Many tasks share one engine on a server: slots go to them fairly (``fairness.py``), and a
micro-batch is cut into parts so that no task holds more than its share of the slots
while another task has work waiting.

Messages, both ways: ``resident_protocol``. The job (the UDF and its options) travels once
per worker, pickled by Spark's own cloudpickle as Spark ships any pandas UDF; tasks and
results travel as Arrow IPC.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import itertools
import json
import logging
import math
import os
import secrets
import socket
import sys
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from spark_backend.fairness import FairShares, Ticket
from spark_backend.resident_protocol import (
    FAILURE,
    HANDLER,
    HELLO,
    JOB,
    JOB_KEY_BYTES,
    KEPT_JOBS,
    OVER_MEMORY,
    TASKS,
    WELCOME,
    JobCache,
    handler_call_parts,
    read_handler_outcome,
    receive_message,
    send_message,
)
from spark_backend.resident_worker import serve_slot
from udf_agent.compute.contract import Job
from udf_agent.errors import first_line
from udf_agent.wire.columns import ipc_to_table, table_to_ipc_buffer

if TYPE_CHECKING:  # the workers import this module: no Spark session code there
    from spark_backend.sessions import SparkSession
    from udf_agent.compute.engine import Tenant
    from udf_agent.compute.handlers import HandlerCall, HandlerOutcome

log = logging.getLogger(__name__)

T = TypeVar("T")

# Below this many bytes of points a micro-batch goes to one worker: splitting costs more.
SPLIT_BYTES = 512 * 1024


class WorkerLost(Exception):
    """A worker did not return its part of a micro-batch (the cause is the message)."""


class WorkerTimedOut(WorkerLost):
    """A worker returned nothing within the batch timeout (stuck, or a UDF that slow)."""


class WorkerOverMemory(RuntimeError):
    """A worker passed --worker-memory while computing: the UDF's own doing, not retried."""


class NoResidentWorker(Exception):
    """No resident worker is connected (Spark has no free core for one yet, or they were
    released after an idle spell): the engine runs the micro-batch as a Spark job."""


class ResidentStartError(RuntimeError):
    pass


class _SlotJob(threading.Thread):
    """The thread that runs one launch of a slot's Spark job, and how that job ended."""

    def __init__(self, target: Callable[[_SlotJob], None], name: str):
        super().__init__(target=target, args=(self,), name=name, daemon=True)
        self.error: BaseException | None = None


@dataclass(eq=False)
class _Worker:
    sock: socket.socket
    slot: int
    launch: int
    pid: int
    connected_at: float
    job: _SlotJob
    jobs: JobCache[None] = field(default_factory=JobCache)
    busy: bool = False
    handlers: set[str] = field(default_factory=set)  # the Handler scripts' tasks living here
    forget: list[str] = field(default_factory=list)  # ... that ended: told with the next call

    def __str__(self) -> str:
        return f"resident worker {self.slot} (pid {self.pid})"


@dataclass(eq=False)
class _Slot:
    """One resident task: its own Spark job, and its worker once connected."""

    index: int
    launch: int = 0  # which launch the slot is on (0: never launched, or retired)
    launched_at: float = -math.inf
    job_thread: _SlotJob | None = None
    job_group: str = ""
    worker: _Worker | None = None
    served: bool = False  # a worker of this launch connected


@dataclass(eq=False)
class _Part:
    index: int
    tasks: pa.Table
    retry_of: str | None = None  # what was lost the first time
    fresh_after: float | None = None  # a retry runs on a worker that connected after this


# On a cluster or Spark Connect a micro-batch waits this long after a launch for the first
# worker to connect; past it, micro-batches run as Spark jobs until one does (Spark's
# scheduler then shares the cores).
FIRST_WORKER_WAIT = 2.0
# How long Spark may take to start a launch's first worker.
START_TIMEOUT = 120.0
# A slot whose job ended with no worker connected (its task failed) is launched again at
# most this often; micro-batches run on the other slots, or as Spark jobs, meanwhile.
RELAUNCH_INTERVAL = 30.0
# ... and at most this often when a micro-batch waits for it (a retry, after an idle release).
FORCED_RELAUNCH_INTERVAL = 1.0
# After a worker is lost, how long its job gets to end and say why (Spark's crash report).
LOSS_REPORT_WAIT = 3.0
# The task whose tenant is not named (a caller outside an agent: tests, benchmarks).
_ANONYMOUS = object()


class ResidentWorkers:
    """The agent's end of the resident jobs: launches them, shares their slots between
    tasks, feeds them, relaunches a lost one, and releases them all when idle.

    Workers join as Spark gives their tasks a core. ``slots`` should be the cores the
    application has: a resident task holds its core for as long as it lives.
    """

    def __init__(self, session: SparkSession, slots: int, host: str, batch_timeout: float, idle_release: float | None = None, first_worker_wait: float = FIRST_WORKER_WAIT, worker_memory: int | None = None):
        self._session = session
        self.slots = slots
        self._host = host
        self.batch_timeout = batch_timeout
        self._idle_release = idle_release
        self.first_worker_wait = first_worker_wait
        self.worker_memory = worker_memory
        # Guards the slots, their workers and the fair shares; waiters for a slot wait on it.
        self._cond = threading.Condition()
        self._slots = [_Slot(index) for index in range(slots)]
        self._fair = FairShares()
        self._launch_numbers = itertools.count(1)
        self._token = secrets.token_hex(16)
        self._listener: socket.socket | None = None
        self._address: tuple[str, int] | None = None
        self._launches = 0
        self.worker_losses = 0
        self._released = False
        self._last_used = time.monotonic()
        self._pickled: OrderedDict[int, tuple[Job, bytes, bytes]] = OrderedDict()
        self._homes: dict[str, _Worker] = {}  # where each Handler script's task's handler lives
        self._pickle_lock = threading.Lock()
        self._stopped = threading.Event()
        # Wakes the idle-release thread: a launch (its workers' idle spell begins) or a stop.
        self._wake_idle_check = threading.Event()

    @property
    def launches(self) -> int:
        """Slot launches so far: each slot's first, then each relaunch."""
        return self._launches

    @property
    def released(self) -> bool:
        """Whether the workers were let go after an idle spell (relaunched on demand)."""
        return self._released

    def worker_pids(self) -> list[int]:
        with self._cond:
            return [slot.worker.pid for slot in self._slots if slot.worker is not None]

    def start(self) -> None:
        """Opens the workers' port and launches every slot; workers connect in the background."""
        listener = socket.create_server((self._host, 0))
        self._listener = listener
        self._address = (self._host, listener.getsockname()[1])
        threading.Thread(target=self._admit, args=(listener,), name="spark-resident-admit", daemon=True).start()
        with self._cond:
            for slot in self._slots:
                self._launch(slot)
        if self._idle_release is not None:
            threading.Thread(target=self._release_when_idle, name="spark-resident-idle", daemon=True).start()

    def wait_for_workers(self, count: int, timeout: float) -> bool:
        """Whether ``count`` workers are connected within ``timeout`` seconds."""
        with self._cond:
            self._cond.wait_for(lambda: self._connected() >= count or self._stopped.is_set() or self._all_jobs_ended(), timeout)
            return self._connected() >= count

    def connected(self) -> bool:
        """Whether a worker is connected now."""
        with self._cond:
            return self._connected() > 0

    def held_by(self, tenant: Hashable) -> int:
        with self._cond:
            return self._fair.held(tenant)

    def run(self, job: Job, tasks: pa.Table, tenant: Tenant | None = None) -> pa.Table:
        """The micro-batch's results, computed in parts on the slots this task may hold."""
        if self._stopped.is_set():
            raise WorkerLost("the engine was stopped")
        key: Hashable = tenant if tenant is not None else _ANONYMOUS
        self._await_first_worker()
        with self._cond:
            now = time.monotonic()
            share = self._fair.share(self.slots, now)
            parts = _split(tasks, share, at_least=self._fair.parts_for(key, tasks.num_rows, now))
        results = self._run_parts(job, [_Part(i, part) for i, part in enumerate(parts)], key, tenant)
        return pa.concat_tables(results) if len(results) > 1 else results[0]

    def run_handler(self, call: HandlerCall, tenant: Tenant | None = None) -> HandlerOutcome:
        """A Handler script's requests, on the worker its handler lives on (its home), the
        slot granted fairly like any part; a task without a home (its first call, or its
        worker lost or released) is given one, where its handler is built or rebuilt. A
        worker lost during the call: the call is retried once, on the first worker free."""
        if self._stopped.is_set():
            raise WorkerLost("the engine was stopped")
        key: Hashable = tenant if tenant is not None else _ANONYMOUS
        self._await_a_worker(time.monotonic() + START_TIMEOUT)
        retry_of: str | None = None
        while True:
            with self._cond:
                home = self._homes.get(call.task)
            # A retry may wait for the lost worker's slot to come back (when it was the only one).
            until = time.monotonic() + (self.batch_timeout if retry_of is None else max(self.batch_timeout, START_TIMEOUT))
            worker = self._acquire(key, tenant, until, block=True, fresh_after=None, home=home)
            assert worker is not None
            rebuild = call.task not in worker.handlers
            if rebuild and call.rebuild.lost is not None and (home is not None or retry_of is not None):
                self._release(worker, key, tenant)
                raise WorkerLost(f"the handler's worker was lost and the handler cannot be rebuilt: {call.rebuild.lost}")
            with self._cond:
                forget, worker.forget = tuple(worker.forget), []
            parts = handler_call_parts(dataclasses.replace(call, forget=call.forget + forget), rebuild)
            sent_at = time.monotonic()
            try:
                self._exchange(worker, sent_at + self.batch_timeout, functools.partial(send_message, worker.sock, HANDLER, *parts))
                kind, payload = self._exchange(worker, sent_at + self.batch_timeout, functools.partial(_next_message, worker))
            except WorkerLost as lost:
                self._lose(worker, key, tenant)
                with self._cond:
                    self._homes.pop(call.task, None)
                report = "" if isinstance(lost, WorkerTimedOut) else self._crash_report(worker)
                what = f"{lost} while computing {call.script.name}'s handler{report}"
                if retry_of is not None:
                    raise WorkerLost(f"{call.script.name}: its handler's requests failed twice on Spark's resident workers: {retry_of}; then {what}") from None
                # Any live worker will do (the lost one is gone from its slot, launched again):
                # the handler is rebuilt on the first one free.
                log.warning("%s; slot %d launched again and the handler rebuilt from its last snapshot on the first worker free", what, worker.slot)
                retry_of = what
                continue
            if kind == OVER_MEMORY:
                self._lose(worker, key, tenant)
                raise WorkerOverMemory(f"{call.script.name}: {payload.decode(errors='replace')}")
            self._release(worker, key, tenant)
            if kind == FAILURE:
                raise RuntimeError(f"{worker} failed: {payload.decode(errors='replace')}")
            outcome = read_handler_outcome(payload)
            outcome.where = f"on {worker}"
            with self._cond:
                if outcome.error is None:
                    worker.handlers.add(call.task)
                    self._homes[call.task] = worker
                else:
                    worker.handlers.discard(call.task)
                    self._homes.pop(call.task, None)
            return outcome

    def forget_handler(self, task: str) -> None:
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
                self._await_first_worker()
                return
            except NoResidentWorker:
                if time.monotonic() >= deadline:
                    raise
                self.wait_for_workers(1, 1.0)

    def stop(self) -> None:
        self._stopped.set()
        self._wake_idle_check.set()
        listener = self._listener
        if listener is not None:
            _close_listener(listener)
        self._retire_all(clean_end=5.0, after_cancel=5.0)

    # ---- a micro-batch's parts ----

    def _run_parts(self, job: Job, parts: list[_Part], key: Hashable, tenant: Tenant | None) -> list[pa.Table]:
        """Each part on a worker of its own as slots are granted; the parts' results in order.
        A part has the batch timeout to compute from when it is sent."""
        pending = deque(parts)
        in_flight: deque[tuple[_Part, _Worker, float]] = deque()
        results: list[pa.Table | None] = [None] * len(parts)
        slot_wait_until = time.monotonic() + self.batch_timeout
        try:
            while pending or in_flight:
                # Take slots for waiting parts: waiting for one only when none is computing.
                while pending:
                    part = pending[0]
                    until = slot_wait_until if part.fresh_after is None else max(slot_wait_until, time.monotonic() + START_TIMEOUT)
                    worker = self._acquire(key, tenant, until, block=not in_flight, fresh_after=part.fresh_after)
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
                    kind, payload = self._exchange(worker, sent_at + self.batch_timeout, functools.partial(_next_message, worker))
                except WorkerLost as lost:
                    self._after_loss(job, part, worker, key, tenant, lost, pending)
                    slot_wait_until = time.monotonic() + self.batch_timeout
                    continue
                if kind == OVER_MEMORY:
                    self._lose(worker, key, tenant)
                    raise WorkerOverMemory(f"UDF {job.spec.name!r}: {payload.decode(errors='replace')}")
                self._release(worker, key, tenant)
                with self._cond:
                    self._fair.measured(key, part.tasks.num_rows, time.monotonic() - sent_at)
                if kind == FAILURE:
                    raise RuntimeError(f"{worker} failed outside the UDF: {payload.decode(errors='replace')}")
                results[part.index] = ipc_to_table(payload)
        finally:
            # A part still out when the micro-batch fails: its answer is read and dropped
            # (or its worker given up), so the connection is ready for the next one.
            for _, worker, sent_at in in_flight:
                self._settle(worker, key, tenant, sent_at + self.batch_timeout)
        assert all(result is not None for result in results)
        return [result for result in results if result is not None]

    def _after_loss(self, job: Job, part: _Part, worker: _Worker, key: Hashable, tenant: Tenant | None, lost: WorkerLost, pending: deque[_Part]) -> None:
        """A worker was lost with ``part``: its slot is launched again and the part retried
        once, on a fresh worker; the second loss fails the micro-batch."""
        lost_at = time.monotonic()
        self._lose(worker, key, tenant)
        # A worker that ended says how (its job fails at once); a stuck one was cancelled.
        report = "" if isinstance(lost, WorkerTimedOut) else self._crash_report(worker)
        what = f"{lost} while computing UDF {job.spec.name!r}{report}"
        if part.retry_of is not None:
            raise WorkerLost(f"UDF {job.spec.name!r}: a micro-batch of {part.tasks.num_rows} group(s) failed twice on Spark's resident workers: {part.retry_of}; then {what}")
        log.warning("%s; slot %d launched again and the part of %d group(s) retried once", what, worker.slot, part.tasks.num_rows)
        pending.appendleft(_Part(part.index, part.tasks, retry_of=what, fresh_after=lost_at))

    @staticmethod
    def _crash_report(worker: _Worker) -> str:
        """What Spark saw of a lost worker's end, once its job has ended."""
        worker.job.join(LOSS_REPORT_WAIT)
        error = worker.job.error
        return f" ({_worker_end(error)})" if error is not None else ""

    def _send(self, worker: _Worker, job: Job, part: _Part, deadline: float) -> None:
        key, pickled = self._job_pickle(job)
        payload = table_to_ipc_buffer(part.tasks)
        self._exchange(worker, deadline, functools.partial(self._send_tasks, worker, key, pickled, payload))

    def _send_tasks(self, worker: _Worker, key: bytes, pickled: bytes, payload: pa.Buffer) -> None:
        if key not in worker.jobs:
            send_message(worker.sock, JOB, key, pickled)
            worker.jobs.add(key, None)
        worker.jobs.use(key)  # as the worker will on reading TASKS: the two caches stay alike
        send_message(worker.sock, TASKS, key, payload)

    def _settle(self, worker: _Worker, key: Hashable, tenant: Tenant | None, deadline: float) -> None:
        try:
            kind, _ = self._exchange(worker, deadline, functools.partial(_next_message, worker))
        except WorkerLost:
            self._lose(worker, key, tenant)
            return
        if kind == OVER_MEMORY:
            self._lose(worker, key, tenant)
        else:
            self._release(worker, key, tenant)

    def _exchange(self, worker: _Worker, deadline: float, action: Callable[[], T]) -> T:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerTimedOut(f"{worker} returned no result within the batch timeout ({self.batch_timeout:g} s)")
        worker.sock.settimeout(remaining)
        try:
            return action()
        except TimeoutError:
            raise WorkerTimedOut(f"{worker} returned no result within the batch timeout ({self.batch_timeout:g} s)") from None
        except OSError as exc:
            raise WorkerLost(f"{worker} was lost: {exc}") from None

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

    # ---- slots, shared fairly ----

    def _acquire(self, key: Hashable, tenant: Tenant | None, until: float, block: bool, fresh_after: float | None, home: _Worker | None = None) -> _Worker | None:
        """A free worker granted to this task by the fair shares (None if ``block`` is False
        and none is granted at once), ``home`` while it is there; WorkerLost past ``until``."""
        with self._cond:
            asked = time.monotonic()
            ticket = self._fair.wait(key, asked)
            ticket.fresh_after = fresh_after
            ticket.home = home
            try:
                while True:
                    if self._stopped.is_set():
                        raise WorkerLost("the engine was stopped")
                    now = time.monotonic()
                    if self._fair.next_ticket(self.slots, now, self._can_serve) is ticket:
                        worker = self._free_worker(fresh_after, home)
                        assert worker is not None
                        self._fair.grant(ticket, now)
                        worker.busy = True
                        self._last_used = now
                        if tenant is not None:
                            tenant.slot_waited(now - asked)
                            tenant.slots_now(self._fair.held(key))
                        return worker
                    if not block:
                        return None
                    if fresh_after is not None:
                        self._revive(now, force=True)
                    if now >= until:
                        raise WorkerLost(self._no_slot_cause(fresh_after))
                    self._cond.wait(min(until - now, FORCED_RELAUNCH_INTERVAL) if fresh_after is not None else until - now)
            finally:
                if not ticket.granted:
                    self._fair.withdraw(ticket)
                    self._cond.notify_all()  # the next waiter may be served now

    def _can_serve(self, ticket: Ticket) -> bool:
        return self._free_worker(ticket.fresh_after, ticket.home) is not None

    def _free_worker(self, fresh_after: float | None, home: object | None = None) -> _Worker | None:
        """``home`` while it is there; else, of the free workers, the one fewest Handler
        scripts' handlers live on: a handler made here stays for its task's life, and a slow
        one holds up only the handlers that share its worker."""
        if isinstance(home, _Worker) and self._slots[home.slot].worker is home:
            return None if home.busy else home
        free = [
            worker
            for slot in self._slots
            if (worker := slot.worker) is not None and not worker.busy and (fresh_after is None or worker.connected_at > fresh_after)
        ]
        return min(free, key=lambda worker: len(worker.handlers), default=None)

    def _no_slot_cause(self, fresh_after: float | None) -> str:
        if fresh_after is None:
            return f"no resident slot was free for this task within the batch timeout ({self.batch_timeout:g} s)"
        errors = [first_line(slot.job_thread.error) for slot in self._slots if slot.job_thread is not None and slot.job_thread.error is not None]
        reason = errors[0] if errors else f"no worker connected within {START_TIMEOUT:g} s"
        return f"relaunching the resident workers failed: {reason}"

    def _release(self, worker: _Worker, key: Hashable, tenant: Tenant | None) -> None:
        with self._cond:
            worker.busy = False
            now = time.monotonic()
            self._fair.release(key, now)
            self._last_used = now
            if tenant is not None:
                tenant.slots_now(self._fair.held(key))
            self._cond.notify_all()

    def _lose(self, worker: _Worker, key: Hashable, tenant: Tenant | None) -> None:
        """Gives up a worker this task held, launching its slot again unless that happened
        already (its job ended first); its job is ended, cancelled if it must be."""
        worker.sock.close()
        with self._cond:
            worker.busy = False
            now = time.monotonic()
            self._fair.release(key, now)
            if tenant is not None:
                tenant.slots_now(self._fair.held(key))
            slot = self._slots[worker.slot]
            relaunch = slot.launch == worker.launch and not self._stopped.is_set()
            if relaunch:
                self.worker_losses += 1
                self._launch(slot)
            self._cond.notify_all()
        if relaunch:
            threading.Thread(target=self._end_job, args=(worker.job, _job_group(worker.launch, self), 1.0, 30.0), name="spark-resident-retire", daemon=True).start()

    def _connected(self) -> int:
        return sum(1 for slot in self._slots if slot.worker is not None)

    def _all_jobs_ended(self) -> bool:
        return all(slot.job_thread is None or not slot.job_thread.is_alive() for slot in self._slots)

    def _await_first_worker(self) -> None:
        """Returns once a worker is connected; NoResidentWorker if none is by the end of the
        launch's grace, relaunching first when the workers were released or their jobs died."""
        with self._cond:
            self._revive(time.monotonic(), force=self._released)
            if self._connected():
                return
            wait = max(slot.launched_at for slot in self._slots) + self.first_worker_wait - time.monotonic()
        if wait > 0 and self.wait_for_workers(1, wait):
            return
        errors = [slot.job_thread.error for slot in self._slots if slot.job_thread is not None and slot.job_thread.error is not None]
        cause = f"its job ended: {first_line(errors[0])}" if errors else "Spark has no free core for one yet"
        raise NoResidentWorker(f"no resident worker is connected ({cause})")

    def _revive(self, now: float, force: bool) -> None:
        """Launches again the slots whose job ended with no worker (caller holds ``_cond``):
        if ``force`` (after an idle release, or for a retry) at most every
        FORCED_RELAUNCH_INTERVAL (a job that fails at once, on a lost session say, must not
        be launched in a loop), else at most every RELAUNCH_INTERVAL."""
        if self._released:
            log.info("a micro-batch after an idle spell: relaunching the resident workers")
            self._released = False
        interval = FORCED_RELAUNCH_INTERVAL if force else RELAUNCH_INTERVAL
        for slot in self._slots:
            ended = slot.job_thread is None or not slot.job_thread.is_alive()
            if slot.worker is None and ended and now - slot.launched_at >= interval:
                self._launch(slot)

    # ---- the resident jobs ----

    def _launch(self, slot: _Slot) -> None:
        """Starts the slot's job (caller holds ``_cond``); its worker connects in the background."""
        assert self._address is not None
        self._launches += 1
        slot.launch = next(self._launch_numbers)
        slot.launched_at = time.monotonic()
        slot.worker = None
        slot.served = False
        slot.job_group = _job_group(slot.launch, self)
        body = functools.partial(serve_slot, self._address, self._token, slot.index, slot.launch, self.worker_memory)
        slot.job_thread = _SlotJob(functools.partial(self._run_job, slot, slot.launch, slot.job_group, body), name=f"spark-resident-job-{slot.index}")
        slot.job_thread.start()
        self._wake_idle_check.set()

    def _run_job(self, slot: _Slot, launch: int, group: str, body: Callable[..., object], job: _SlotJob) -> None:
        try:
            self._session.tag_jobs(group)
            self._session.dataframes.range(0, 1, 1, 1).mapInPandas(body, schema="slot long, served long").collect()
        except BaseException as exc:  # read by whoever waits for the workers or reports a loss; cancelling ends here too
            job.error = exc
        error = job.error
        with self._cond:
            if slot.launch != launch:
                return  # retired or relaunched: nobody waits on this launch
            worker, slot.worker = slot.worker, None
            if worker is not None and not worker.busy:
                worker.sock.close()  # an idle worker whose job ended is gone; a busy one is lost by its reader
            if error is not None or slot.served:
                log.warning("Spark's resident job of slot %d ended: %s", slot.index, _worker_end(error) if error is not None else "its worker left")
            if slot.served and not self._stopped.is_set():
                self.worker_losses += 1
                self._launch(slot)  # it was serving: the slot is wanted back at once
            self._cond.notify_all()

    def _admit(self, listener: socket.socket) -> None:
        """Accepts workers for as long as the engine runs: a worker is admitted to the slot
        and launch it names, if that slot still waits for it."""
        while not self._stopped.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # the listener was closed: the engine stopped
            worker = self._greet(sock)
            if worker is None:
                continue
            with self._cond:
                slot = self._slots[worker.slot] if 0 <= worker.slot < len(self._slots) else None
                if slot is None or slot.launch != worker.launch or slot.worker is not None or self._stopped.is_set():
                    worker.sock.close()  # a launch since retired or relaunched: its task ends
                    continue
                slot.worker = worker
                slot.served = True
                count = self._connected()
                self._cond.notify_all()
            log.info("%s ready: %d of %d resident Spark worker(s) connected", worker, count, self.slots)

    def _greet(self, sock: socket.socket) -> _Worker | None:
        try:
            sock.settimeout(10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = receive_message(sock)
            if hello is None or hello[0] != HELLO:
                raise ValueError("no hello")
            details = json.loads(hello[1])
            if not hmac.compare_digest(str(details.get("token", "")).encode(), self._token.encode()):
                raise ValueError("wrong token")
            send_message(sock, WELCOME, self._token.encode())
            slot, launch = int(details["slot"]), int(details["launch"])
        except (OSError, ValueError, KeyError) as exc:
            log.warning("refused a connection on the resident workers' port: %s", exc)
            sock.close()
            return None
        with self._cond:
            job = self._slots[slot].job_thread if 0 <= slot < len(self._slots) and self._slots[slot].launch == launch else None
        if job is None:
            sock.close()  # a launch since retired or relaunched: its task ends
            return None
        return _Worker(sock, slot, launch, int(details["pid"]), time.monotonic(), job)

    def _end_job(self, thread: _SlotJob, group: str, clean_end: float, after_cancel: float) -> None:
        """A retired launch's job: ends by itself once its connection is closed; a job still
        running ``clean_end`` seconds later (a stuck worker, or a task still waiting for a
        core) is cancelled, which kills its worker."""
        thread.join(clean_end)
        if not thread.is_alive():
            return
        try:
            self._session.cancel(group)
        except Exception as exc:  # a dead JVM: its job is gone with it
            log.warning("cancelling Spark's resident job failed: %s", first_line(exc))
        thread.join(after_cancel)
        if thread.is_alive():
            log.warning("Spark's resident job %s did not end within %g s of its cancellation", group, after_cancel)

    def _retire_all(self, clean_end: float, after_cancel: float) -> None:
        with self._cond:
            retired = self._detach_all()
        self._end_jobs(retired, clean_end, after_cancel)

    def _detach_all(self) -> list[tuple[_SlotJob, str]]:
        """Closes every worker's connection (caller holds ``_cond``); the jobs to end."""
        retired = []
        for slot in self._slots:
            if slot.worker is not None:
                slot.worker.sock.close()
            if slot.job_thread is not None:
                retired.append((slot.job_thread, slot.job_group))
            slot.worker, slot.job_thread, slot.launch = None, None, 0
        self._cond.notify_all()
        return retired

    def _end_jobs(self, retired: list[tuple[_SlotJob, str]], clean_end: float, after_cancel: float) -> None:
        """Ends every retired slot's job, each given ``clean_end`` then cancelled."""
        enders = [threading.Thread(target=self._end_job, args=(thread, group, clean_end, after_cancel), daemon=True) for thread, group in retired]
        for ender in enders:
            ender.start()
        for ender in enders:
            ender.join()

    def _release_when_idle(self) -> None:
        """Ends the workers after ``idle_release`` seconds without a micro-batch: their cores
        go back to Spark (and, on a cluster, its executors to the cluster). It wakes when a
        release may be due, not every second: an idle task costs next to no CPU."""
        pause: float | None = None
        while True:
            self._wake_idle_check.wait(pause)
            self._wake_idle_check.clear()
            if self._stopped.is_set():
                return
            pause = self._release_if_idle()

    def _release_if_idle(self) -> float | None:
        """Releases the workers if their idle spell is over; how long until the next look
        (None: until the next launch)."""
        assert self._idle_release is not None
        with self._cond:
            if not self._connected():
                # Released, or still connecting after a launch: the launch woke us, and a
                # micro-batch on its workers moves the end of their idle spell on.
                return None if self._released else self._idle_release
            idle = time.monotonic() - self._last_used
            busy = any(slot.worker is not None and slot.worker.busy for slot in self._slots)
            if busy:
                return min(1.0, self._idle_release / 4)
            if idle < self._idle_release:
                return self._idle_release - idle
            self._released = True
            retired = self._detach_all()
        log.info("no micro-batch for %.0f s: resident workers released, their cores given back to Spark", idle)
        self._end_jobs(retired, clean_end=1.0, after_cancel=5.0)
        return None


def _job_group(launch: int, owner: object) -> str:
    """The Spark job group of one launch of a slot: cancelled alone."""
    return f"udf-agent-resident-{os.getpid()}-{id(owner)}-{launch}"


def _close_listener(listener: socket.socket) -> None:
    """Wakes the admitting thread's accept, then closes the port."""
    try:
        listener.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    listener.close()


def _worker_end(error: BaseException) -> str:
    """How a resident worker's Spark job ended, in a line: Spark's crash report (with
    ``spark.python.worker.faulthandler.enabled``, the fatal signal and the UDF's frame)."""
    text = str(error)
    crashed = text.find("Python worker exited unexpectedly")
    if crashed < 0:
        return first_line(error)
    report = text[crashed:].split("\n")
    headline = report[0].strip().rstrip(":")
    if headline.endswith("(crashed)") or not headline.partition("(crashed):")[2].strip():
        return f"{headline}: no crash report, so a signal it could not catch (SIGKILL, the out-of-memory killer) or os._exit"
    # Faulthandler lists every thread; the crashed one is "Current thread", innermost first.
    current = next((i for i, line in enumerate(report) if line.startswith("Current thread")), 0)
    frames = []
    for line in report[current + 1 :]:
        if not line.strip().startswith("File "):
            break
        frames.append(line.strip())
    ours = [frame for frame in frames if not _not_the_udfs(frame)]
    where = ours[0] if ours else frames[0] if frames else ""
    return f"{headline} at {where}" if where else headline


_STANDARD_LIBRARY = f"/lib/python{sys.version_info.major}.{sys.version_info.minor}/"


def _not_the_udfs(frame: str) -> bool:
    """Whether a crash report's frame is the standard library's, PySpark's or ours."""
    standard = _STANDARD_LIBRARY in frame and "-packages/" not in frame
    return standard or any(place in frame for place in ("/pyspark/", "/pyspark.zip/", "<frozen", "/udf_agent/", "/spark_backend/"))


def _next_message(worker: _Worker) -> tuple[int, bytearray]:
    """The worker's next message; its end of stream counts as losing it."""
    message = receive_message(worker.sock)
    if message is None:
        raise ConnectionError("it closed its connection")
    return message


def _split(tasks: pa.Table, workers: int, at_least: int = 1) -> list[pa.Table]:
    """Consecutive runs of tasks with about the same bytes of points: one per worker used
    (when the points are worth splitting), and at least ``at_least`` (so that a slow
    task's micro-batch lets other tasks' parts run between its own)."""
    import numpy as np
    import pyarrow.compute as pc

    sizes = np.cumsum(pc.binary_length(tasks.column("data")).to_numpy(zero_copy_only=False)) if tasks.num_rows else np.zeros(0)
    total = int(sizes[-1]) if len(sizes) else 0
    parts = max(1, min(workers, tasks.num_rows, total // SPLIT_BYTES), min(at_least, tasks.num_rows))
    if parts == 1:
        return [tasks]
    cuts = np.searchsorted(sizes, [total * i // parts for i in range(1, parts)], side="left") + 1
    bounds = [0, *sorted(set(cuts.tolist())), tasks.num_rows]
    return [tasks.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
