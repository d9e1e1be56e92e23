"""What one micro-batch costs at a trickle: the CPU each thread of the agent and each process
under it (its JVM, the resident worker) spends per micro-batch while moving_avg on its own Spark
takes 1,000 points/s, one point per write, as ``run.py --cases latency`` feeds it.

    python -m benchmarks.cycle_cpu [--udf moving_avg] [--seconds 10] [--repeat 2]

Once the agent's metrics count micro-batches flowing (and a second more), ``/proc`` is read
over 5 s: each thread of the agent (user and system time; the busiest one at a trickle is the
compute thread, the next the reader) and each process below it, divided by the micro-batches
the agent's metrics counted in the same window. With the run's p50 / p99 and micro-batches a
second. A cycle is the compute thread's CPU and the worker's, one after the other: what to cut
for a point's wait (docs/hot-path.md).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from dataclasses import dataclass, field

from benchmarks.driver import run_paced, scrape_counters
from benchmarks.run import ENGINE_READY_LOG, Settings, _with_metrics, ours
from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, init_frame

TICKS = os.sysconf("SC_CLK_TCK")
WINDOW_SECONDS = 5.0
# Micro-batches counted before the window opens: the engine is up and the stream steady.
WARM_MICRO_BATCHES = 200


@dataclass
class Window:
    micro_batches: float = 0.0
    seconds: float = 0.0
    cpu: dict[str, tuple[float, float]] = field(default_factory=dict)  # name: (user, system) seconds


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _cpu(path: str) -> tuple[float, float]:
    with open(path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICKS, int(fields[12]) / TICKS


def _command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline") as cmdline:
            return cmdline.read().replace("\0", " ").strip()
    except OSError:
        return "?"


def _label(pid: int) -> str:
    line = _command_line(pid)
    if "java" in line.split(" ", 1)[0]:
        return f"JVM ({pid})"
    if "pyspark.daemon" in line:
        return f"Spark Python worker ({pid})"
    return f"{line[:40]} ({pid})"


def _snapshot(agent: int) -> dict[str, tuple[float, float]]:
    taken: dict[str, tuple[float, float]] = {}
    for thread in os.listdir(f"/proc/{agent}/task"):
        try:
            taken[f"agent thread {thread}"] = _cpu(f"/proc/{agent}/task/{thread}/stat")
        except OSError:
            pass
    pending = _children(agent)
    while pending:
        pid = pending.pop()
        try:
            taken[_label(pid)] = _cpu(f"/proc/{pid}/stat")
        except OSError:
            continue
        pending += _children(pid)
    return taken


def _find_agent(timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for pid in _children(os.getpid()):
            if "udf_agent" in _command_line(pid):
                return pid
        time.sleep(0.05)
    return None


def _measure(metrics_url: str, window: Window) -> None:
    agent = _find_agent(60)
    if agent is None:
        return
    while True:
        try:
            if scrape_counters(metrics_url)[1].get("udf_agent_micro_batches_total", 0) > WARM_MICRO_BATCHES:
                break
        except OSError:
            pass
        time.sleep(0.2)
    time.sleep(1.0)
    started, before, (_, counted_before) = time.monotonic(), _snapshot(agent), scrape_counters(metrics_url)
    time.sleep(WINDOW_SECONDS)
    ended, after, (_, counted_after) = time.monotonic(), _snapshot(agent), scrape_counters(metrics_url)
    window.micro_batches = counted_after["udf_agent_micro_batches_total"] - counted_before["udf_agent_micro_batches_total"]
    window.seconds = ended - started
    for name, (user, system) in after.items():
        was_user, was_system = before.get(name, (0.0, 0.0))
        window.cpu[name] = (user - was_user, system - was_system)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--udf", default="moving_avg")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each paced run")
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    rate = 1_000.0
    settings = Settings()
    workload = Workload(1 + int(rate) + int(rate * args.seconds), settings.groups)
    workload.path()
    print(f"{args.udf} on its own Spark at {rate:,.0f} points/s, {args.seconds:g} s a run, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    for run in range(args.repeat):
        command, metrics_url = _with_metrics(ours(args.udf, settings))
        window = Window()
        measuring = threading.Thread(target=_measure, args=(metrics_url, window), daemon=True)
        measuring.start()
        result = run_paced(command, init_frame(MOVING_AVG_OPTIONS), workload, rate, args.seconds, 1.0, 300, ENGINE_READY_LOG, metrics_url)
        measuring.join(WINDOW_SECONDS + 5)
        latency = result.latency
        if not window.micro_batches or latency is None or latency.p50_ms is None:
            print(f"run {run + 1}: {result.status} {result.error or 'no micro-batches counted'}")
            continue
        per_second = window.micro_batches / window.seconds
        print(f"\nrun {run + 1}: p50 {latency.p50_ms:.2f} ms, p99 {latency.p99_ms:.2f} ms; {per_second:.0f} micro-batches/s")
        print("| thread or process | CPU ms / micro-batch | of it system | share of a CPU |")
        print("| --- | --- | --- | --- |")
        for name, (user, system) in sorted(window.cpu.items(), key=lambda item: -sum(item[1])):
            total = user + system
            if total / window.seconds >= 0.005:
                print(f"| {name} | {total / window.micro_batches * 1e3:.3f} | {system / window.micro_batches * 1e3:.3f} | {total / window.seconds:.1%} |")


if __name__ == "__main__":
    main()
