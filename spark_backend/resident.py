"""Resident workers: Spark tasks that stay up and compute one micro-batch after another.

A Spark job per micro-batch costs 0.2-0.5 s here before any work is done (planning,
scheduling, every row through the JVM twice), which caps a stream at a few
micro-batches a second. Instead the engine launches one long-running
``mapInPandas`` job with a task per slot. Each task, inside Spark's Python worker,
connects back to the agent over TCP, proves it was launched by this agent (a
random token), and computes the micro-batches sent to it with
``compute.run_partition``, the code every engine runs, until the agent closes the
connection. Spark still places, starts and supervises the workers; when one is
lost (killed, stuck past the batch timeout, its job cancelled) the engine
cancels the job, launches a fresh one and retries the micro-batch once. A
micro-batch's output is used only once every part of it has come back, so a
retry never emits anything twice.

Messages, both ways: a header (kind: 1 byte, payload length: 8 bytes), then the
payload. The job (the UDF and its options) travels once per worker, pickled by
Spark's own cloudpickle as Spark ships any pandas UDF; tasks and results travel
as Arrow IPC.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

import pyarrow as pa

from spark_backend.resident_protocol import FAILURE, HELLO, JOB, JOB_KEY_BYTES, KEPT_JOBS, TASKS, WELCOME, JobCache, receive_message, send_message
from spark_backend.resident_worker import serve_slot
from udf_agent.compute.contract import Job
from udf_agent.errors import first_line
from udf_agent.wire.columns import ipc_to_table, table_to_ipc_buffer

if TYPE_CHECKING:  # the workers import this module: no Spark session code there
    from spark_backend.sessions import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

# Below this many bytes of points a micro-batch goes to one worker: splitting costs more.
SPLIT_BYTES = 512 * 1024


class WorkerLost(Exception):
    """A worker did not return its part of a micro-batch (the cause is the message)."""


class NoResidentWorker(Exception):
    """No resident worker is connected (Spark has no free core for one yet, or they were
    released after an idle spell): the engine runs the micro-batch as a Spark job."""


class ResidentStartError(RuntimeError):
    pass


@dataclass
class _Worker:
    sock: socket.socket
    slot: int
    pid: int
    jobs: JobCache[None] = field(default_factory=JobCache)

    def __str__(self) -> str:
        return f"resident worker {self.slot} (pid {self.pid})"


# On a cluster or Spark Connect a micro-batch waits this long after a launch for the first
# worker to connect; past it, micro-batches run as Spark jobs until one does (Spark's
# scheduler then shares the cores).
FIRST_WORKER_WAIT = 2.0
# How long Spark may take to start a launch's first worker.
START_TIMEOUT = 120.0
# A resident job that ended with no worker connected (its tasks failed) is launched again
# at most this often; micro-batches run as Spark jobs meanwhile.
RELAUNCH_INTERVAL = 30.0


class ResidentWorkers:
    """The agent's end of the resident job: launches it, feeds it, relaunches it, and
    releases it when idle.

    Workers join as Spark gives their tasks a core: the first one connected computes, the
    others take their share as they arrive. ``slots`` should be the cores the application
    has: a resident task holds its core for as long as it lives.
    """

    def __init__(self, session: SparkSession, slots: int, host: str, batch_timeout: float, idle_release: float | None = None, first_worker_wait: float = FIRST_WORKER_WAIT):
        self._session = session
        self.slots = slots
        self._host = host
        self.batch_timeout = batch_timeout
        self._idle_release = idle_release
        self.first_worker_wait = first_worker_wait
        # Connected workers: the listener thread adds, micro-batches (under _lock) use them.
        self._workers: list[_Worker] = []
        self._joined = threading.Condition()
        self._launched_at = 0.0
        self._generation = 0
        self._job_thread: threading.Thread | None = None
        self._job_group = ""
        self._job_error: BaseException | None = None
        self._launches = 0
        self._released = False
        self._last_used = time.monotonic()
        self._pickled: OrderedDict[int, tuple[Job, bytes, bytes]] = OrderedDict()
        # One micro-batch at a time: a relaunch must not pull workers from under another.
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        # Wakes the idle-release thread: a launch (its workers' idle spell begins) or a stop.
        self._wake_idle_check = threading.Event()

    @property
    def launches(self) -> int:
        return self._launches

    @property
    def released(self) -> bool:
        """Whether the workers were let go after an idle spell (relaunched on demand)."""
        return self._released

    def worker_pids(self) -> list[int]:
        with self._joined:
            return [worker.pid for worker in self._workers]

    def start(self) -> None:
        """Launches the resident job; its workers connect in the background."""
        with self._lock:
            self._launch()
        if self._idle_release is not None:
            threading.Thread(target=self._release_when_idle, name="spark-resident-idle", daemon=True).start()

    def wait_for_workers(self, count: int, timeout: float) -> bool:
        """Whether ``count`` workers are connected within ``timeout`` seconds."""
        with self._joined:
            self._joined.wait_for(lambda: len(self._workers) >= count or self._stopped.is_set() or self._job_ended(), timeout)
            return len(self._workers) >= count

    def _job_ended(self) -> bool:
        thread = self._job_thread
        return thread is None or not thread.is_alive()

    def run(self, job: Job, tasks: pa.Table) -> pa.Table:
        with self._lock:
            if self._stopped.is_set():
                raise WorkerLost("the engine was stopped")
            self._last_used = time.monotonic()
            try:
                self._await_first_worker()
                return self._run_with_retry(job, tasks)
            finally:
                self._last_used = time.monotonic()

    def stop(self) -> None:
        self._stopped.set()
        self._wake_idle_check.set()
        with self._lock:
            self._retire(clean_end=5.0, after_cancel=5.0)

    def _await_first_worker(self) -> None:
        """Returns once a worker is connected; NoResidentWorker if none is by the end of the
        launch's grace, relaunching first when the workers were released or their job died."""
        if self.connected():
            return
        if self._released or (self._job_ended() and time.monotonic() - self._launched_at >= RELAUNCH_INTERVAL):
            if self._released:
                log.info("a micro-batch after an idle spell: relaunching the resident workers")
            self._retire(clean_end=0.0, after_cancel=5.0)
            self._launch()
        wait = self._launched_at + self.first_worker_wait - time.monotonic()
        if wait > 0 and self.wait_for_workers(1, wait):
            return
        cause = f"its job ended: {first_line(self._job_error)}" if self._job_error is not None else "Spark has no free core for one yet"
        raise NoResidentWorker(f"no resident worker is connected ({cause})")

    def _run_with_retry(self, job: Job, tasks: pa.Table) -> pa.Table:
        try:
            return self._run_once(job, tasks)
        except WorkerLost as first:
            log.warning("%s; relaunching Spark's resident workers and retrying the micro-batch once", first)
            self._relaunch()
            try:
                return self._run_once(job, tasks)
            except WorkerLost as second:
                self._relaunch_quietly()
                raise WorkerLost(
                    f"UDF {job.spec.name!r}: a micro-batch of {tasks.num_rows} group(s) failed twice on Spark's resident workers: {first}; then {second}"
                ) from second

    def connected(self) -> bool:
        """Whether a worker is connected now."""
        with self._joined:
            return bool(self._workers)

    # ---- one micro-batch ----

    def _run_once(self, job: Job, tasks: pa.Table) -> pa.Table:
        with self._joined:
            workers = list(self._workers)
        if not workers:
            raise WorkerLost("no resident worker is connected")
        key, pickled = self._job_pickle(job)
        parts = _split(tasks, len(workers))
        deadline = time.monotonic() + self.batch_timeout
        used = workers[: len(parts)]
        for worker, part in zip(used, parts):
            payload = table_to_ipc_buffer(part)
            self._exchange(worker, deadline, functools.partial(self._send_tasks, worker, key, pickled, payload))
        results = []
        for worker in used:
            kind, payload = self._exchange(worker, deadline, functools.partial(_next_message, worker))
            if kind == FAILURE:
                raise RuntimeError(f"{worker} failed outside the UDF: {payload.decode(errors='replace')}")
            results.append(ipc_to_table(payload))
        # Parts are consecutive runs of tasks, each answered in task order.
        return pa.concat_tables(results) if len(results) > 1 else results[0]

    def _send_tasks(self, worker: _Worker, key: bytes, pickled: bytes, payload: pa.Buffer) -> None:
        if key not in worker.jobs:
            send_message(worker.sock, JOB, key, pickled)
            worker.jobs.add(key, None)
        worker.jobs.use(key)  # as the worker will on reading TASKS: the two caches stay alike
        send_message(worker.sock, TASKS, key, payload)

    def _exchange(self, worker: _Worker, deadline: float, action: Callable[[], T]) -> T:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise WorkerLost(f"{worker} returned no result within the batch timeout ({self.batch_timeout:g} s)")
        worker.sock.settimeout(remaining)
        try:
            return action()
        except TimeoutError:
            raise WorkerLost(f"{worker} returned no result within the batch timeout ({self.batch_timeout:g} s)") from None
        except OSError as exc:
            raise WorkerLost(f"{worker} was lost: {exc}") from None

    def _job_pickle(self, job: Job) -> tuple[bytes, bytes]:
        cached = self._pickled.get(id(job))
        if cached is None or cached[0] is not job:
            from pyspark import cloudpickle

            pickled = cloudpickle.dumps(job)
            cached = (job, hashlib.sha256(pickled).digest()[:JOB_KEY_BYTES], pickled)
            self._pickled[id(job)] = cached  # the job is held, so its id is not reused meanwhile
            while len(self._pickled) > KEPT_JOBS:
                self._pickled.popitem(last=False)
        return cached[1], cached[2]

    # ---- the resident job ----

    def _launch(self) -> None:
        """Starts the resident job and a thread that admits its workers as they connect."""
        self._launches += 1
        self._generation += 1
        self._released = False
        self._launched_at = time.monotonic()
        self._wake_idle_check.set()
        token = secrets.token_hex(16)
        self._job_group = f"udf-agent-resident-{os.getpid()}-{id(self)}-{self._launches}"
        self._job_error = None
        listener = socket.create_server((self._host, 0))
        address = (self._host, listener.getsockname()[1])
        self._job_thread = threading.Thread(target=self._run_job, args=(self._job_group, address, token), name="spark-resident-job", daemon=True)
        self._job_thread.start()
        threading.Thread(target=self._admit, args=(listener, token, self._generation, self._job_thread), name="spark-resident-admit", daemon=True).start()

    def _admit(self, listener: socket.socket, token: str, generation: int, job_thread: threading.Thread) -> None:
        """Accepts the launch's workers until every slot has one, the job ends or the
        workers are retired; a worker counts from the moment it connects."""
        with listener:
            listener.settimeout(0.2)
            while generation == self._generation and not self._stopped.is_set():
                with self._joined:
                    if len(self._workers) >= self.slots:
                        return
                if not job_thread.is_alive():
                    log.warning(
                        "Spark's resident job ended with %d worker(s) connected: %s", len(self._workers), first_line(self._job_error or "no error reported")
                    )
                    with self._joined:
                        self._joined.notify_all()
                    return
                try:
                    sock, _ = listener.accept()
                except TimeoutError:
                    continue
                worker = self._greet(sock, token)
                if worker is None:
                    continue
                with self._joined:
                    if generation != self._generation:
                        worker.sock.close()
                        return
                    self._workers = sorted([*self._workers, worker], key=lambda w: w.slot)
                    count = len(self._workers)
                    self._joined.notify_all()
                log.info("%s ready: %d of %d resident Spark worker(s) connected", worker, count, self.slots)

    def _greet(self, sock: socket.socket, token: str) -> _Worker | None:
        try:
            sock.settimeout(10)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            hello = receive_message(sock)
            if hello is None or hello[0] != HELLO:
                raise ValueError("no hello")
            details = json.loads(hello[1])
            if not hmac.compare_digest(str(details.get("token", "")).encode(), token.encode()):
                raise ValueError("wrong token")
            send_message(sock, WELCOME, token.encode())
            return _Worker(sock, int(details["slot"]), int(details["pid"]))
        except (OSError, ValueError, KeyError) as exc:
            log.warning("refused a connection on the resident workers' port: %s", exc)
            sock.close()
            return None

    def _run_job(self, group: str, address: tuple[str, int], token: str) -> None:
        try:
            self._session.tag_jobs(group)
            frame = self._session.dataframes.range(0, self.slots, 1, self.slots)
            frame.mapInPandas(functools.partial(serve_slot, address, token), schema="slot long, served long").collect()
        except BaseException as exc:  # read by whoever waits for the workers; cancelling ends here too
            self._job_error = exc

    def _relaunch(self) -> None:
        """Fresh workers for a retry: waits for the first of them (up to the start timeout)."""
        self._retire(clean_end=1.0, after_cancel=30.0)
        self._launch()
        if not self.wait_for_workers(1, START_TIMEOUT):
            reason = first_line(self._job_error) if self._job_error is not None else f"no worker connected within {START_TIMEOUT:g} s"
            raise WorkerLost(f"relaunching the resident workers failed: {reason}")

    def _relaunch_quietly(self) -> None:
        """After a failed retry: fresh workers for the next micro-batch, if they start."""
        try:
            self._relaunch()
        except WorkerLost as exc:
            log.error("%s", exc)

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
        if not self.connected():
            # Released, or still connecting after a launch: the launch woke us, and a
            # micro-batch on its workers moves the end of their idle spell on.
            return None if self._released else self._idle_release
        idle = time.monotonic() - self._last_used
        if idle < self._idle_release:
            return self._idle_release - idle
        if not self._lock.acquire(blocking=False):
            return min(1.0, self._idle_release / 4)  # a micro-batch (or a relaunch) is under way
        try:
            idle = time.monotonic() - self._last_used
            if self.connected() and not self._stopped.is_set() and idle >= self._idle_release:
                log.info("no micro-batch for %.0f s: resident workers released, their cores given back to Spark", idle)
                self._retire(clean_end=1.0, after_cancel=5.0)
                self._released = True
                return None
            return max(0.01, self._idle_release - idle)
        finally:
            self._lock.release()

    def _retire(self, clean_end: float, after_cancel: float) -> None:
        """Closes every connection, after which a worker's task ends; a job still running
        ``clean_end`` seconds later (a stuck worker, or tasks still waiting for a core) is
        cancelled, which kills its workers."""
        with self._joined:
            self._generation += 1  # the admitting thread stops, and closes its listener
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.sock.close()
        thread = self._job_thread
        if thread is None:
            return
        thread.join(clean_end)
        if thread.is_alive():
            try:
                self._session.cancel(self._job_group)
            except Exception as exc:  # a dead JVM: its job is gone with it
                log.warning("cancelling Spark's resident job failed: %s", first_line(exc))
            thread.join(after_cancel)
            if thread.is_alive():
                log.warning("Spark's resident job %s did not end within %g s of its cancellation", self._job_group, after_cancel)
        self._job_thread = None


def _next_message(worker: _Worker) -> tuple[int, bytearray]:
    """The worker's next message; its end of stream counts as losing it."""
    message = receive_message(worker.sock)
    if message is None:
        raise ConnectionError("it closed its connection")
    return message


def _split(tasks: pa.Table, workers: int) -> list[pa.Table]:
    """Consecutive runs of tasks with about the same bytes of points, one per worker used."""
    import numpy as np
    import pyarrow.compute as pc

    sizes = np.cumsum(pc.binary_length(tasks.column("data")).to_numpy(zero_copy_only=False)) if tasks.num_rows else np.zeros(0)
    total = int(sizes[-1]) if len(sizes) else 0
    parts = max(1, min(workers, tasks.num_rows, total // SPLIT_BYTES))
    if parts == 1:
        return [tasks]
    cuts = np.searchsorted(sizes, [total * i // parts for i in range(1, parts)], side="left") + 1
    bounds = [0, *sorted(set(cuts.tolist())), tasks.num_rows]
    return [tasks.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
