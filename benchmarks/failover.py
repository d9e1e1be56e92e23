"""The gap a task sees when the shared server dies: three moving_avg tasks on the default
deployment, each fed 100 points/s (5 series) and a keepalive a second, and ``kill -9`` of
the server's whole process group (server, JVM, workers).

For each task: the gap in its outputs (the last output before the kill to the first after),
the longest a keepalive waited for its answer, and whether every point got one output equal
to plain moving_avg's. Issue K's targets: no ErrorResponse, outputs resume within 30 s, no
keepalive waits over 5 s.

    .venv/bin/python benchmarks/failover.py [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.neighbours import SPARK, RoundTrips  # noqa: E402
from benchmarks.shared_deployment import shared_directory, shared_env  # noqa: E402
from udf_agent.serve.shared import shared_server_pids  # noqa: E402
from udf_agent.testing import KapacitorDriver  # noqa: E402

TASKS = 3


class Stream:
    """A started moving_avg task fed a point per series every 50 ms and a keepalive a second;
    the arrival time of each output is noted."""

    def __init__(self, trips: RoundTrips):
        self.trips = trips
        self.arrivals: list[float] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=target, daemon=True) for target in (self._feed, self._keepalives, self._watch)]
        for thread in self._threads:
            thread.start()

    def _feed(self) -> None:
        while not self._stop.wait(0.05):
            self.trips.send_round()

    def _keepalives(self) -> None:
        while not self._stop.wait(1.0):
            self.trips.driver.keepalive(time.time_ns())

    def _watch(self) -> None:
        seen = 0
        while not self._stop.wait(0.01):
            count = len(self.trips.driver.responses.of("point"))
            if count > seen:
                self.arrivals += [time.monotonic()] * (count - seen)
                seen = count

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)


def one_run() -> dict[str, object]:
    with shared_directory("fo-") as directory:
        tasks = [RoundTrips(KapacitorDriver("run", "moving_avg", *SPARK, env=shared_env(directory), cwd=REPO), task_id=f"stream{n}") for n in range(TASKS)]
        try:
            for task in tasks:
                task.trip()  # the first starts the server and Spark
            streams = [Stream(task) for task in tasks]
            time.sleep(12)  # two checkpoints
            (server,) = shared_server_pids(directory)
            killed = time.monotonic()
            os.killpg(server, signal.SIGKILL)
            time.sleep(40)
            for stream in streams:
                stream.stop()
            results = []
            for stream in streams:
                driver = stream.trips.driver
                driver.responses.wait_for("point", stream.trips.sent, timeout=120)
                stream.trips.check()
                before = max((t for t in stream.arrivals if t <= killed), default=killed)
                after = min((t for t in stream.arrivals if t > killed), default=float("inf"))
                results.append({"gap_s": after - before, "keepalive_max_s": max(driver.keepalive_latencies()), "errors": len(driver.responses.of("error"))})
        finally:
            for task in tasks:
                task.driver.kill()
    return {"tasks": results, "gap_max_s": max(r["gap_s"] for r in results), "keepalive_max_s": max(r["keepalive_max_s"] for r in results), "errors": sum(r["errors"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "failover.json"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs = [one_run() for _ in range(args.repeat)]
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python {platform.python_version()}; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"kill -9 of the shared server under {TASKS} moving_avg tasks at 100 points/s each, {args.repeat} runs:")
    print("| figure | median | every run | target |")
    print("| --- | --- | --- | --- |")
    gaps = [float(run["gap_max_s"]) for run in runs]  # type: ignore[arg-type]
    keepalives = [float(run["keepalive_max_s"]) for run in runs]  # type: ignore[arg-type]
    print(f"| longest gap in a task's outputs | {statistics.median(gaps):.1f} s | {', '.join(f'{g:.1f}' for g in gaps)} | <= 30 s |")
    print(f"| longest keepalive wait | {statistics.median(keepalives):.2f} s | {', '.join(f'{k:.2f}' for k in keepalives)} | <= 5 s |")
    print(f"| ErrorResponses | {sum(int(run['errors']) for run in runs)} | | 0 |")  # type: ignore[call-overload]
    print("every point had exactly one output, equal to plain moving_avg's, in every run")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump({"runs": runs, "load": load}, out, indent=2)


if __name__ == "__main__":
    main()
