"""The resident jobs, one per slot: launched, their workers admitted as they connect, launched
again when one is lost or ends, released after an idle spell, and retired at the end.

A job per slot, not one job of every slot: a worker that crashes (a UDF that segfaults,
exits, runs out of memory) fails its own job only, so the other slots' workers, and the
tasks computing on them, go on. Each ``Worker`` exchanges messages with the agent itself; what
runs on the workers is ``resident.py``'s (micro-batches) and ``resident_handlers.py``'s (Handler
scripts), who gets which ``resident_grants.py``'s.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import secrets
import select
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from spark_backend.growth import CoreGrowth, Holding
from spark_backend.resident_protocol import HELLO, PROOF, WELCOME, JobCache, Link, WorkerAddress, clock_id
from spark_backend.resident_worker import serve_slot
from spark_backend.worker_channel import NONCE_BYTES, AgentCertificate, agent_proof, new_nonce, proven, worker_proof
from udf_agent.compute.engine import ComputeFailed
from udf_agent.errors import first_line

if TYPE_CHECKING:  # the workers import this module: no Spark session code there
    from spark_backend.sessions import SparkSession

log = logging.getLogger(__name__)

T = TypeVar("T")

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
# While its cores may grow, how often an engine looks at how busy its workers were.
GROWTH_TICK = 1.0


class WorkerLost(Exception):
    """A worker did not return its part of a micro-batch (the cause is the message)."""


class WorkerTimedOut(WorkerLost):
    """A worker returned nothing within the batch timeout (stuck, or a UDF that slow)."""


class WorkerLostTwice(WorkerLost, ComputeFailed):
    """A part's worker was lost, and so was the fresh one its retry ran on."""


class WorkerOverMemory(ComputeFailed):
    """A worker passed --worker-memory while computing: the UDF's own doing, not retried."""


class NoResidentWorker(Exception):
    """No resident worker is connected (Spark has no free core for one yet, or they were
    released after an idle spell): the engine runs the micro-batch as a Spark job."""


class SlotJob(threading.Thread):
    """The thread that runs one launch of a slot's Spark job, and how that job ended."""

    def __init__(self, target: Callable[[SlotJob], None], name: str):
        super().__init__(target=target, args=(self,), name=name, daemon=True)
        self.error: BaseException | None = None


@dataclass(eq=False)
class Worker:
    """A resident worker's connection, and what the agent keeps about it."""

    link: Link
    slot: int
    launch: int
    pid: int
    connected_at: float
    job: SlotJob
    # The times in its answers are the agent's own clock (``resident_protocol.clock_id``).
    same_clock: bool = False
    jobs: JobCache[None] = field(default_factory=JobCache)
    busy: bool = False
    handlers: set[str] = field(default_factory=set)  # the Handler scripts' tasks living here
    forget: list[str] = field(default_factory=list)  # ... that ended: told with the next call

    def __str__(self) -> str:
        return f"resident worker {self.slot} (pid {self.pid})"

    def exchange(self, deadline: float, batch_timeout: float, action: Callable[..., T]) -> T:
        """``action(deadline=deadline)`` on the connection: WorkerTimedOut past the deadline,
        WorkerLost if the connection fails."""
        if deadline <= time.monotonic():
            raise WorkerTimedOut(f"{self} returned no result within the batch timeout ({batch_timeout:g} s)")
        try:
            return action(deadline=deadline)
        except TimeoutError:
            raise WorkerTimedOut(f"{self} returned no result within the batch timeout ({batch_timeout:g} s)") from None
        except OSError as exc:
            raise WorkerLost(f"{self} was lost: {exc}") from None

    def next_message(self, deadline: float) -> tuple[int, bytearray]:
        """The worker's next message by ``deadline``; its end of stream counts as losing it."""
        message = self.link.receive(deadline)
        if message is None:
            raise ConnectionError("it closed its connection")
        return message

    def crash_report(self) -> str:
        """What Spark saw of the worker's end, once its job has ended (after a loss)."""
        self.job.join(LOSS_REPORT_WAIT)
        return f" ({worker_end(self.job.error)})" if self.job.error is not None else ""


@dataclass
class Greeting:
    """Who a connection on the workers' port says it is, once it proved it knows the token."""

    link: Link
    slot: int
    launch: int
    pid: int
    clock: str | None = None  # ``resident_protocol.clock_id`` where the worker runs


# A worker's hello is a line of JSON; anything longer is not one.
HELLO_MAX_BYTES = 4096
# A worker's proof is one HMAC-SHA256.
PROOF_MAX_BYTES = 32
# Seconds a connection at the door has to finish its TLS handshake, say hello and prove the token.
HELLO_WAIT = 10.0


class WorkerDoor:
    """The port the resident workers connect back to, TLS with the agent's ephemeral
    certificate (``worker_channel``), and beside it a unix socket in a directory only this user
    may enter: a worker on this host (a local master, or a server here) takes the socket, whose
    round trip costs half the port's. A connection is greeted only once it proved, by challenge
    and response, that it holds this agent's random token (a worker launched by it), and the
    agent proves it holds the token too; any other is refused, whatever it sends."""

    def __init__(self) -> None:
        self.token = secrets.token_hex(16)
        self.address: WorkerAddress | None = None
        self._listeners: list[socket.socket] = []
        self._local_dir: str | None = None
        self._certificate: AgentCertificate | None = None

    def open(self, host: str) -> None:
        self._local_dir = tempfile.mkdtemp(prefix="udf-agent-workers-")  # mode 700
        self._certificate = AgentCertificate(self._local_dir)
        listener = socket.create_server((host, 0))
        self._listeners = [listener]
        self.address = WorkerAddress(host, listener.getsockname()[1], self._certificate.fingerprint, self._open_local(self._local_dir))

    def _open_local(self, directory: str) -> str | None:
        """The unix socket's path; None if it cannot be made (a $TMPDIR past the 107 bytes a
        socket's path may take, say): the workers then all take the port."""
        path = os.path.join(directory, "door")
        local = socket.socket(socket.AF_UNIX)
        try:
            local.bind(path)
            local.listen()
        except OSError as exc:
            local.close()
            log.info("the resident workers connect over TCP only: no unix socket at %s (%s)", path, exc)
            return None
        self._listeners.append(local)
        return path

    def close(self) -> None:
        """Wakes ``greetings``' wait, then closes the port and the socket."""
        for listener in self._listeners:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        if self._local_dir is not None:
            shutil.rmtree(self._local_dir, ignore_errors=True)

    def greetings(self) -> Iterator[Greeting]:
        """Each connection that proves it knows the token, until the door is closed."""
        assert self._listeners
        while True:
            try:
                ready, _, _ = select.select(self._listeners, [], [])
                sock, _ = ready[0].accept()
            except (OSError, ValueError):
                return  # closed: the engine stopped
            greeting = self._greet(sock)
            if greeting is not None:
                yield greeting

    def _greet(self, sock: socket.socket) -> Greeting | None:
        deadline = time.monotonic() + HELLO_WAIT
        try:
            if sock.family != socket.AF_UNIX:
                assert self._certificate is not None
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock = self._certificate.accept(sock, HELLO_WAIT)
            link = Link(sock, deadlines=True)
            hello = link.receive(deadline, max_length=HELLO_MAX_BYTES)
            if hello is None or hello[0] != HELLO:
                raise ValueError("no hello")
            said = bytes(hello[1])
            details = json.loads(said)
            if not isinstance(details, dict):
                raise ValueError("no hello")
            worker_nonce = bytes.fromhex(details["nonce"])
            if len(worker_nonce) != NONCE_BYTES:
                raise ValueError("a hello without its nonce")
            clock = details.get("clock")
            greeting = Greeting(link, int(details["slot"]), int(details["launch"]), int(details["pid"]), clock if isinstance(clock, str) else None)
            agent_nonce = new_nonce()
            link.send(WELCOME, agent_nonce, agent_proof(self.token, worker_nonce, agent_nonce), deadline=deadline)
            answer = link.receive(deadline, max_length=PROOF_MAX_BYTES)
            if answer is None or answer[0] != PROOF or not proven(worker_proof(self.token, agent_nonce, said), answer[1]):
                raise ValueError("wrong token")
            return greeting
        except ssl.SSLError as exc:
            log.warning("refused a connection on the resident workers' port: not a TLS 1.3 client of the agent's certificate (%s)", exc.reason or exc)
            sock.close()
            return None
        # Anyone who reaches the port may connect: whatever it sends, the door stays open for the workers.
        except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
            log.warning("refused a connection on the resident workers' port: %s", exc)
            sock.close()
            return None


@dataclass(eq=False)
class _Slot:
    """One resident task: its own Spark job, and its worker once connected."""

    index: int
    launch: int = 0  # which launch the slot is on (0: never launched, or retired)
    launched_at: float = -math.inf
    job_thread: SlotJob | None = None
    job_group: str = ""
    worker: Worker | None = None
    served: bool = False  # a worker of this launch connected
    active: bool = True  # wanted: launched, and launched again when its job ends (else retired)


class ResidentSlots:
    """The slots and their workers. ``cond`` guards them; whoever hands workers out guards
    its own bookkeeping with it too, so that a waiter for a worker wakes when one joins.

    ``count`` slots, or, with ``growth``, as many as it wants from one on: slots are added
    while the workers are busy nearly all the time and retired once the work fits in fewer
    (``growth.py``; Spark's dynamic allocation turns them into executors and back)."""

    def __init__(self, session: SparkSession, count: int, idle_release: float | None, first_worker_wait: float, worker_memory: int | None, growth: CoreGrowth | None = None):
        self._session = session
        self._growth = growth
        self._cores: int | None = None  # with growth: the executors' cores, as last seen
        self.count = growth.wanted if growth is not None else count  # the active slots
        self._idle_release = idle_release
        self.first_worker_wait = first_worker_wait
        self._worker_memory = worker_memory
        self.cond = threading.Condition()
        self._slots = [_Slot(index) for index in range(self.count)]
        self._door = WorkerDoor()
        self._clock = clock_id()
        self.launches = 0  # each slot's first launch, then each relaunch; also the launch numbers
        self.worker_losses = 0
        self.released = False  # the workers were let go after an idle spell (relaunched on demand)
        self.last_used = time.monotonic()  # set by whoever hands workers out (caller holds ``cond``)
        self.stopped = threading.Event()
        # Wakes the idle-release thread: a launch (its workers' idle spell begins) or a stop.
        self._wake_idle_check = threading.Event()
        self._wake_growth = threading.Event()  # ... and the growth thread, after a release

    def start(self, host: str) -> None:
        """Opens the workers' port on ``host`` and launches every slot; workers connect in the background."""
        self._door.open(host)
        threading.Thread(target=self._admit, name="spark-resident-admit", daemon=True).start()
        with self.cond:
            for slot in self._slots:
                self._launch(slot)
        if self._idle_release is not None:
            threading.Thread(target=self._release_when_idle, name="spark-resident-idle", daemon=True).start()
        if self._growth is not None:
            threading.Thread(target=self._follow_demand, name="spark-resident-growth", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()
        self._wake_idle_check.set()
        self._wake_growth.set()
        self._door.close()
        with self.cond:
            retired = self._detach_all()
        self._end_jobs(retired, clean_end=5.0, after_cancel=5.0)

    # ---- what the workers are (caller holds ``cond`` where it says) ----

    def workers(self) -> Iterator[Worker]:
        """The connected workers (caller holds ``cond``)."""
        return (slot.worker for slot in self._slots if slot.worker is not None)

    def holds(self, worker: Worker) -> bool:
        """Whether ``worker`` is still its slot's (caller holds ``cond``)."""
        return self._slots[worker.slot].worker is worker

    def connected(self) -> int:
        """Workers connected now (caller holds ``cond``)."""
        return sum(1 for slot in self._slots if slot.worker is not None)

    def serving(self) -> int:
        """The slots a micro-batch may be spread over now: the active ones whose worker is
        connected, one at least (caller holds ``cond``)."""
        return max(1, min(self.count, self.connected()))

    def set_busy(self, worker: Worker, busy: bool) -> None:
        """``worker`` starts or ends a call (caller holds ``cond``): what growth measures."""
        worker.busy = busy
        if self._growth is not None:
            self._growth.busy_workers(time.monotonic(), sum(1 for other in self.workers() if other.busy))

    def holding(self) -> Holding:
        """The slots wanted and connected, and why so many."""
        with self.cond:
            connected = self.connected()
            if self._growth is None:
                return Holding(self.count, connected, "fixed: --resident-slots, spark.cores.max or the master's cores", None)
            return self._growth.holding(connected, self._cores)

    def worker_pids(self) -> list[int]:
        with self.cond:
            return [worker.pid for worker in self.workers()]

    def job_errors(self) -> list[BaseException]:
        """How the slots' last jobs failed, if they did (caller holds ``cond``)."""
        return [slot.job_thread.error for slot in self._slots if slot.job_thread is not None and slot.job_thread.error is not None]

    def wait_for_workers(self, count: int, timeout: float) -> bool:
        """Whether ``count`` workers are connected within ``timeout`` seconds."""
        with self.cond:
            self.cond.wait_for(lambda: self.connected() >= count or self.stopped.is_set() or self._all_jobs_ended(), timeout)
            return self.connected() >= count

    def _all_jobs_ended(self) -> bool:
        return all(slot.job_thread is None or not slot.job_thread.is_alive() for slot in self._slots)

    def await_first_worker(self) -> None:
        """Returns once a worker is connected; NoResidentWorker if none is by the end of the
        launch's grace, relaunching first when the workers were released or their jobs died."""
        with self.cond:
            self.revive(time.monotonic(), force=self.released)
            if self.connected():
                return
            wait = max(slot.launched_at for slot in self._slots) + self.first_worker_wait - time.monotonic()
        if wait > 0 and self.wait_for_workers(1, wait):
            return
        with self.cond:
            errors = self.job_errors()
        cause = f"its job ended: {first_line(errors[0])}" if errors else "Spark has no free core for one yet"
        raise NoResidentWorker(f"no resident worker is connected ({cause})")

    # ---- launches ----

    def revive(self, now: float, force: bool) -> None:
        """Launches again the slots whose job ended with no worker (caller holds ``cond``):
        if ``force`` (after an idle release, or for a retry) at most every
        FORCED_RELAUNCH_INTERVAL (a job that fails at once, on a lost session say, must not
        be launched in a loop), else at most every RELAUNCH_INTERVAL."""
        if self.released:
            log.info("a micro-batch after an idle spell: relaunching the resident workers")
            self.released = False
        interval = FORCED_RELAUNCH_INTERVAL if force else RELAUNCH_INTERVAL
        for slot in self._slots:
            ended = slot.job_thread is None or not slot.job_thread.is_alive()
            if slot.active and slot.worker is None and ended and now - slot.launched_at >= interval:
                self._launch(slot)

    def relaunch_lost(self, worker: Worker) -> bool:
        """``worker`` was given up: its slot is launched again unless that happened already
        (its job ended first) or the slots were stopped (caller holds ``cond``); whether it was.
        The caller then ends the lost launch's job (``end_job``)."""
        slot = self._slots[worker.slot]
        if slot.launch != worker.launch or self.stopped.is_set():
            return False
        self.worker_losses += 1
        self._launch(slot)
        return True

    def end_job_soon(self, worker: Worker) -> None:
        """Ends a lost worker's job in the background: by itself within a second, else cancelled."""
        threading.Thread(target=self._end_job, args=(worker.job, _job_group(worker.launch, self), 1.0, 30.0), name="spark-resident-retire", daemon=True).start()

    def _launch(self, slot: _Slot) -> None:
        """Starts the slot's job (caller holds ``cond``); its worker connects in the background."""
        assert self._door.address is not None
        self.launches += 1
        slot.launch = self.launches
        slot.launched_at = time.monotonic()
        slot.worker = None
        slot.served = False
        slot.job_group = _job_group(slot.launch, self)
        body = functools.partial(serve_slot, self._door.address, self._door.token, slot.index, slot.launch, self._worker_memory)
        slot.job_thread = SlotJob(functools.partial(self._run_job, slot, slot.launch, slot.job_group, body), name=f"spark-resident-job-{slot.index}")
        slot.job_thread.start()
        self._wake_idle_check.set()
        self._wake_growth.set()

    def _run_job(self, slot: _Slot, launch: int, group: str, body: Callable[..., object], job: SlotJob) -> None:
        try:
            self._session.tag_jobs(group)
            self._session.dataframes.range(0, 1, 1, 1).mapInPandas(body, schema="slot long, served long").collect()
        except BaseException as exc:  # read by whoever waits for the workers or reports a loss; cancelling ends here too
            job.error = exc
        error = job.error
        with self.cond:
            if slot.launch != launch:
                return  # retired or relaunched: nobody waits on this launch
            worker, slot.worker = slot.worker, None
            if worker is not None and not worker.busy:
                worker.link.close()  # an idle worker whose job ended is gone; a busy one is lost by its reader
            if error is not None or slot.served:
                log.warning("Spark's resident job of slot %d ended: %s", slot.index, worker_end(error) if error is not None else "its worker left")
            if slot.served and not self.stopped.is_set():
                self.worker_losses += 1
                self._launch(slot)  # it was serving: the slot is wanted back at once
            self.cond.notify_all()

    def _admit(self) -> None:
        """Admits each worker greeted at the door to the slot and launch it names, if that
        slot still waits for it; for as long as the slots run."""
        for greeting in self._door.greetings():
            with self.cond:
                slot = self._slots[greeting.slot] if 0 <= greeting.slot < len(self._slots) else None
                if slot is None or slot.launch != greeting.launch or slot.worker is not None or slot.job_thread is None or self.stopped.is_set():
                    greeting.link.close()  # a launch since retired or relaunched: its task ends
                    continue
                same_clock = greeting.clock is not None and greeting.clock == self._clock
                worker = slot.worker = Worker(greeting.link, greeting.slot, greeting.launch, greeting.pid, time.monotonic(), slot.job_thread, same_clock=same_clock)
                slot.served = True
                count = self.connected()
                self.cond.notify_all()
            log.info("%s ready: %d of %d resident Spark worker(s) connected", worker, count, self.count)

    # ---- retiring launches ----

    def _end_job(self, thread: SlotJob, group: str, clean_end: float, after_cancel: float) -> None:
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

    def _detach_all(self) -> list[tuple[SlotJob, str]]:
        """Closes every worker's connection (caller holds ``cond``); the jobs to end."""
        retired = []
        for slot in self._slots:
            if slot.worker is not None:
                slot.worker.link.close()
            if slot.job_thread is not None:
                retired.append((slot.job_thread, slot.job_group))
            slot.worker, slot.job_thread, slot.launch = None, None, 0
        self.cond.notify_all()
        return retired

    def _end_jobs(self, retired: list[tuple[SlotJob, str]], clean_end: float, after_cancel: float) -> None:
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
            if self.stopped.is_set():
                return
            pause = self._release_if_idle()

    def _release_if_idle(self) -> float | None:
        """Releases the workers if their idle spell is over; how long until the next look
        (None: until the next launch)."""
        assert self._idle_release is not None
        with self.cond:
            if not self.connected():
                # Released, or still connecting after a launch: the launch woke us, and a
                # micro-batch on its workers moves the end of their idle spell on.
                return None if self.released else self._idle_release
            idle = time.monotonic() - self.last_used
            if any(worker.busy for worker in self.workers()):
                return min(1.0, self._idle_release / 4)
            if idle < self._idle_release:
                return self._idle_release - idle
            self.released = True
            retired = self._detach_all()
            if self._growth is not None:
                self._growth.released(time.monotonic())
                self._set_active(self._growth.wanted)
        log.info("no micro-batch for %.0f s: resident workers released, their cores given back to Spark", idle)
        self._end_jobs(retired, clean_end=1.0, after_cancel=5.0)
        return None

    # ---- growing and shrinking (with ``growth``) ----

    def _follow_demand(self) -> None:
        """Adds and retires slots as growth wants, and notes the cores Spark holds for them,
        looking every GROWTH_TICK while it holds any or workers are connecting (after an
        idle release, once its executors are gone, at the next launch)."""
        assert self._growth is not None
        while not self.stopped.is_set():
            with self.cond:
                connected = self.connected()
                wanted = self._growth.tick(time.monotonic(), connected)
                before = self.count
                retired = self._set_active(wanted)
                if self.count > before:
                    log.info("growing to %d resident slot(s): %s", self.count, self._growth.reason)
                elif self.count < before:
                    log.info("shrinking to %d resident slot(s): %s", self.count, self._growth.reason)
            self._end_jobs(retired, clean_end=1.0, after_cancel=5.0)
            try:
                cores = self._session.executor_cores()
            except Exception as exc:  # a dead JVM: the engine replaces the session and these slots
                log.debug("reading the executors' cores failed: %s", first_line(exc))
                cores = None
            if cores != self._cores:
                log.info("Spark holds %s core(s) of executors for %d resident slot(s) (%s)", cores, self.count, self._growth.reason)
                self._cores = cores
            if connected or not self.released or cores:
                self.stopped.wait(GROWTH_TICK)
            else:
                self._wake_growth.wait()  # set by the next launch (or a stop)
                self._wake_growth.clear()

    def _set_active(self, wanted: int) -> list[tuple[SlotJob, str]]:
        """Launches slots up to ``wanted`` active ones, or retires active slots down to it,
        those without a worker first, then the idle workers hosting no Handler script (caller
        holds ``cond``); the retired launches' jobs, to end."""
        active = [slot for slot in self._slots if slot.active]
        for _ in range(wanted - len(active)):
            slot = next((slot for slot in self._slots if not slot.active), None)
            if slot is None:
                slot = _Slot(len(self._slots))
                self._slots.append(slot)
            slot.active = True
            if not self.released:
                self._launch(slot)
        retired = []
        if len(active) > wanted:
            idle = [slot for slot in active if slot.worker is None or not (slot.worker.busy or slot.worker.handlers)]
            idle.sort(key=lambda slot: (slot.worker is not None, -slot.index))
            for slot in idle[: len(active) - wanted]:
                if slot.worker is not None:
                    slot.worker.link.close()
                if slot.job_thread is not None:
                    retired.append((slot.job_thread, slot.job_group))
                slot.active, slot.worker, slot.job_thread, slot.launch = False, None, None, 0
        self.count = sum(1 for slot in self._slots if slot.active)
        self.cond.notify_all()
        return retired


def _job_group(launch: int, owner: object) -> str:
    """The Spark job group of one launch of a slot: cancelled alone."""
    return f"udf-agent-resident-{os.getpid()}-{id(owner)}-{launch}"


def worker_end(error: BaseException) -> str:
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
