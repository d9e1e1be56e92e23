#!/usr/bin/env python3
"""udf-agent's benchmark suite: every case side by side with a per-point baseline agent.

    .venv/bin/python benchmarks/run.py [--quick] [--cases echo,moving_avg,...] [--json PATH]

Prints the machine, then one table row per figure (ours, baseline, ratio
ours/baseline, goal, met), and writes everything to JSON (default
benchmarks/results/latest.json). See benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any, TextIO

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.driver import AgentCommand, LatencyStats, MemoryPeaks, RunResult, run_flat_out, run_paced  # noqa: E402
from benchmarks.limits import framing_pps, parse_pps  # noqa: E402
from benchmarks.shared_deployment import shared_directory, shared_env, warm_shared_server  # noqa: E402
from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, init_frame  # noqa: E402
from udf_agent.serve.shared import shared_server_pids  # noqa: E402

DEFAULT_JSON = os.path.join(REPO, "benchmarks", "results", "latest.json")
# The latency case's goals by UDF and burst size: (p50, p99) in ms.
LATENCY_GOALS: dict[str, dict[int, tuple[float | None, float | None]]] = {
    "moving_avg": {1: (2.0, 5.0), 10: (2.0, 5.0), 100: (3.0, 6.0), 1_000: (5.0, 20.0), 10_000: (None, 100.0)},
    "mirror": {1: (0.5, None)},
}
# Bursts of a pattern measured at the least, however long that takes (10,000 points at 1 k/s: 30 s).
LATENCY_BURSTS_MEASURED = 3
CASES = ("limits", "echo", "moving_avg", "many_groups", "new_groups", "latency", "memory", "group_state")


@dataclass(frozen=True)
class Settings:
    points: int = 1_000_000
    groups: int = 100
    many_groups: int = 10_000
    points_per_group: int = 30
    new_group_points: int = 200_000
    latency_rate: float = 1_000.0
    latency_seconds: float = 10.0
    latency_warmup_seconds: float = 1.0
    # Points a write of Kapacitor's forwards back to back: 1 is an even trickle.
    latency_bursts: tuple[int, ...] = (1, 10, 100, 1_000, 10_000)
    memory_points: tuple[int, ...] = (1_000_000,)
    state_groups: int = 500_000
    # Flat-out runs of each agent and workload; the one with the median steady rate is reported.
    repeat: int = 1
    time_limit_scale: float = 1.0
    agent_args: tuple[str, ...] = ()
    kapacitor_src: str | None = None
    official_python: str = sys.executable

    @classmethod
    def quick(cls) -> Settings:
        return cls(
            points=20_000,
            many_groups=1_000,
            points_per_group=10,
            new_group_points=20_000,
            latency_seconds=3.0,
            latency_bursts=(1, 100),
            memory_points=(20_000,),
            state_groups=5_000,
        )

    def time_limit(self, points: int) -> float:
        """Seconds a run may take: Spark's start-up plus a slow 10 k points/s."""
        return (90 + points / 10_000) * self.time_limit_scale


@dataclass(frozen=True)
class Goal:
    text: str
    check: Callable[[Row], bool | None]


def ratio_at_least(minimum: float) -> Goal:
    return Goal(f">= {minimum:g}x baseline", lambda row: None if row.ratio is None else row.ratio >= minimum)


def ratio_at_most(maximum: float, other: str) -> Goal:
    return Goal(f"<= {maximum:g}x {other}", lambda row: None if row.ratio is None else row.ratio <= maximum)


def value_at_most(maximum: float, unit: str) -> Goal:
    return Goal(f"<= {maximum:g} {unit}", lambda row: None if row.value is None else row.value <= maximum)


@dataclass
class Row:
    case: str
    figure: str
    value: float | None
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    goal: str = ""
    met: bool | None = None
    note: str = ""


def make_row(
    case: str, figure: str, value: float | None, unit: str, baseline: float | None = None, goal: Goal | None = None, note: str = ""
) -> Row:
    ratio = value / baseline if value is not None and baseline else None
    row = Row(case, figure, value, unit, baseline, ratio, goal.text if goal else "", None, note)
    if goal is not None:
        row.met = goal.check(row)
    return row


# What the agent logs once its Spark engine takes micro-batches (spark_backend.engine).
ENGINE_READY_LOG = "compute engine ready"
# Where a row's micro-batches ran, as its label says.
COMPUTED_ON_SPARK = "on Spark's resident workers"
COMPUTED_WHILE_STARTING = "in the agent while Spark starts, then on Spark"
PASSTHROUGH = "passthrough: nothing computed"


def ours(udf: str, settings: Settings) -> AgentCommand:
    """A task with its own Spark (--own-spark): its whole process tree is the agent's, so what
    it costs is measured alone. benchmarks/deployment.py measures tasks on the shared Spark."""
    return AgentCommand(f"udf-agent {udf}", [sys.executable, "-m", "udf_agent", "run", udf, "--own-spark", *settings.agent_args], cwd=REPO)


def shared(udf: str, directory: str) -> AgentCommand:
    """A task as Kapacitor starts it by default: a relay to the shared per-host server (in DIRECTORY)."""
    return AgentCommand(f"udf-agent {udf} (shared)", [sys.executable, "-m", "udf_agent", "run", udf], cwd=REPO, env=shared_env(directory))


def baseline(handler: str) -> AgentCommand:
    return AgentCommand(f"baseline {handler}", [sys.executable, os.path.join(REPO, "benchmarks", "baseline_agent.py"), handler], cwd=REPO)


def official_moving_avg(src: str, unbuffered: bool, python: str = sys.executable) -> tuple[AgentCommand | None, str]:
    """Kapacitor's own Python moving_avg example from a checkout, run by ``python``, or None and
    why it cannot run."""
    library = os.path.join(src, "udf", "agent", "py")
    script = os.path.join(src, "udf", "agent", "examples", "moving_avg", "moving_avg.py")
    if not os.path.isfile(script):
        return None, f"no {script}"
    env = {"PYTHONPATH": library}
    check = subprocess.run(
        [python, "-c", "import kapacitor.udf.agent, kapacitor.udf.udf_pb2"],
        env={**os.environ, **env},
        # Not the repository: `python -c` puts the working directory first on sys.path, and the
        # repository's own kapacitor package (udf-agent's) would be imported instead.
        cwd=library,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if check.returncode != 0:
        last = (check.stderr.strip().splitlines() or ["import failed"])[-1]
        return None, f"its agent does not import here: {last[:200]}"
    flags = ["-u"] if unbuffered else []
    label = "official moving_avg" + (" -u" if unbuffered else "")
    return AgentCommand(label, [python, *flags, script], cwd=src, env=env), ""


def arrival_label(burst: int, rate: float) -> str:
    """How a latency pattern's points arrive, in words."""
    if burst == 1:
        return f"a point every {1000 / rate:g} ms"
    return f"{burst:,} points every {burst / rate * 1000:g} ms" if burst < rate else f"{burst:,} points every {burst / rate:g} s"


def _describe_failure(who: str, result: RunResult) -> str:
    if result.status == "ok":
        return ""
    partial = f" (until then {_number(result.steady_pps)} points/s steady)" if not result.ok and result.steady_pps else ""
    return f"{who} {result.status}{partial}: {result.error}"


def _figure(result: RunResult | None, name: str) -> float | None:
    """A figure of a run that succeeded; a failed run's partial figures are never compared."""
    return getattr(result, name) if result is not None and result.ok else None


class Bench:
    """Runs cases, remembering every agent run so that later cases can reuse it (memory reuses throughput runs)."""

    def __init__(self, settings: Settings, progress: TextIO):
        self.settings = settings
        self.progress = progress
        self.runs: dict[tuple[str, Workload], RunResult] = {}
        self.rows: list[Row] = []
        self.cases: dict[str, dict[str, Any]] = {}

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=self.progress, flush=True)

    def flat_out(
        self, command: AgentCommand, options: list[tuple[str, object]], workload: Workload, reuse: bool = True, warm: bool = False
    ) -> RunResult:
        """A flat-out run; ``warm``: the first point waits until the agent's Spark engine is up."""
        key = (command.label + (" warm" if warm else ""), workload)
        if reuse and key in self.runs:
            return self.runs[key]
        workload.path()
        time_limit = self.settings.time_limit(workload.points)
        results = []
        for attempt in range(self.settings.repeat):
            self.say(
                f"{command.label}: {workload.label}, flat out" + (", once Spark is up" if warm else "")
                + (f" (run {attempt + 1} of {self.settings.repeat})" if self.settings.repeat > 1 else "")
            )
            result = run_flat_out(command, init_frame(options), workload, time_limit, ENGINE_READY_LOG if warm else None)
            self.say(
                f"  -> {result.status}, {result.points_out:,} points out, steady {_number(result.steady_pps)} points/s"
                + (f" ({result.error})" if result.error else "")
            )
            results.append(result)
        result = _median_run(results)
        self.runs[key] = result
        return result

    def run_case(self, name: str) -> None:
        case = getattr(self, f"case_{name}")
        record: dict[str, Any] = {"status": "ok", "error": None, "runs": {}, "started": _now()}
        self.cases[name] = record
        started = time.monotonic()
        try:
            case(record)
        except KeyboardInterrupt:
            record["status"] = "interrupted"
            raise
        except Exception as exc:  # one broken case must not stop the others
            record["status"], record["error"] = "failed", f"{type(exc).__name__}: {exc}"
            record["traceback"] = traceback.format_exc()
            self.rows.append(make_row(name, "case failed", None, "", note=record["error"]))
            self.say(f"{name} failed: {record['error']}")
        record["seconds"] = round(time.monotonic() - started, 1)

    def _keep(self, record: dict[str, Any], role: str, result: RunResult) -> None:
        record["runs"][role] = result.to_json()
        if result.status != "ok":
            record["status"] = "degraded"

    # ---- cases ----

    def case_limits(self, record: dict[str, Any]) -> None:
        workload = Workload(self.settings.points, self.settings.groups)
        workload.path()
        self.say(f"limits: {workload.label}")
        framing, parse = framing_pps(workload), parse_pps(workload)
        record["figures"] = {"framing_pps": framing, "parse_pps": parse, "workload": workload.label}
        self.rows.append(make_row("limits", "framing only (varint loop)", framing, "points/s", note="in-process, one core"))
        self.rows.append(
            make_row("limits", "framing + parse + re-serialise", parse, "points/s", note="ceiling of a per-point protobuf path")
        )

    def _throughput_rows(
        self, case: str, mine: RunResult, theirs: RunResult | None, steady: Goal | None, total: Goal | None, warm: RunResult | None = None
    ) -> None:
        """Steady and start-up throughput and Init -> first output, ours against the baseline.

        With ``warm`` (a run that waited for Spark), the steady figure is that run's:
        the micro-batches were computed on Spark, not in the agent while Spark started.
        """
        runs = [("ours", mine), ("ours, Spark warm", warm), ("baseline", theirs)]
        note = "; ".join(filter(None, [_describe_failure(who, run) for who, run in runs if run is not None]))
        # Where the micro-batches ran, in every label: a passthrough computes none; a cold
        # start computes in the agent until Spark is up (--local-while-starting), then on Spark.
        steady_where, start_where = (COMPUTED_ON_SPARK, COMPUTED_WHILE_STARTING) if warm else (PASSTHROUGH, PASSTHROUGH)
        rows = [
            (f"points/s steady{', Spark warm' if warm else ''} ({steady_where})", warm or mine, "steady_pps", "points/s", steady),
            (f"points/s incl. start-up ({start_where})", mine, "total_pps", "points/s", total),
            ("Init -> first output", mine, "first_output_s", "s", None),
        ]
        for figure, run, name, unit, goal in rows:
            self.rows.append(make_row(case, figure, _figure(run, name), unit, _figure(theirs, name), goal, note))
            note = ""
        if warm is not None:
            self.rows.append(make_row(case, "Init -> Spark ready", _figure(warm, "engine_ready_s"), "s", None, note="resident workers connected"))

    def _keepalive_rows(self, case: str, mine: RunResult, theirs: RunResult | None) -> None:
        k = mine.keepalive
        b = theirs.keepalive if theirs is not None and theirs.ok else None
        note = f"{k.count} answered, {k.unanswered} unanswered" + (f", {mine.keepalive_runs} runs pooled" if mine.keepalive_runs > 1 else "")
        self.rows.append(make_row(case, "keepalive p50 (flat out)", k.p50_ms, "ms", b.p50_ms if b else None, note=note))
        self.rows.append(make_row(case, "keepalive p99 (flat out)", k.p99_ms, "ms", b.p99_ms if b else None, value_at_most(20, "ms")))
        row = make_row(case, "keepalive max (flat out)", k.max_ms, "ms", b.max_ms if b else None, value_at_most(100, "ms"))
        if k.unanswered:
            row.met = False
            row.note = f"{k.unanswered} keepalive(s) never answered"
        self.rows.append(row)

    def case_echo(self, record: dict[str, Any]) -> None:
        workload = Workload(self.settings.points, self.settings.groups)
        mine = self.flat_out(ours("mirror", self.settings), [], workload)
        theirs = self.flat_out(baseline("echo"), [], workload)
        self._keep(record, "ours", mine)
        self._keep(record, "baseline", theirs)
        self._throughput_rows("echo", mine, theirs, ratio_at_least(5), ratio_at_least(5))
        self._keepalive_rows("echo", mine, theirs)

    def case_moving_avg(self, record: dict[str, Any]) -> None:
        workload = Workload(self.settings.points, self.settings.groups)
        mine = self.flat_out(ours("moving_avg", self.settings), MOVING_AVG_OPTIONS, workload)
        warm = self.flat_out(ours("moving_avg", self.settings), MOVING_AVG_OPTIONS, workload, warm=True)
        theirs = self.flat_out(baseline("moving_avg"), MOVING_AVG_OPTIONS, workload)
        self._keep(record, "ours", mine)
        self._keep(record, "ours, Spark warm", warm)
        self._keep(record, "baseline", theirs)
        self._throughput_rows("moving_avg", mine, theirs, ratio_at_least(3), ratio_at_least(1.5), warm)
        self._keepalive_rows("moving_avg", warm, theirs)
        # The same flat out on the default deployment: the task's relay to a warm shared server.
        with shared_directory("bench-shared-") as shared_dir:
            self.say("udf-agent moving_avg (shared): warming the shared server")
            warm_shared_server("moving_avg", shared_dir, init_frame(MOVING_AVG_OPTIONS))
            default = self.flat_out(shared("moving_avg", shared_dir), MOVING_AVG_OPTIONS, workload)
        self._keep(record, "ours, default deployment", default)
        case = "moving_avg, default: relay + shared server"
        figure = f"points/s steady, Spark warm ({COMPUTED_ON_SPARK})"
        self.rows.append(make_row(case, figure, _figure(default, "steady_pps"), "points/s", _figure(theirs, "steady_pps"), ratio_at_least(3), _describe_failure("ours", default)))
        self._keepalive_rows(case, default, theirs)
        if self.settings.kapacitor_src:
            for unbuffered in (True, False):
                command, why = official_moving_avg(self.settings.kapacitor_src, unbuffered, self.settings.official_python)
                label = "vs official" + (" (-u, as kapacitor.conf)" if unbuffered else " (buffered)")
                if command is None:
                    self.rows.append(make_row("moving_avg", f"points/s steady {label}", None, "points/s", note=f"skipped: {why}"))
                    record["official"] = {"skipped": why}
                    break
                official = self.flat_out(command, MOVING_AVG_OPTIONS, workload)
                self._keep(record, command.label, official)
                note = _describe_failure(command.label, official)
                for figure, name in ((f"points/s steady ({COMPUTED_WHILE_STARTING})", "steady_pps"), (f"points/s incl. start-up ({COMPUTED_WHILE_STARTING})", "total_pps")):
                    self.rows.append(
                        make_row("moving_avg", f"{figure} {label}", _figure(mine, name), "points/s", _figure(official, name), note=note)
                    )
                    note = ""

    def case_many_groups(self, record: dict[str, Any]) -> None:
        s = self.settings
        workload = Workload(s.many_groups * s.points_per_group, s.many_groups)
        mine = self.flat_out(ours("moving_avg", s), MOVING_AVG_OPTIONS, workload)
        warm = self.flat_out(ours("moving_avg", s), MOVING_AVG_OPTIONS, workload, warm=True)
        theirs = self.flat_out(baseline("moving_avg"), MOVING_AVG_OPTIONS, workload)
        self._keep(record, "ours", mine)
        self._keep(record, "ours, Spark warm", warm)
        self._keep(record, "baseline", theirs)
        self._throughput_rows("many_groups", mine, theirs, ratio_at_least(1), None, warm)

    def case_new_groups(self, record: dict[str, Any]) -> None:
        workload = Workload(self.settings.new_group_points, self.settings.new_group_points)
        workload.path()
        self.say(f"limits: {workload.label}")
        limit = parse_pps(workload)
        record["figures"] = {"parse_pps": limit}
        mine = self.flat_out(ours("mirror", self.settings), [], workload)
        theirs = self.flat_out(baseline("echo"), [], workload)
        self._keep(record, "ours", mine)
        self._keep(record, "baseline echo", theirs)
        steady = _figure(mine, "steady_pps")
        self.rows.append(
            make_row(
                "new_groups",
                "points/s steady vs parse limit",
                steady,
                "points/s",
                limit,
                ratio_at_least(0.5),
                _describe_failure("ours", mine),
            )
        )
        self.rows.append(
            make_row(
                "new_groups",
                "points/s steady vs baseline echo",
                steady,
                "points/s",
                _figure(theirs, "steady_pps"),
                note=_describe_failure("baseline", theirs),
            )
        )
        self.rows.append(
            make_row("new_groups", "points/s incl. start-up", _figure(mine, "total_pps"), "points/s", _figure(theirs, "total_pps"))
        )

    def case_latency(self, record: dict[str, Any]) -> None:
        """What a point waits, by how points arrive: single points or bursts (Kapacitor forwards
        a writer's flush back to back), at the same rate; each pattern on a task's own Spark and
        on the default deployment, beside the per-point baseline agent and, with
        ``--kapacitor-src``, Kapacitor's official moving_avg.py."""
        s = self.settings
        official, why_not = official_moving_avg(s.kapacitor_src, unbuffered=True, python=s.official_python) if s.kapacitor_src else (None, "no --kapacitor-src")
        with shared_directory("bench-shared-") as shared_dir:
            for burst in s.latency_bursts:
                seconds = max(s.latency_seconds, LATENCY_BURSTS_MEASURED * burst / s.latency_rate)
                measured = int(s.latency_rate * seconds)
                workload = Workload(1 + int(s.latency_rate * s.latency_warmup_seconds) + measured, s.groups)
                workload.path()
                arrival = arrival_label(burst, s.latency_rate)
                for udf, handler, options in (("moving_avg", "moving_avg", MOVING_AVG_OPTIONS), ("mirror", "echo", [])):
                    init = init_frame(options)
                    p50_goal, p99_goal = LATENCY_GOALS[udf].get(burst, (None, None))
                    baseline_result = self._paced(baseline(handler), init, workload, None, record, f"baseline {udf} {arrival}", seconds, burst)
                    official_result = None
                    if udf == "moving_avg" and official is not None:
                        official_result = self._paced(official, init, workload, None, record, f"official {udf} {arrival}", seconds, burst)
                    if udf == "mirror":
                        # It never starts Spark: by default too it runs in the task's own process.
                        deployments = ((f"its own process (default), {PASSTHROUGH}", ours(udf, s)),)
                    else:
                        deployments = ((f"own Spark, {COMPUTED_ON_SPARK}", ours(udf, s)), (f"default: relay + shared server, {COMPUTED_ON_SPARK}", shared(udf, shared_dir)))
                    for deployment, command in deployments:
                        metrics_url = None
                        if command.env is not None:
                            self.say(f"{command.label}: warming the shared server")
                            warm_shared_server(udf, shared_dir, init)
                        elif udf != "mirror":  # its own Spark: its micro-batches, from its metrics
                            command, metrics_url = _with_metrics(command)
                        # Spark warm: mirror never starts Spark; moving_avg's points wait until it is up.
                        warm_log = ENGINE_READY_LOG if command.env is None and udf != "mirror" else None
                        result = self._paced(command, init, workload, warm_log, record, f"ours {udf} {deployment} {arrival}", seconds, burst, metrics_url)
                        label = f"{udf}, {arrival}, {deployment}"
                        self._latency_rows(label, result, baseline_result, measured, p50_goal, p99_goal)
                        if udf == "moving_avg":
                            self._official_rows(label, result, official_result, why_not)
                if burst == 1:
                    # The same path with a UDF that does nothing: what the path costs alone.
                    floor, metrics_url = _with_metrics(ours("benchmarks.path_floor:zeros", s))
                    init = init_frame(MOVING_AVG_OPTIONS)
                    result = self._paced(floor, init, workload, ENGINE_READY_LOG, record, "ours zeros own Spark", seconds, burst, metrics_url)
                    self._latency_rows(f"a UDF that returns zeros (the path alone), {arrival}, own Spark, {COMPUTED_ON_SPARK}", result, baseline_result, measured, None, None)

    def _paced(
        self, command: AgentCommand, init: bytes, workload: Workload, warm_log: str | None, record: dict[str, Any], key: str, seconds: float, burst: int, metrics_url: str | None = None
    ) -> RunResult:
        """``--repeat`` paced runs; the one with the median p50 is reported, and every run's
        p50 and p99 are in its row's note."""
        s = self.settings
        results = []
        for attempt in range(s.repeat):
            self.say(
                f"{command.label}: {int(s.latency_rate * seconds):,} points at {s.latency_rate:,.0f} points/s, {arrival_label(burst, s.latency_rate)}"
                + (f" (run {attempt + 1} of {s.repeat})" if s.repeat > 1 else "")
            )
            result = run_paced(command, init, workload, s.latency_rate, seconds, s.latency_warmup_seconds, s.time_limit(workload.points), warm_log, metrics_url, burst)
            p50, p99 = (result.latency.p50_ms, result.latency.p99_ms) if result.latency else (None, None)
            self.say(f"  -> {result.status}, p50 {_number(p50)} ms, p99 {_number(p99)} ms" + (f" ({result.error})" if result.error else ""))
            self._keep(record, key if s.repeat == 1 else f"{key} (run {attempt + 1})", result)
            results.append(result)
        return _median_latency_run(results)

    def _official_rows(self, label: str, mine_run: RunResult, official_run: RunResult | None, why_not: str) -> None:
        """Ours against Kapacitor's official moving_avg.py on the same arrivals: never slower at the tail."""
        mine, theirs = mine_run.latency, official_run.latency if official_run else None
        note = f"skipped: {why_not}" if official_run is None else _describe_failure("official", official_run)
        for figure, attribute, goal in (("p50", "p50_ms", None), ("p99", "p99_ms", ratio_at_most(1.0, "official"))):
            self.rows.append(
                make_row(
                    "latency vs official",
                    f"{figure}, {label}",
                    getattr(mine, attribute) if mine else None,
                    "ms",
                    getattr(theirs, attribute) if theirs else None,
                    goal if theirs else None,
                    note if figure == "p50" else "",
                )
            )

    def _latency_rows(self, label: str, mine_run: RunResult, theirs_run: RunResult, measured: int, p50_goal: float | None, p99_goal: float | None) -> None:
        mine, theirs = mine_run.latency, theirs_run.latency
        missing = mine.unanswered if mine else measured
        runs = ""
        if mine_run.repeats_latency_ms:
            each = ", ".join("failed" if run is None else f"{_number(run[0])} / {_number(run[1])}" for run in mine_run.repeats_latency_ms)
            runs = f"the run with the median p50 of {len(mine_run.repeats_latency_ms)} (p50 / p99 ms: {each})"
        note = "; ".join(filter(None, [runs, _describe_failure("ours", mine_run), _describe_failure("baseline", theirs_run)]))
        if missing:
            note = "; ".join(filter(None, [note, f"{missing} point(s) never came back"]))
        for figure, attribute, goal in (
            ("p50", "p50_ms", None if p50_goal is None else value_at_most(p50_goal, "ms")),
            ("p99", "p99_ms", None if p99_goal is None else value_at_most(p99_goal, "ms")),
            ("max", "max_ms", None),
        ):
            row = make_row(
                "latency",
                f"{figure} at {self.settings.latency_rate:,.0f} points/s, {label}",
                getattr(mine, attribute) if mine else None,
                "ms",
                getattr(theirs, attribute) if theirs else None,
                goal,
                note if figure == "p50" else "",
            )
            if goal is not None and missing:
                row.met = False
            self.rows.append(row)
        batches = mine_run.micro_batches
        if batches is not None:
            # Where the time goes: a point waits for the micro-batch under way, then its own.
            rate = f"at {self.settings.latency_rate:,.0f} points/s, {label}"
            for figure, value, unit in (
                ("micro-batches a second", batches.per_second, "/s"),
                ("points a micro-batch", batches.points_each, "points"),
                ("a micro-batch, taken to output queued (mean)", batches.compute_ms, "ms"),
                # Over 100 % when micro-batches are chained: one computes while the next is taken.
                ("micro-batches under way (their times summed over the window)", batches.compute_share * 100, "%"),
            ):
                self.rows.append(make_row("latency", f"{figure} {rate}", value, unit, note="the agent's metrics, same run" if unit == "/s" else ""))

    def case_memory(self, record: dict[str, Any]) -> None:
        s = self.settings
        sizes = sorted(set(s.memory_points))
        for udf, options in (("mirror", []), ("moving_avg", MOVING_AVG_OPTIONS)):
            peaks: dict[int, RunResult] = {}
            for points in sizes:
                workload = Workload(points, s.groups)
                # moving_avg with Spark warm: every size computed the same way (on Spark), not
                # a small run in the agent while Spark starts against a big one on Spark.
                mine = self.flat_out(ours(udf, s), options, workload, warm=udf != "mirror")
                self._keep(record, f"ours {udf} {points}", mine)
                peaks[points] = mine
                handler = "echo" if udf == "mirror" else "moving_avg"
                theirs = self.runs.get((baseline(handler).label, workload))
                m = mine.memory
                note = _describe_failure("ours", mine)
                self.rows.append(
                    make_row(
                        "memory",
                        f"{udf} agent RSS peak @ {points:,}",
                        m.agent_mb,
                        "MB",
                        theirs.memory.agent_mb if theirs else None,
                        note=note,
                    )
                )
                if udf != "mirror":
                    self.rows.append(make_row("memory", f"{udf} JVM RSS peak @ {points:,}", m.jvm_mb, "MB", goal=value_at_most(600, "MB")))
                    self.rows.append(make_row("memory", f"{udf} Spark workers RSS peak @ {points:,}", m.workers_mb, "MB"))
            if len(sizes) > 1:
                small, large = peaks[sizes[0]].memory.agent_mb, peaks[sizes[-1]].memory.agent_mb
                growth = large / small if small else None
                self.rows.append(
                    make_row(
                        "memory",
                        f"{udf} agent RSS {sizes[-1]:,} / {sizes[0]:,}",
                        growth,
                        "x",
                        goal=Goal("<= 1.25 (flat)", lambda row: None if row.value is None else row.value <= 1.25),
                    )
                )


    def case_group_state(self, record: dict[str, Any]) -> None:
        """What kept group state costs: moving_avg size 3 (two kept points per group) over
        ``state_groups`` groups x 2 points (each group's history full, and never used again:
        churn), against the same points over 100 groups; on a task's own Spark, then on the
        default deployment, where the relay also keeps the input since the last checkpoint and
        the last checkpoint (failover)."""
        options = [("field", "usage_user"), ("size", 3), ("as", "avg")]
        per_process = "peaks summed per process (agent, JVM, workers)"
        self._churn(record, ours("moving_avg", self.settings), options, "own Spark", 400, lambda m: m.agent_mb + m.jvm_mb + m.workers_mb, per_process)
        with shared_directory("bench-shared-") as shared_dir:
            self.say("udf-agent moving_avg (shared): warming the shared server")
            warm_shared_server("moving_avg", shared_dir, init_frame(options))
            command = dataclasses.replace(shared("moving_avg", shared_dir), also=lambda: shared_server_pids(shared_dir))
            together = "the whole tree's peak at one sampling (relay, server, JVM, workers), every 0.1 s"
            self._churn(record, command, options, "default deployment (relay + shared server)", 350, lambda m: m.tree_mb, together)

    def _churn(
        self, record: dict[str, Any], command: AgentCommand, options: list[tuple[str, object]], deployment: str, goal_mb: float, peak: Callable[[MemoryPeaks], float], how: str
    ) -> None:
        """The footprint's peak over few groups, then over ``state_groups`` churned, and what the
        groups added (once Spark is up: a warm server, or the task's own)."""
        s = self.settings
        peaks: dict[int, float | None] = {}
        for groups in (s.groups, s.state_groups):
            mine = self.flat_out(command, options, Workload(2 * s.state_groups, groups), reuse=False, warm=command.env is None)
            self._keep(record, f"ours {deployment} {groups} groups", mine)
            m = mine.memory
            peaks[groups] = peak(m) if mine.ok else None
            apart = f"peaks apart: agent or relay {m.agent_mb:.0f}, shared server {m.server_mb:.0f}, JVM {m.jvm_mb:.0f}, workers {m.workers_mb:.0f} MB"
            self.rows.append(make_row("group_state", f"RSS peak, {deployment}, {groups:,} groups x 2", peaks[groups], "MB", note=_describe_failure("ours", mine) or apart))
        few, many = peaks[s.groups], peaks[s.state_groups]
        self.rows.append(
            make_row(
                "group_state",
                f"added by {s.state_groups:,} groups' state, {deployment}",
                None if few is None or many is None else many - few,
                "MB",
                goal=value_at_most(goal_mb, "MB") if s.state_groups >= 500_000 else None,
                note=how,
            )
        )


def _lower_median(results: list[RunResult], key: Callable[[RunResult], Any]) -> RunResult:
    """The middle run by ``key``; of two middle ones, the lower."""
    return sorted(results, key=key)[(len(results) - 1) // 2]


def _median_run(results: list[RunResult]) -> RunResult:
    """Of repeated runs, the one with the median steady rate (the lower of the two middle
    ones for an even count; a failed run ranks lowest); every run's rate is kept in its JSON,
    and its keepalive figures are those of every run's keepalives pooled."""
    median = _lower_median(results, key=lambda run: (run.ok, run.steady_pps or 0.0))
    if len(results) == 1:
        return median
    return dataclasses.replace(
        median,
        repeats_steady_pps=[run.steady_pps for run in results],
        keepalive=LatencyStats.pooled([run.keepalive for run in results]),
        keepalive_runs=len(results),
    )


def _with_metrics(command: AgentCommand) -> tuple[AgentCommand, str]:
    """The command serving the agent's metrics on a free local port, and their address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return dataclasses.replace(command, argv=[*command.argv, "--metrics-address", f"127.0.0.1:{port}"]), f"http://127.0.0.1:{port}/metrics"


def _median_latency_run(results: list[RunResult]) -> RunResult:
    """Of repeated paced runs, the one with the median p50 (the lower of the two middle ones
    for an even count; a failed run ranks as the slowest), with every run's p50 and p99."""
    median = _lower_median(results, key=lambda run: (not run.ok or run.latency is None, (run.latency.p50_ms or 0.0) if run.latency else 0.0))
    if len(results) == 1:
        return median
    return dataclasses.replace(median, repeats_latency_ms=[(run.latency.p50_ms, run.latency.p99_ms) if run.ok and run.latency else None for run in results])


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _package_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _first_line(command: list[str]) -> str | None:
    try:
        done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=30, cwd=REPO)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout or done.stderr).strip()
    return text.splitlines()[0] if text else None


def machine() -> dict[str, Any]:
    cpu_model = None
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    mem_total_mb = None
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                mem_total_mb = int(line.split()[1]) // 1024
                break
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model,
        "mem_total_mb": mem_total_mb,
        "load_average_start": list(os.getloadavg()),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyspark": _package_version("pyspark"),
        "protobuf": _package_version("protobuf"),
        "pandas": _package_version("pandas"),
        "udf_agent": _package_version("udf-agent"),
        "java": _first_line(["java", "-version"]),
        "git_commit": _first_line(["git", "rev-parse", "--short", "HEAD"]),
        "git_dirty": bool(_first_line(["git", "status", "--porcelain", "--untracked-files=no"])),
    }


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_table(rows: list[Row]) -> str:
    header = ("case", "figure", "ours", "unit", "baseline", "ours/base", "goal", "met", "note")
    lines = [
        (
            row.case,
            row.figure,
            _number(row.value),
            row.unit,
            _number(row.baseline),
            "-" if row.ratio is None else f"{row.ratio:.2f}x",
            row.goal,
            {True: "yes", False: "NO", None: "-" if not row.goal else "n/a"}[row.met],
            row.note if len(row.note) <= 110 else row.note[:107] + "...",
        )
        for row in rows
    ]
    widths = [max(len(cells[i]) for cells in [header, *lines]) for i in range(len(header))]
    right = {2, 4, 5}

    def render(cells: tuple[str, ...]) -> str:
        return "  ".join(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]) for i, cell in enumerate(cells)).rstrip()

    rule = "  ".join("-" * width for width in widths)
    return "\n".join([render(header), rule, *(render(cells) for cells in lines)])


def format_machine(info: dict[str, Any]) -> str:
    load = " ".join(f"{x:.2f}" for x in info["load_average_start"])
    return (
        f"machine: {info['nproc']} CPUs ({info['cpu_model']}), {info['mem_total_mb']:,} MB RAM, kernel {info['kernel']}\n"
        f"software: python {info['python']}, pyspark {info['pyspark']}, protobuf {info['protobuf']}, pandas {info['pandas']}, "
        f"udf-agent {info['udf_agent']} ({info['git_commit']}{', dirty' if info['git_dirty'] else ''}), {info['java']}\n"
        f"load average at start: {load}"
    )


def run_benchmarks(settings: Settings, cases: list[str], out: TextIO = sys.stdout, progress: TextIO = sys.stderr) -> dict[str, Any]:
    """Runs ``cases`` in order and returns the report (printing machine and table to ``out``)."""
    unknown = [case for case in cases if case not in CASES]
    if unknown:
        raise ValueError(f"unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    info = machine()
    print(format_machine(info), file=out, flush=True)
    bench = Bench(settings, progress)
    started = _now()
    interrupted = False
    try:
        for case in cases:
            bench.run_case(case)
    except KeyboardInterrupt:  # still report what was measured
        interrupted = True
    info["load_average_end"] = list(os.getloadavg())
    report = {
        "schema": 1,
        "started": started,
        "finished": _now(),
        "interrupted": interrupted,
        "machine": info,
        "settings": asdict(settings),
        "cases": bench.cases,
        "rows": [asdict(row) for row in bench.rows],
    }
    print(file=out)
    print(format_table(bench.rows), file=out)
    print(f"\nload average at end: {' '.join(f'{x:.2f}' for x in info['load_average_end'])}", file=out, flush=True)
    return report


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(part.replace("_", "")) for part in text.split(",") if part.strip())


def parse_args(argv: list[str]) -> tuple[Settings, list[str], str]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a few minutes, mostly Spark start-ups")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, from: {','.join(CASES)} (default: all)")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where to write the results (default: %(default)s)")
    parser.add_argument("--points", type=int, help="points of the echo, moving_avg and limits cases (default 1,000,000)")
    parser.add_argument("--groups", type=int, help="groups of those cases (default 100)")
    parser.add_argument("--many-groups", type=int, help="groups of the many_groups case (default 10,000)")
    parser.add_argument("--points-per-group", type=int, help="points per group of the many_groups case (default 30)")
    parser.add_argument("--new-group-points", type=int, help="points of the new_groups case, each a new group (default 200,000)")
    parser.add_argument("--latency-rate", type=float, help="points/s of the latency case (default 1,000)")
    parser.add_argument("--latency-seconds", type=float, help="measured seconds of the latency case (default 10; at least three bursts)")
    parser.add_argument("--latency-bursts", type=_int_list, help="arrival patterns of the latency case: points a burst, e.g. 1,10,100 (default 1,10,100,1000,10000; 1 is an even trickle)")
    parser.add_argument("--memory-points", type=_int_list, help="sizes of the memory case, e.g. 1000000,10000000 (default: --points)")
    parser.add_argument("--state-groups", type=int, help="groups of the group_state case, 2 points each (default 500,000)")
    parser.add_argument("--repeat", type=int, help="flat-out runs of each agent and workload; the median run is reported, with every run's keepalives pooled (default 1)")
    parser.add_argument("--time-limit-scale", type=float, help="multiplies every per-run time limit")
    parser.add_argument(
        "--agent-arg",
        action="append",
        default=[],
        help="extra argument for `udf-agent run UDF` (repeatable), e.g. --agent-arg=--flush-interval=50ms",
    )
    parser.add_argument(
        "--kapacitor-src",
        default=os.environ.get("KAPACITOR_SRC"),
        help="a Kapacitor checkout: also time its Python moving_avg example (default: $KAPACITOR_SRC)",
    )
    parser.add_argument("--official-python", default=sys.executable, help="the Python that runs the official agent, with the protobuf it should use (default: this one)")
    args = parser.parse_args(argv)
    settings = Settings.quick() if args.quick else Settings()
    overrides = {
        name: value
        for name, value in {
            "points": args.points,
            "groups": args.groups,
            "many_groups": args.many_groups,
            "points_per_group": args.points_per_group,
            "new_group_points": args.new_group_points,
            "latency_rate": args.latency_rate,
            "latency_seconds": args.latency_seconds,
            "state_groups": args.state_groups,
            "repeat": args.repeat,
            "time_limit_scale": args.time_limit_scale,
        }.items()
        if value is not None
    }
    if args.latency_bursts:
        overrides["latency_bursts"] = args.latency_bursts
    if args.memory_points:
        overrides["memory_points"] = args.memory_points
    elif args.points is not None:
        overrides["memory_points"] = (args.points,)
    overrides["agent_args"] = tuple(args.agent_arg)
    overrides["kapacitor_src"] = args.kapacitor_src or None
    overrides["official_python"] = args.official_python
    settings = replace(settings, **overrides)
    cases = [case.strip() for case in args.cases.split(",") if case.strip()]
    return settings, cases, args.json


def main(argv: list[str] | None = None) -> int:
    settings, cases, json_path = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        report = run_benchmarks(settings, cases)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["command"] = ["benchmarks/run.py", *(sys.argv[1:] if argv is None else argv)]
    directory = os.path.dirname(os.path.abspath(json_path))
    os.makedirs(directory, exist_ok=True)
    with open(json_path, "w") as out:
        json.dump(report, out, indent=1, default=str)
        out.write("\n")
    print(f"results written to {json_path}")
    return 130 if report["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
