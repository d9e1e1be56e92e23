#!/usr/bin/env python3
"""The referee for speed as Kapacitor really feeds a UDF: the Kapacitor harness's throughput
scenario, run against each agent in turn, with the CPU of every agent's whole process tree.

    .venv/bin/python benchmarks/kapacitor_harness.py --harness BIN --kapacitor-src DIR [--repeat 3]

The harness (``../shared/kapacitor-harness``, built from Kapacitor's own sources) drives the agent
with Kapacitor's client code, ``udf.Server`` and ``UDFProcess``: Init, 25 s idle (Spark starts
meanwhile), 1,000,000 points in 1,000 series written as Kapacitor writes them, every output
awaited, a normal stop. Agents, each run once per round and the rounds ``--repeat`` times, so
that every agent meets the machine's moods alike:

- Kapacitor's official Python agent, its own moving_avg example (``python -u``, as
  kapacitor.conf runs it), from ``--kapacitor-src`` (a directory holding Kapacitor's
  ``udf/agent``, e.g. ``git --git-dir=KAPACITOR.git archive v1.8.3 udf/agent | tar -x -C DIR``);
- ``udf-agent run moving_avg`` and ``udf-agent run mirror``, the default deployment: for
  moving_avg the task's relay and the shared per-host server it starts (fresh for each run, in
  a private directory), with the server's JVM and Python workers; mirror, which never starts
  Spark, runs in the task's own process;
- ``udf-agent run moving_avg --own-spark``: the task's agent with its own JVM and workers;
- ``pandas_per_group`` (not run by default): ``examples/moving_avg_pandas.py``, the same
  moving average as a plain per-group pandas UDF (docs/migrating.md), on the shared server;
- Kapacitor's own ``moving_avg.py`` example, unmodified, on udf-agent (``moving_avg_py``): this
  venv's ``python -u moving_avg.py``, no ``PYTHONPATH`` to Kapacitor's agent library, so the
  ``kapacitor.udf.agent`` installed with udf-agent makes it ``udf-agent run moving_avg.py``,
  relayed to a shared server (fresh for each run, as above) whose resident worker hosts the
  script's handler; ``moving_avg_py_own_spark`` (not run by default) the same with
  ``UDF_AGENT_OWN_SPARK=1``. ``--agents official,moving_avg_py`` compares just the two.

Figures, median of the runs: points/s as Kapacitor's client measured it (the scenario's point
op); CPU a point: user + system CPU of the agent's whole process tree from the first point to
the last output, over the points (every process sampled each 0.1 s, so one that ends meanwhile
still counts); the same by process (the task's process, the shared server, Spark's JVM, Spark's
Python workers), to see where a point's CPU goes; and the CPU a point of Kapacitor's own
client, which shares the host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.deployment import cpu_s  # noqa: E402
from benchmarks.driver import AgentCommand, descendants  # noqa: E402
from benchmarks.kapacitor_feed import RATE_AND_CPU, markdown_table, median_rows  # noqa: E402
from benchmarks.run import official_moving_avg  # noqa: E402
from benchmarks.shared_deployment import shared_directory, shared_env  # noqa: E402
from udf_agent.serve.shared import shared_server_pids  # noqa: E402

SCENARIO = os.path.join(os.path.dirname(REPO), "shared", "kapacitor-scenarios", "throughput.jsonl")
DEFAULT_JSON = os.path.join(REPO, "benchmarks", "results", "kapacitor_harness.json")
SAMPLE_INTERVAL = 0.1
SCRIPT_LABEL = "Kapacitor's moving_avg.py on udf-agent"
AGENTS = ("official", "moving_avg_py", "moving_avg", "mirror", "own_spark", "moving_avg_py_own_spark", "pandas_per_group")
# The harness log: "[  26.765s] op#2 (line 8) sleep: ok in 25.00s".
OP_DONE = re.compile(r"^\[\s*(?P<at>[0-9.]+)s\] op#(?P<op>\d+) \(line \d+\) (?P<kind>\w+): ok")
RATE = re.compile(r"sent (?P<points>\d+) points in (?P<seconds>[0-9.]+)s \((?P<rate>\d+)/s\)")


@dataclass
class HarnessRun:
    agent: str
    status: str = "ok"
    error: str = ""
    points: int = 0
    points_per_s: float = 0.0
    cpu_s: float = 0.0
    cpu_us_per_point: float = 0.0
    kapacitor_cpu_us_per_point: float = 0.0
    load_average: float = 0.0
    # The same CPU a point by process (``role_of``): which of them the points cost.
    cpu_us_per_point_by_process: dict[str, float] = field(default_factory=dict)


def role_of(argv: list[str]) -> str:
    """What a process of an agent's tree is, from its command line."""
    line = " ".join(argv)
    if "pyspark.daemon" in line or "pyspark.worker" in line:
        return "Spark's Python workers"
    if argv and (os.path.basename(argv[0]) == "java" or "spark-class" in line):
        return "Spark's JVM"
    if "shared-server" in argv:
        return "shared server"
    return "the task's process"


def command_line(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [part.decode(errors="replace") for part in f.read().split(b"\0") if part]
    except OSError:
        return []


class CPUTimeline:
    """CPU seconds of a changing set of processes over time, sampled on a thread: ``at(t)``
    reads the total at a moment, from the samples either side; ``by_role(t0, t1)`` what each
    kind of process (``role_of``) used between two moments."""

    def __init__(self, pids: Callable[[], list[int]]):
        self._pids = pids
        self._by_pid: dict[int, float] = {}
        self.roles: dict[int, str] = {}  # each process's, from its command line when first seen
        self.samples: list[tuple[float, float]] = []
        self._pid_samples: list[tuple[float, dict[int, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="harness-cpu", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(SAMPLE_INTERVAL):
                self._sample()
                return

    def _sample(self) -> None:
        for pid in self._pids():
            if pid not in self.roles:
                self.roles[pid] = role_of(command_line(pid))
            # A process gone reads 0 and keeps what it used.
            self._by_pid[pid] = max(cpu_s(pid), self._by_pid.get(pid, 0.0))
        now = time.monotonic()
        self.samples.append((now, sum(self._by_pid.values())))
        self._pid_samples.append((now, dict(self._by_pid)))

    def by_role(self, start: float, end: float) -> dict[str, float]:
        """CPU seconds each role's processes used from ``start`` to ``end`` (the samples
        nearest each moment)."""
        nearest = lambda moment: min(self._pid_samples, key=lambda sample: abs(sample[0] - moment))[1]  # noqa: E731
        before, after = nearest(start), nearest(end)
        used: dict[str, float] = {}
        for pid, cpu in after.items():
            role = self.roles.get(pid, "the task's process")
            used[role] = used.get(role, 0.0) + cpu - before.get(pid, 0.0)
        return used

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, moment: float) -> float:
        before = [cpu for at, cpu in self.samples if at <= moment]
        after = [cpu for at, cpu in self.samples if at >= moment]
        if not before or not after:
            raise ValueError("no CPU sample around that moment")
        return (before[-1] + after[0]) / 2


def ops_done(log: str) -> dict[int, float]:
    """When each op of the scenario ended, in seconds from the harness's start."""
    return {int(m["op"]): float(m["at"]) for m in map(OP_DONE.match, log.splitlines()) if m}


def run_once(harness: str, scenario: str, command: AgentCommand, shared_dir: str | None, time_limit: float) -> HarnessRun:
    run = HarnessRun(agent=command.label, load_average=os.getloadavg()[0])
    env = {**os.environ, **(command.env or {})}
    started = time.monotonic()
    process = subprocess.Popen([harness, scenario, "--", *command.argv], cwd=command.cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    servers = (lambda: shared_server_pids(shared_dir)) if shared_dir else list

    def agent_tree() -> list[int]:
        return [*descendants(process.pid), *(pid for server in servers() for pid in (server, *descendants(server)))]

    agent = CPUTimeline(agent_tree)
    kapacitor = CPUTimeline(lambda: [process.pid])
    try:
        verdict, log = process.communicate(timeout=time_limit)
    except subprocess.TimeoutExpired:
        process.kill()
        verdict, log = process.communicate()
        run.status, run.error = "failed", f"no verdict within {time_limit:.0f} s"
        return run
    finally:
        agent.stop()
        kapacitor.stop()
    last = verdict.strip().splitlines()[-1] if verdict.strip() else ""
    rate = RATE.search(last)
    ops = ops_done(log)
    if process.returncode != 0 or rate is None or not {2, 4} <= ops.keys():
        run.status, run.error = "failed", (last or log.strip().splitlines()[-1] if log.strip() else "no verdict")[:300]
        return run
    # Points from the end of the idle op to the end of the wait for every output.
    first_point, last_output = started + ops[2], started + ops[4]
    run.points = int(rate["points"])
    run.points_per_s = float(rate["rate"])
    run.cpu_s = agent.at(last_output) - agent.at(first_point)
    run.cpu_us_per_point = run.cpu_s / run.points * 1e6
    run.kapacitor_cpu_us_per_point = (kapacitor.at(last_output) - kapacitor.at(first_point)) / run.points * 1e6
    run.cpu_us_per_point_by_process = {role: cpu / run.points * 1e6 for role, cpu in sorted(agent.by_role(first_point, last_output).items())}
    return run


def without_options(scenario: str, directory: str) -> str:
    """The scenario with an Init of no options (mirror takes none), written into ``directory``."""
    path = os.path.join(directory, "no-options-" + os.path.basename(scenario))
    with open(scenario) as source, open(path, "w") as out:
        for line in source:
            if line.lstrip().startswith("{") and json.loads(line).get("op") == "init":
                line = json.dumps({**json.loads(line), "options": {}}) + "\n"
            out.write(line)
    return path


def extract_kapacitor_agent(git_dir: str, ref: str, directory: str) -> str:
    """Kapacitor's udf/agent at ``ref`` extracted under ``directory`` (never into the repository); the directory."""
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", ref, "udf/agent"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    return directory


def protobuf_version(python: str) -> str:
    found = subprocess.run([python, "-c", "import google.protobuf; print(google.protobuf.__version__)"], capture_output=True, text=True, check=False)
    return found.stdout.strip() or "none"


def add_paired_ratios(report: dict[str, Any]) -> None:
    """Per agent, the median over the rounds of its run's rate and CPU a point over the official
    agent's run of the same round: on a shared machine whose speed drifts, a steadier ratio
    than the ratio of the medians."""
    reference = next((runs for label, runs in report["runs"].items() if label.startswith("official")), None)
    if not reference:
        return
    for row in report["table"]:
        runs = report["runs"][row["agent"]]
        pairs = [(mine, ref) for mine, ref in zip(runs, reference) if mine["status"] == ref["status"] == "ok"]
        if runs is reference or not pairs:
            continue
        row["paired_rate_vs_official"] = statistics.median(mine["points_per_s"] / ref["points_per_s"] for mine, ref in pairs)
        row["paired_cpu_vs_official"] = statistics.median(mine["cpu_us_per_point"] / ref["cpu_us_per_point"] for mine, ref in pairs)
        row["rounds_paired"] = len(pairs)


def format_table(report: dict[str, Any]) -> str:
    machine = report["machine"]
    heading = (
        f"Kapacitor harness, throughput scenario ({os.path.basename(report['scenario'])}), median of {report['repeat']} run(s); "
        f"the official agent on protobuf {report['official_protobuf']}; "
        f"{machine['cpus']} CPUs, load {machine['load_average_start']:.2f} -> {machine['load_average_end']:.2f}"
    )
    columns = [
        *RATE_AND_CPU,
        ("rate vs official, paired by round", "paired_rate_vs_official", "{:.2f}×"),
        ("CPU vs official, paired by round", "paired_cpu_vs_official", "{:.2f}×"),
        ("Kapacitor's client, CPU a point", "kapacitor_cpu_us_per_point", "{:.1f} µs"),
    ]
    lines = [heading, "", *markdown_table(report["table"], columns)]
    by_process = [
        (label, role, statistics.median(figures))
        for label, runs in report["runs"].items()
        for role, figures in _by_process(runs).items()
    ]
    if by_process:
        lines += ["", "CPU a point by process (medians):", "", "| agent | process | CPU a point |", "| --- | --- | --- |"]
        lines += [f"| {label} | {role} | {cpu:.2f} µs |" for label, role, cpu in by_process]
    return "\n".join(lines)


def _by_process(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {}
    for run in runs:
        for role, cpu in run.get("cpu_us_per_point_by_process", {}).items():
            figures.setdefault(role, []).append(cpu)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harness", default=os.environ.get("HARNESS_BIN"), help="the kapacitor-harness binary (or $HARNESS_BIN)")
    parser.add_argument("--kapacitor-src", default=os.environ.get("KAPACITOR_SRC"), help="a directory holding Kapacitor's udf/agent (or $KAPACITOR_SRC)")
    parser.add_argument("--official-python", default=sys.executable, help="the Python that runs the official agent, with the protobuf it should use (default: this one)")
    parser.add_argument("--scenario", default=SCENARIO, help="the throughput scenario (default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=3, help="rounds; each runs every agent once (default: %(default)s)")
    parser.add_argument("--agents", default="official,moving_avg_py,moving_avg,mirror,own_spark", help="comma-separated, from the default (%(default)s) and moving_avg_py_own_spark")
    parser.add_argument("--kapacitor-git-dir", default=os.environ.get("KAPACITOR_GIT_DIR"), help="without --kapacitor-src: a git dir of influxdata/kapacitor whose udf/agent (--kapacitor-ref) is extracted into a temporary directory")
    parser.add_argument("--kapacitor-ref", default="v1.8.3", help="with --kapacitor-git-dir (default: %(default)s)")
    parser.add_argument("--udf-agent-args", default="", help="options added to every 'udf-agent run' command line (moving_avg, mirror, own_spark, pandas_per_group), e.g. \"--gather 50ms\"")
    parser.add_argument("--json", default=DEFAULT_JSON, help="where the results go (default: %(default)s)")
    args = parser.parse_args()
    if not args.harness or not os.access(args.harness, os.X_OK):
        parser.error("--harness: the kapacitor-harness binary (build it with ../shared/kapacitor-harness/build.sh)")
    chosen = [name.strip() for name in args.agents.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(AGENTS))
    if unknown:
        parser.error(f"--agents: unknown {', '.join(unknown)}; known: {', '.join(AGENTS)}")
    python = sys.executable
    scenarios = tempfile.mkdtemp(prefix="kh-scenarios-")
    if not args.kapacitor_src and args.kapacitor_git_dir:
        args.kapacitor_src = extract_kapacitor_agent(args.kapacitor_git_dir, args.kapacitor_ref, scenarios)
    # name: (command, why it cannot run, whether it uses the shared server, whether it takes the scenario's options)
    agents: dict[str, tuple[AgentCommand | None, str, bool, bool]] = {}
    official, why = official_moving_avg(args.kapacitor_src, unbuffered=True, python=args.official_python) if args.kapacitor_src else (None, "no --kapacitor-src")
    agents["official"] = (official, why, False, True)
    extra = shlex.split(args.udf_agent_args)

    def udf_agent_run(target: str, *options: str) -> AgentCommand:
        argv = ["run", target, *options, *extra]
        return AgentCommand(f"udf-agent {' '.join(argv)}", [python, "-m", "udf_agent", *argv], cwd=REPO)

    agents["moving_avg"] = (udf_agent_run("moving_avg"), "", True, True)
    agents["mirror"] = (udf_agent_run("mirror"), "", True, False)
    agents["pandas_per_group"] = (udf_agent_run("examples.moving_avg_pandas:moving_avg"), "", True, True)
    agents["own_spark"] = (udf_agent_run("moving_avg", "--own-spark"), "", False, True)
    script = os.path.join(args.kapacitor_src or "", "udf", "agent", "examples", "moving_avg", "moving_avg.py")
    script_why = "" if os.path.isfile(script) else (f"no {script}" if args.kapacitor_src else "no --kapacitor-src")
    # Our venv's python runs the unmodified script; no PYTHONPATH: kapacitor.udf.agent is udf-agent's.
    script_command = AgentCommand(SCRIPT_LABEL, [python, "-u", script], cwd=os.path.dirname(script), env={"PYTHONPATH": ""}) if not script_why else None
    agents["moving_avg_py"] = (script_command, script_why, True, True)
    own = AgentCommand(SCRIPT_LABEL + " (own Spark)", script_command.argv, script_command.cwd, {"PYTHONPATH": "", "UDF_AGENT_OWN_SPARK": "1"}) if script_command else None
    agents["moving_avg_py_own_spark"] = (own, script_why, False, True)
    report: dict[str, Any] = {
        "scenario": args.scenario, "repeat": args.repeat, "official_protobuf": protobuf_version(args.official_python),
        "machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()[0]}, "runs": {},
    }
    for name in chosen:
        command, why, _, _ = agents[name]
        label = command.label if command is not None else {"official": "official moving_avg -u", "moving_avg_py": SCRIPT_LABEL, "moving_avg_py_own_spark": SCRIPT_LABEL + " (own Spark)"}.get(name, name)
        report["runs"][label] = [] if command is not None else [asdict(HarnessRun(agent=label, status="skipped", error=why))]
    plain = without_options(args.scenario, scenarios)
    for round_number in range(1, args.repeat + 1):
        for name in chosen:
            command, _, shared, with_options = agents[name]
            if command is None:
                continue
            print(f"round {round_number}: {command.label} ...", file=sys.stderr, flush=True)
            with contextlib.ExitStack() as stack:
                shared_dir = stack.enter_context(shared_directory("kh-shared-")) if shared else None
                if shared_dir is not None:
                    command = AgentCommand(command.label, command.argv, command.cwd, {**(command.env or {}), **shared_env(shared_dir)})
                run = run_once(args.harness, args.scenario if with_options else plain, command, shared_dir, time_limit=600)
            print(f"  {run.status}: {run.points_per_s:,.0f} points/s, {run.cpu_us_per_point:.1f} µs a point {run.error}", file=sys.stderr, flush=True)
            report["runs"][command.label].append(asdict(run))
    shutil.rmtree(scenarios, ignore_errors=True)
    report["machine"]["load_average_end"] = os.getloadavg()[0]
    report["table"] = median_rows(report["runs"], ("points_per_s", "cpu_us_per_point", "kapacitor_cpu_us_per_point"))
    add_paired_ratios(report)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(report, out, indent=1)
    print(format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
