"""Plays Kapacitor against an agent process and times what comes back.

``run_flat_out`` writes Init, waits for its answer, then every point frame in
big writes (a KeepaliveRequest every 25 ms in between), and keeps sending
keepalives until every output point has arrived before it closes stdin, as a
running task would. ``run_paced`` writes points as Kapacitor does (two writes a point), singly or in
bursts, at a fixed rate and times each output point by its time. Both sample the agent's memory and
kill its whole process group on the way out, whatever happens.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.framing import OutputTally
from benchmarks.workload import Workload, keepalive_frame, varint_length

KEEPALIVE_INTERVAL = 0.010
MEMORY_INTERVAL = 0.1
WRITE_BYTES = 64 * 1024
READ_BYTES = 4 * 1024 * 1024
EXIT_LIMIT = 60.0
# Keepalive stamps far from any point time, unique per request.
_KEEPALIVE_BASE = 1_000_000


@dataclass(frozen=True)
class AgentCommand:
    label: str
    argv: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    # Other processes whose whole trees are the agent's too (a shared server: its JVM and workers).
    also: Callable[[], list[int]] | None = None


@dataclass
class LatencyStats:
    count: int = 0
    unanswered: int = 0
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    # Every answered request's latency, so repeated runs can pool them: a p99 over one
    # flat-out run's hundred-odd keepalives is little more than its largest value.
    samples_ms: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, seconds: list[float], unanswered: int = 0) -> LatencyStats:
        if not seconds:
            return cls(unanswered=unanswered)
        ordered = sorted(seconds)
        return cls(
            count=len(ordered),
            unanswered=unanswered,
            p50_ms=percentile(ordered, 0.50) * 1000,
            p99_ms=percentile(ordered, 0.99) * 1000,
            max_ms=ordered[-1] * 1000,
            samples_ms=[round(value * 1000, 3) for value in ordered],
        )

    @classmethod
    def pooled(cls, runs: list[LatencyStats]) -> LatencyStats:
        """The figures over every run's samples together."""
        seconds = [value / 1000 for run in runs for value in run.samples_ms]
        return cls.of(seconds, unanswered=sum(run.unanswered for run in runs))


def percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass
class MemoryPeaks:
    """Peak RSS in MB: the agent process, its JVM children, every other descendant (Spark's
    Python workers), the processes ``AgentCommand.also`` names (a shared server), each kind's
    peak apart; and the peak of the whole tree at one sampling (the kinds' peaks need not meet)."""

    agent_mb: float = 0.0
    jvm_mb: float = 0.0
    workers_mb: float = 0.0
    server_mb: float = 0.0
    tree_mb: float = 0.0
    samples: int = 0


@dataclass
class RunResult:
    agent: str
    workload: str
    points_sent: int = 0
    points_out: int = 0
    status: str = "ok"  # ok | slow_exit (figures valid) | error | timeout | incomplete
    error: str | None = None
    init_answer_ms: float | None = None
    first_output_s: float | None = None  # Init written -> first output point
    engine_ready_s: float | None = None  # Init written -> the agent logged its engine ready (warm runs)
    steady_pps: float | None = None  # first output point -> last
    total_pps: float | None = None  # Init written -> last output point
    wall_s: float | None = None
    exit_after_eof_s: float | None = None
    exit_code: int | None = None
    keepalive: LatencyStats = field(default_factory=LatencyStats)
    latency: LatencyStats | None = None
    memory: MemoryPeaks = field(default_factory=MemoryPeaks)
    stderr_tail: list[str] = field(default_factory=list)
    repeats_steady_pps: list[float | None] | None = None  # every run's, when the run was repeated
    repeats_latency_ms: list[tuple[float, float] | None] | None = None  # every paced run's (p50, p99), when repeated
    # A paced run's micro-batches over its measured window, from the agent's metrics (given --metrics-address).
    micro_batches: MicroBatchFigures | None = None
    keepalive_runs: int = 1  # runs whose keepalives ``keepalive`` pools

    @property
    def ok(self) -> bool:
        """Whether the figures can be trusted: every point came back (a slow exit is only noted)."""
        return self.status in ("ok", "slow_exit")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class MicroBatchFigures:
    """What the agent's own metrics say of its micro-batches over a window of a run."""

    per_second: float
    points_each: float
    compute_ms: float  # mean, from taking a micro-batch to queueing its output
    compute_share: float  # micro-batches' times summed, over the window (past 1 when they are chained)


_COUNTED = ("udf_agent_micro_batches_total", "udf_agent_points_received_total", "udf_agent_compute_seconds_sum")


def scrape_counters(url: str) -> tuple[float, dict[str, float]]:
    """When, and the task counters ``_COUNTED`` summed over tasks, from a Prometheus text page."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as page:
        text = page.read().decode()
    at = time.monotonic()
    counters = dict.fromkeys(_COUNTED, 0.0)
    for line in text.splitlines():
        name = line.partition("{")[0].partition(" ")[0]
        if name in counters:
            counters[name] += float(line.rsplit(" ", 1)[1])
    return at, counters


def micro_batch_figures(start: tuple[float, dict[str, float]], end: tuple[float, dict[str, float]]) -> MicroBatchFigures | None:
    seconds = end[0] - start[0]
    batches, points, computing = (end[1][name] - start[1][name] for name in _COUNTED)
    if seconds <= 0 or batches <= 0:
        return None
    return MicroBatchFigures(batches / seconds, points / batches, computing / batches * 1000, computing / seconds)


class _Failure(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


def _rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as children:
                found.extend(int(child) for child in children.read().split())
    except OSError:
        pass
    return found


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    pending = _children(pid)
    while pending:
        child = pending.pop()
        found.append(child)
        pending.extend(_children(child))
    return found


def java_descendants(pid: int) -> list[int]:
    """Spark's JVMs among ``pid``'s descendants (not a passing ``java -version``)."""
    return [child for child in descendants(pid) if process_name(child) == "java" and _runs_spark(child)]


def _runs_spark(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"org.apache.spark" in cmdline.read()
    except OSError:
        return False


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, including any reparented to init."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def process_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return ""


class AgentProcess:
    """One agent subprocess in its own process group, with its output tallied on a reader thread."""

    def __init__(self, command: AgentCommand, deadline: float, track_points: bool = False):
        self.command = command
        self.deadline = deadline
        self.timed_out = False
        self.tally = OutputTally(track_points=track_points)
        self.progress = threading.Condition()
        self.eof = threading.Event()
        self.stderr_tail: deque[str] = deque(maxlen=40)
        self.stderr_lines = threading.Condition()
        self._stderr_seen: list[str] = []
        self.memory = MemoryPeaks()
        self._stop_sampling = threading.Event()
        self.process = subprocess.Popen(
            command.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=command.cwd,
            env={**os.environ, **(command.env or {})},
            bufsize=0,
            start_new_session=True,  # one process group: the JVM and workers die with it
        )
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self._stdin, self._stdout, self._stderr = self.process.stdin, self.process.stdout, self.process.stderr
        self.stdin_fd = self._stdin.fileno()
        self._threads = [
            threading.Thread(target=self._read_output, name="bench-reader", daemon=True),
            threading.Thread(target=self._drain_stderr, name="bench-stderr", daemon=True),
            threading.Thread(target=self._sample_memory, name="bench-memory", daemon=True),
            threading.Thread(target=self._watchdog, name="bench-watchdog", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _watchdog(self) -> None:
        """Kills the agent at the deadline, which also unblocks a write the agent stopped reading."""
        if not self._stop_sampling.wait(max(0.0, self.deadline - time.monotonic())):
            self.timed_out = True
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def _read_output(self) -> None:
        fd = self._stdout.fileno()
        try:
            while True:
                chunk = os.read(fd, READ_BYTES)
                if not chunk:
                    break
                now = time.monotonic()
                with self.progress:
                    self.tally.feed(chunk, now)
                    self.progress.notify_all()
        except Exception as exc:  # a driver bug must not look like a hang
            self.tally.errors.append(f"benchmark reader failed: {exc!r}")
        finally:
            self.eof.set()
            with self.progress:
                self.progress.notify_all()

    def _drain_stderr(self) -> None:
        for line in self._stderr:
            text = line.decode(errors="replace").rstrip()[:500]
            self.stderr_tail.append(text)
            with self.stderr_lines:
                self._stderr_seen.append(text)
                self.stderr_lines.notify_all()

    def wait_for_log(self, text: str, deadline: float) -> bool:
        """Waits until the agent logs a line containing ``text`` (False: it ended or the deadline passed)."""
        checked = 0
        with self.stderr_lines:
            while True:
                if any(text in line for line in self._stderr_seen[checked:]):
                    return True
                checked = len(self._stderr_seen)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self.process.poll() is not None:
                    return False
                self.stderr_lines.wait(min(remaining, 0.1))

    def _sample_memory(self) -> None:
        pid = self.process.pid
        also = self.command.also or (lambda: [])
        while not self._stop_sampling.is_set():
            agent = _rss_mb(pid)
            others = also()
            server = sum(_rss_mb(root) for root in others)
            jvm = workers = 0.0
            for root in (pid, *others):
                for child in descendants(root):
                    if process_name(child) == "java":
                        jvm += _rss_mb(child)
                    else:
                        workers += _rss_mb(child)
            peaks = self.memory
            peaks.agent_mb = max(peaks.agent_mb, agent)
            peaks.jvm_mb = max(peaks.jvm_mb, jvm)
            peaks.workers_mb = max(peaks.workers_mb, workers)
            peaks.server_mb = max(peaks.server_mb, server)
            peaks.tree_mb = max(peaks.tree_mb, agent + server + jvm + workers)
            peaks.samples += 1
            self._stop_sampling.wait(MEMORY_INTERVAL)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self.stdin_fd, view)
            view = view[written:]

    def wait_for(self, predicate: Any, deadline: float) -> bool:
        """Waits until ``predicate()`` holds (True) or the output ended or the deadline passed (False)."""
        with self.progress:
            while not predicate():
                if self.eof.is_set() or self.tally.errors:
                    return bool(predicate())
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self.progress.wait(min(remaining, 0.05))
            return True

    def close_stdin(self) -> None:
        try:
            self._stdin.close()
        except OSError:
            pass

    def kill(self) -> None:
        """Kills the process group and any descendant that left it."""
        stragglers = descendants(self.process.pid)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        for pid in stragglers:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        # The next run must not share the machine with this one's JVM.
        give_up = time.monotonic() + 10
        while _group_members(self.process.pid) and time.monotonic() < give_up:
            time.sleep(0.05)
        self._stop_sampling.set()
        self.close_stdin()

    def init(self, frame: bytes, deadline: float) -> tuple[float, float]:
        """Writes Init, waits for InitResponse; returns when Init was written and how long the answer took."""
        from udf_agent import udf_pb2

        sent = time.monotonic()
        self.write(frame)
        if not self.wait_for(lambda: self.tally.init_at is not None, deadline):
            raise self.failure("no InitResponse")
        response = udf_pb2.Response.FromString(self.tally.init_body or b"").init
        if not response.success:
            raise _Failure("error", f"Init refused: {response.error}")
        return sent, (self.tally.init_at or sent) - sent

    def failure(self, what: str) -> _Failure:
        if self.timed_out:
            return _Failure("timeout", f"{what} within the time limit (agent killed)")
        if self.tally.errors:
            return _Failure("error", f"{what}: {self.tally.errors[0]}")
        if self.eof.is_set():
            code = self.process.poll()
            last = self.stderr_tail[-1] if self.stderr_tail else ""
            return _Failure("error", f"{what}: agent closed its output (exit {code}) {last}".strip())
        return _Failure("timeout", f"{what} within the time limit")


def _finish(agent: AgentProcess, result: RunResult, expected: int, started: float) -> None:
    """Closes stdin, times the exit, and fills the figures every run reports."""
    tally = agent.tally
    eof_sent = time.monotonic()
    agent.close_stdin()
    try:
        result.exit_code = agent.process.wait(EXIT_LIMIT)
        result.exit_after_eof_s = time.monotonic() - eof_sent
    except subprocess.TimeoutExpired:
        result.status, result.error = "slow_exit", f"all output in, but no exit within {EXIT_LIMIT:.0f} s of EOF"
    agent.eof.wait(5)
    result.points_out = tally.points
    result.wall_s = time.monotonic() - started
    if tally.errors:
        result.status, result.error = "error", tally.errors[0]
    elif tally.leftover:
        result.status, result.error = "error", f"output ends inside a frame ({tally.leftover} bytes left)"
    elif tally.points != expected:
        result.status = "incomplete"
        result.error = f"{tally.points:,} output points for {expected:,} input points"
    elif agent.timed_out:
        result.status, result.error = "timeout", "killed at the time limit"
    elif result.exit_code not in (0, None):
        result.status, result.error = "error", f"exit code {result.exit_code}"


def _throughput(result: RunResult, tally: OutputTally, init_sent: float) -> None:
    if tally.first_point_at is None or tally.last_point_at is None:
        return
    result.first_output_s = tally.first_point_at - init_sent
    after_first = tally.points - tally.points_in_first_chunk
    span = tally.last_point_at - tally.first_point_at
    if after_first > 0 and span > 0:
        result.steady_pps = after_first / span
    result.total_pps = tally.points / (tally.last_point_at - init_sent)


def _keepalive_stats(sent: dict[int, float], tally: OutputTally) -> LatencyStats:
    answered = [tally.keepalive_times[stamp] - at for stamp, at in sent.items() if stamp in tally.keepalive_times]
    return LatencyStats.of(answered, unanswered=len(sent) - len(answered))


def _record_failure(agent: AgentProcess, result: RunResult, failure: BaseException) -> None:
    """What ended a run early, in its result."""
    if not isinstance(failure, _Failure):
        # The agent is gone: say why, once its output (an ErrorResponse, its exit) has been read.
        agent.eof.wait(2)
        failure = agent.failure("agent stopped reading")
    result.status, result.error = failure.status, str(failure)
    result.points_out = agent.tally.points


def run_flat_out(command: AgentCommand, init: bytes, workload: Workload, time_limit: float, warm_log: str | None = None) -> RunResult:
    """Feeds the whole workload as fast as the agent takes it; see the module docstring.

    With ``warm_log``, the first point is sent only once the agent has logged a line
    containing it (its compute engine is up): the figures are then those of a warm
    engine, and ``engine_ready_s`` says how long it took from Init.
    """
    result = RunResult(agent=command.label, workload=workload.label)
    path = workload.path()  # generated (or found in the cache) before the clock starts
    frames_per_write = max(1, WRITE_BYTES // workload.frame_length)
    started = time.monotonic()
    deadline = started + time_limit
    agent = AgentProcess(command, deadline)
    keepalives_sent: dict[int, float] = {}
    init_sent: float | None = None
    try:
        init_sent, init_answer = agent.init(init, deadline)
        result.init_answer_ms = init_answer * 1000
        if warm_log is not None:
            if not agent.wait_for_log(warm_log, deadline):
                raise agent.failure(f"no log line {warm_log!r}")
            result.engine_ready_s = time.monotonic() - init_sent
        next_keepalive = time.monotonic() + KEEPALIVE_INTERVAL

        def keepalive_if_due() -> None:
            nonlocal next_keepalive
            now = time.monotonic()
            if now >= next_keepalive:
                stamp = _KEEPALIVE_BASE + len(keepalives_sent)
                keepalives_sent[stamp] = now
                agent.write(keepalive_frame(stamp))
                next_keepalive = now + KEEPALIVE_INTERVAL

        write_size = frames_per_write * workload.frame_length
        with open(path, "rb", buffering=0) as source:
            while True:
                chunk = source.read(READ_BYTES - READ_BYTES % workload.frame_length)
                if not chunk:
                    break
                view = memoryview(chunk)
                for offset in range(0, len(chunk), write_size):
                    piece = view[offset : offset + write_size]
                    agent.write(piece)
                    result.points_sent += len(piece) // workload.frame_length
                    keepalive_if_due()
                if time.monotonic() > deadline:
                    raise _Failure("timeout", f"only {result.points_sent:,} points written within the time limit")
        # A running task keeps its UDF open: wait for every output point, still sending keepalives.
        while not agent.wait_for(lambda: agent.tally.points >= workload.points, min(deadline, next_keepalive)):
            if agent.eof.is_set() or agent.tally.errors or time.monotonic() >= deadline:
                raise agent.failure(f"{agent.tally.points:,} of {workload.points:,} output points")
            keepalive_if_due()
        _finish(agent, result, workload.points, started)
    except (_Failure, BrokenPipeError, ConnectionResetError) as failure:
        _record_failure(agent, result, failure)
    finally:
        agent.kill()
        if init_sent is not None:
            _throughput(result, agent.tally, init_sent)  # partial figures of a failed run go to JSON too
        result.keepalive = _keepalive_stats(keepalives_sent, agent.tally)
        result.memory = agent.memory
        result.stderr_tail = list(agent.stderr_tail)[-10:]
    return result


def run_paced(
    command: AgentCommand,
    init: bytes,
    workload: Workload,
    rate: float,
    seconds: float,
    warmup_seconds: float,
    time_limit: float,
    warm_log: str | None = None,
    metrics_url: str | None = None,
    burst: int = 1,
) -> RunResult:
    """Points at ``rate`` points/s in bursts of ``burst`` (every ``burst / rate`` s), each point
    written as Kapacitor writes it: its length varint, then its body, two writes back to back.
    Latency from the write that completes a point to its output point (matched by time).

    With ``warm_log``, the paced points start only once the agent has logged a line containing it.
    With ``metrics_url`` (the agent's ``/metrics``), its micro-batches over the measured points
    (``RunResult.micro_batches``), scraped as the first is written and once the last is out.
    """
    warmup_points = 1 + int(rate * warmup_seconds)
    measured_points = int(rate * seconds)
    if workload.points < warmup_points + measured_points:
        raise ValueError(f"{workload.label} is too small for {warmup_points + measured_points} points")
    result = RunResult(agent=command.label, workload=f"{measured_points:,} points at {rate:,.0f} points/s")
    with open(workload.path(), "rb") as source:
        data = source.read()
    length = workload.frame_length
    started = time.monotonic()
    deadline = started + time_limit
    agent = AgentProcess(command, deadline, track_points=True)
    sent_at: dict[int, float] = {}
    keepalives_sent: dict[int, float] = {}
    window_start: list[tuple[float, dict[str, float]]] = []
    try:
        init_sent, init_answer = agent.init(init, deadline)
        result.init_answer_ms = init_answer * 1000
        # Warm-up: one point, answered (Spark started), then a paced second not measured.
        agent.write(data[:length])
        if not agent.wait_for(lambda: agent.tally.points >= 1, deadline):
            raise agent.failure("no output for the first point")
        result.first_output_s = (agent.tally.first_point_at or init_sent) - init_sent
        if warm_log is not None:
            if not agent.wait_for_log(warm_log, deadline):
                raise agent.failure(f"no log line {warm_log!r}")
            result.engine_ready_s = time.monotonic() - init_sent
        total = warmup_points + measured_points
        head = varint_length(data[:length])
        begin = time.monotonic()
        next_keepalive = begin + KEEPALIVE_INTERVAL
        for index in range(1, total):
            # A burst's points go back to back; each burst starts on the clock.
            due = begin + ((index - 1) // burst) * burst / rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            if index == warmup_points and metrics_url is not None:  # off the pacing thread
                threading.Thread(target=lambda: window_start.append(scrape_counters(metrics_url)), daemon=True).start()
            start = index * length
            agent.write(data[start : start + head])
            # Timed before the write that completes the frame: the reader thread may see
            # the answer before this thread runs again, so a clock read after it could
            # come later than the answer (a negative latency).
            now = time.monotonic()
            if index >= warmup_points:
                sent_at[workload.time_of(index)] = now
            agent.write(data[start + head : start + length])
            if now >= next_keepalive:
                stamp = _KEEPALIVE_BASE + len(keepalives_sent)
                keepalives_sent[stamp] = time.monotonic()
                agent.write(keepalive_frame(stamp))
                next_keepalive = now + KEEPALIVE_INTERVAL
            if now > deadline:
                raise _Failure("timeout", "paced writes overran the time limit")
        result.points_sent = total
        settle = min(deadline, time.monotonic() + 30)
        agent.wait_for(lambda: agent.tally.points >= total, settle)
        if metrics_url is not None and window_start:
            result.micro_batches = micro_batch_figures(window_start[0], scrape_counters(metrics_url))
        _finish(agent, result, total, started)
    except (_Failure, BrokenPipeError, ConnectionResetError) as failure:
        _record_failure(agent, result, failure)
    finally:
        agent.kill()
        seen = agent.tally.point_times
        answered = [seen[stamp] - at for stamp, at in sent_at.items() if stamp in seen]
        result.latency = LatencyStats.of(answered, unanswered=len(sent_at) - len(answered))
        result.keepalive = _keepalive_stats(keepalives_sent, agent.tally)
        result.memory = agent.memory
        result.stderr_tail = list(agent.stderr_tail)[-10:]
    return result
