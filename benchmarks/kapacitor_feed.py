#!/usr/bin/env python3
"""Kapacitor's feed: points/s and CPU a point of each agent's whole process tree, side by side
with Kapacitor's official Python agent running its own moving_avg example, in the same run.

    .venv/bin/python benchmarks/kapacitor_feed.py --kapacitor-src DIR [--points N] [--repeat 3]

Kapacitor's ``udf.Server`` writes every point as two unbuffered writes to the UDF's pipe, its
length varint and then its body (``agent.WriteMessage``, called from ``Server.writeData``),
from one goroutine, as fast as the pipe takes them. This benchmark writes exactly so, from a
process of its own (``kapacitor_writer.py``), keepalives (every 10 ms) included. It does not
replace the Kapacitor harness (``../shared/kapacitor-harness``, whose throughput scenario drives
the agent with Kapacitor's own client code): it puts figures side by side in one command.

Figures, for each agent (median of ``--repeat`` runs):
- points/s: points written / seconds from the first point written to the last output read;
- CPU a point: user + system CPU of the agent's whole process tree over that span (sampled
  per process every 0.1 s, so a process that ends meanwhile still counts), over the points.
  For the default deployment the tree is the task's relay and the shared server with its JVM
  and Python workers (mirror, which never starts Spark: the task's own process); with
  ``--own-spark``, the task's agent, its JVM and workers.

``udf-agent`` runs warm: its shared server is started and has computed (a first task, closed
before the measured one starts), as on a host with tasks already running; ``--own-spark``
waits for its agent to log that its compute engine is ready. The official agent needs
``--kapacitor-src`` (or ``$KAPACITOR_SRC``): a directory holding Kapacitor's ``udf/agent``,
for instance ``git --git-dir=KAPACITOR.git archive v1.8.3 udf/agent | tar -x -C DIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.deployment import TreeCPU  # noqa: E402
from benchmarks.driver import AgentCommand, AgentProcess, LatencyStats  # noqa: E402
from benchmarks.run import official_moving_avg  # noqa: E402
from benchmarks.shared_deployment import shared_directory, shared_env, warm_shared_server  # noqa: E402
from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, init_frame  # noqa: E402
from udf_agent.serve.shared import shared_server_pids  # noqa: E402

WRITER = os.path.join(REPO, "benchmarks", "kapacitor_writer.py")
CPU_INTERVAL = 0.1
DEFAULT_JSON = os.path.join(REPO, "benchmarks", "results", "kapacitor_feed.json")


@dataclass
class FeedRun:
    agent: str
    status: str = "ok"
    error: str = ""
    points: int = 0
    seconds: float = 0.0
    points_per_s: float = 0.0
    cpu_s: float = 0.0
    server_cpu_s: float = 0.0  # of it, the shared server's tree (JVM and workers included)
    cpu_us_per_point: float = 0.0
    keepalive: LatencyStats = field(default_factory=LatencyStats)


class Trees:
    """The CPU of several process trees, sampled on a thread until stopped."""

    def __init__(self, roots: list[int]):
        self._trees = [TreeCPU(root) for root in roots]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="feed-cpu", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(CPU_INTERVAL):
            for tree in self._trees:
                tree.sample()

    def used(self, first: int = 0) -> float:
        """CPU seconds of the trees from the ``first`` root on, each process once (a shared
        server the task started is in the task's tree too)."""
        by_pid: dict[int, float] = {}
        for tree in self._trees[first:]:
            by_pid.update(tree.used_by_pid())
        return sum(by_pid.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def feed(agent: AgentProcess, workload: Workload, deadline: float, extra_roots: list[int]) -> FeedRun:
    """Writes every point as Kapacitor does (``kapacitor_writer.py``, a process of its own)
    and waits for every output point."""
    run = FeedRun(agent=agent.command.label, points=workload.points)
    trees = Trees([agent.process.pid, *extra_roots])
    sent: dict[int, float] = {}
    try:
        argv = [sys.executable, WRITER, str(agent.stdin_fd), workload.path(), str(workload.frame_length), str(workload.points)]
        writer = subprocess.run(argv, pass_fds=(agent.stdin_fd,), capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()), check=False)
        if writer.returncode != 0:
            raise RuntimeError(f"the writer failed: {writer.stderr.strip()[-300:]}")
        written = json.loads(writer.stdout)
        sent = {int(stamp): at for stamp, at in written["keepalives"].items()}
        if not agent.wait_for(lambda: agent.tally.points >= workload.points, deadline):
            raise agent.failure(f"{agent.tally.points:,} of {workload.points:,} output points")
        finished = agent.tally.last_point_at or time.monotonic()
        run.cpu_s = trees.used()
        run.server_cpu_s = trees.used(first=1)
        run.seconds = finished - written["started"]
        run.points_per_s = workload.points / run.seconds
        run.cpu_us_per_point = run.cpu_s / workload.points * 1e6
    except Exception as exc:  # a failed run is reported in its row, and the others still run
        run.status, run.error = "failed", str(exc)[:300]
    finally:
        trees.stop()
        answered = [agent.tally.keepalive_times[s] - at for s, at in sent.items() if s in agent.tally.keepalive_times]
        run.keepalive = LatencyStats.of(answered, unanswered=len(sent) - len(answered))
    return run


def measure(command: AgentCommand, workload: Workload, init: bytes, time_limit: float, shared_dir: str | None, warm_log: str | None) -> FeedRun:
    deadline = time.monotonic() + time_limit
    agent = AgentProcess(command, deadline)
    try:
        agent.init(init, deadline)
        if warm_log is not None and not agent.wait_for_log(warm_log, deadline):
            raise agent.failure(f"no log line {warm_log!r}")
        servers = shared_server_pids(shared_dir) if shared_dir else []
        run = feed(agent, workload, deadline, servers)
        agent.close_stdin()
        agent.process.wait(60)
        return run
    except Exception as exc:
        return FeedRun(agent=command.label, status="failed", error=str(exc)[:300])
    finally:
        agent.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--points", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kapacitor-src", default=os.environ.get("KAPACITOR_SRC"))
    parser.add_argument("--json", default=DEFAULT_JSON)
    args = parser.parse_args()
    workload = Workload(points=args.points, groups=args.groups)
    workload.path()  # generated before any clock starts
    moving_avg = init_frame(MOVING_AVG_OPTIONS)
    mirror = init_frame([])
    time_limit = 120 + args.points / 10_000
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()}, "points": args.points, "groups": args.groups, "runs": {}}
    with shared_directory("kfeed-") as shared_dir:
        shared = shared_env(shared_dir)
        # (label, command or None, Init, the shared server's UDF to warm, a log line that says warm)
        cases: list[tuple[str, AgentCommand | None, bytes, str | None, str | None]] = []
        official, why = official_moving_avg(args.kapacitor_src, unbuffered=True) if args.kapacitor_src else (None, "no --kapacitor-src")
        cases.append(("official moving_avg", official, moving_avg, None, None))
        for udf, init in (("moving_avg", moving_avg), ("mirror", mirror)):
            command = AgentCommand(f"udf-agent {udf}", [sys.executable, "-m", "udf_agent", "run", udf], cwd=REPO, env=shared)
            # mirror never starts Spark, so it runs in the task's own process: no server to warm.
            cases.append((command.label, command, init, udf if udf != "mirror" else None, None))
        own = AgentCommand("udf-agent moving_avg --own-spark", [sys.executable, "-m", "udf_agent", "run", "moving_avg", "--own-spark"], cwd=REPO)
        cases.append((own.label, own, moving_avg, None, "compute engine ready"))
        for label, command, init, warm_udf, warm_log in cases:
            if command is None:
                report["runs"][label] = [asdict(FeedRun(agent=label, status="skipped", error=why))]
                continue
            print(f"{label} ...", file=sys.stderr)
            runs = []
            for _ in range(args.repeat):
                if warm_udf is not None:
                    warm_shared_server(warm_udf, shared_dir, init)
                runs.append(measure(command, workload, init, time_limit, shared_dir if warm_udf else None, warm_log))
            report["runs"][label] = [asdict(run) for run in runs]
    report["machine"]["load_average_end"] = os.getloadavg()
    report["table"] = table(report["runs"])
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(report, out, indent=1)
    print(format_table(report))
    return 0


def median_rows(runs: dict[str, list[dict[str, Any]]], figures: tuple[str, ...]) -> list[dict[str, Any]]:
    """One row per agent: the median of each of ``figures`` over its successful runs, and its
    rate and CPU a point against the official agent's."""
    rows = []
    for label, results in runs.items():
        ok = [r for r in results if r["status"] == "ok"]
        row: dict[str, Any] = {"agent": label, "runs_ok": f"{len(ok)}/{len(results)}", "note": "; ".join(sorted({r["error"] for r in results if r["error"]}))}
        if ok:
            row.update({name: statistics.median(r[name] for r in ok) for name in figures})
        rows.append(row)
    reference = next((row for row in rows if row["agent"].startswith("official") and "points_per_s" in row), None)
    for row in rows:
        if reference is not None and "points_per_s" in row:
            row["rate_vs_official"] = row["points_per_s"] / reference["points_per_s"]
            row["cpu_vs_official"] = row["cpu_us_per_point"] / reference["cpu_us_per_point"]
    return rows


def markdown_table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> list[str]:
    """``rows`` as a Markdown table: agent, runs ok, then each (heading, figure, format), then the note."""
    lines = [
        "| agent | runs ok | " + " | ".join(heading for heading, _, _ in columns) + " | note |",
        "| --- | --- | " + " | ".join("---" for _ in columns) + " | --- |",
    ]
    for row in rows:
        figures = (_figure(row, name, pattern) for _, name, pattern in columns)
        lines.append(f"| {row['agent']} | {row['runs_ok']} | " + " | ".join(figures) + f" | {row['note']} |")
    return lines


# The columns both Kapacitor-feed benchmarks show first.
RATE_AND_CPU = [
    ("points/s", "points_per_s", "{:,.0f}"),
    ("CPU a point", "cpu_us_per_point", "{:.1f} µs"),
    ("rate vs official", "rate_vs_official", "{:.2f}×"),
    ("CPU vs official", "cpu_vs_official", "{:.2f}×"),
]


def table(runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Medians and ratios (``median_rows``), and keepalive p99 over every run's answers pooled."""
    rows = median_rows(runs, ("points_per_s", "cpu_us_per_point"))
    for row in rows:
        pooled = sorted(s for r in runs[row["agent"]] if r["status"] == "ok" for s in r["keepalive"]["samples_ms"])
        row["keepalive_p99_ms"] = pooled[min(len(pooled) - 1, int(len(pooled) * 0.99))] if pooled else None
    return rows


def format_table(report: dict[str, Any]) -> str:
    machine = report["machine"]
    heading = (
        f"Kapacitor's feed (two writes a point, one writer): {report['points']:,} points, {report['groups']:,} groups; "
        f"{machine['cpus']} CPUs, load {machine['load_average_start'][0]:.2f} -> {machine['load_average_end'][0]:.2f}"
    )
    return "\n".join([heading, "", *markdown_table(report["table"], [*RATE_AND_CPU, ("keepalive p99", "keepalive_p99_ms", "{:.1f} ms")])])


def _figure(row: dict[str, Any], name: str, pattern: str) -> str:
    value = row.get(name)
    return pattern.format(value) if value is not None else "—"


if __name__ == "__main__":
    sys.exit(main())
