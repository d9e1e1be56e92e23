"""A moving_avg task's round trip on the default deployment, alone and beside a slow neighbour.

Issue K's target: beside a task whose UDF takes 1 s a call, a moving_avg task's round trip (5
points written, one to each of 5 series, their 5 outputs back) stays at p50 <= 20 ms and p99
<= 100 ms, every output correct. Both tasks run as Kapacitor starts them (``udf-agent run``,
relayed to the shared server, real frames over real pipes); the neighbour gets a point for
each of its 10 series every second, so it always has work waiting. The same round trips are
timed alone first, in the same run, as the baseline.

    .venv/bin/python benchmarks/neighbours.py [--trips 200] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.shared_deployment import shared_directory, shared_env  # noqa: E402
from udf_agent import udf_pb2  # noqa: E402
from udf_agent.testing import KapacitorDriver, grouped_point, option  # noqa: E402

SECOND = 1_000_000_000
SERIES = 5
SPARK = ("--master", "local[2]", "--no-local-while-starting")
# Between round trips, as a task fed by a point per series every few ms would be.
PAUSE = 0.02


class RoundTrips:
    """A moving_avg (size 2) task over SERIES series: a round trip writes a point to each
    series and waits for the outputs; ``check`` compares every output with plain moving_avg's."""

    def __init__(self, driver: KapacitorDriver, task_id: str = "steady"):
        self.driver = driver
        self.sent = 0
        self.values: dict[str, list[float]] = {f"s{series}": [] for series in range(SERIES)}
        self._lock = threading.Lock()  # rounds may be sent from a feeding thread
        if not driver.init(option("field", "value"), option("size", 2), task_id=task_id, timeout=120).success:
            raise RuntimeError(f"moving_avg did not start: {driver.log()[-2000:]}")

    def send_round(self) -> None:
        with self._lock:
            for group, values in self.values.items():
                value = float(self.sent % 101)
                values.append(value)
                self.sent += 1
                self.driver.send(udf_pb2.Request(point=grouped_point(self.sent * SECOND, group, value)))

    def trip(self, timeout: float = 180) -> float:
        started = time.monotonic()
        self.send_round()
        self.driver.responses.wait_for("point", self.sent, timeout=timeout)
        return time.monotonic() - started

    def check(self) -> None:
        """Every point has exactly one output, equal to plain moving_avg's, in order per series."""
        outputs = self.driver.responses.of("point")
        if len(outputs) != self.sent:
            raise AssertionError(f"{len(outputs)} outputs for {self.sent} points")
        got: dict[str, list[float]] = {group: [] for group in self.values}
        for output in outputs:
            got[output.tags["group"]].append(output.fieldsDouble["avg"])
        for group, values in self.values.items():
            expected = values[:1] + [(a + b) / 2 for a, b in zip(values, values[1:])]
            if got[group] != expected:
                raise AssertionError(f"series {group}: {got[group][:10]}... != {expected[:10]}...")


class SlowNeighbour:
    """A task whose UDF sleeps ``seconds`` a call, fed a point per series every second."""

    def __init__(self, directory: str, seconds: float, series: int = 10):
        self.driver = KapacitorDriver("run", "benchmarks.heavy_udfs:sleeps", *SPARK, env=shared_env(directory), cwd=REPO)
        if not self.driver.init(option("seconds", seconds), task_id="slow", timeout=120).success:
            raise RuntimeError(f"the slow neighbour did not start: {self.driver.log()[-2000:]}")
        self.series = series
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        tick = 0
        while not self._stop.is_set():
            for series in range(self.series):
                self.driver.send(udf_pb2.Request(point=grouped_point(tick * SECOND, f"n{series}", 1.0)))
            tick += 1
            self._stop.wait(1.0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.driver.kill()


def paced(steady: RoundTrips, trips: int) -> list[float]:
    """``trips`` round trips, PAUSE apart; each one's time."""
    times = []
    for _ in range(trips):
        time.sleep(PAUSE)
        times.append(steady.trip())
    return times


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * share))]


def one_run(trips: int, seconds: float) -> dict[str, float]:
    with shared_directory("nbr-") as directory:
        steady = RoundTrips(KapacitorDriver("run", "moving_avg", *SPARK, env=shared_env(directory), cwd=REPO))
        try:
            for _ in range(20):  # Spark starts, the workers connect, the code is warm
                steady.trip()
            alone = paced(steady, trips)
            steady.check()
            neighbour = SlowNeighbour(directory, seconds)
            try:
                time.sleep(3.0)  # its first micro-batches are computing
                beside = paced(steady, trips)
                neighbour_out = len(neighbour.driver.responses.of("point"))
                steady.check()
            finally:
                neighbour.stop()
        finally:
            steady.driver.kill()
    return {
        "alone_p50_ms": statistics.median(alone) * 1e3,
        "alone_p99_ms": percentile(alone, 0.99) * 1e3,
        "beside_p50_ms": statistics.median(beside) * 1e3,
        "beside_p99_ms": percentile(beside, 0.99) * 1e3,
        "beside_max_ms": max(beside) * 1e3,
        "neighbour_outputs": neighbour_out,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trips", type=int, default=200, help="round trips alone, then as many beside the neighbour")
    parser.add_argument("--seconds", type=float, default=1.0, help="the neighbour's time a call")
    parser.add_argument("--repeat", type=int, default=3, help="runs; the run with the median p50 beside the neighbour is reported")
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "neighbours.json"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    runs = [one_run(args.trips, args.seconds) for _ in range(args.repeat)]
    chosen = sorted(runs, key=lambda run: run["beside_p50_ms"])[(len(runs) - 1) // 2]
    print(f"machine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, Python {platform.python_version()}; load {load:.1f} -> {os.getloadavg()[0]:.1f}")
    print(f"moving_avg round trip (5 points, 5 series), default deployment, {args.trips} trips, median of {args.repeat} runs by p50 beside:")
    print("| moving_avg task | p50 | p99 | max | target |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| alone | {chosen['alone_p50_ms']:.1f} ms | {chosen['alone_p99_ms']:.1f} ms | | |")
    print(f"| beside a UDF taking {args.seconds:g} s a call (10 series, fed every second) | {chosen['beside_p50_ms']:.1f} ms | {chosen['beside_p99_ms']:.1f} ms | {chosen['beside_max_ms']:.1f} ms | p50 <= 20 ms, p99 <= 100 ms |")
    print("every run (p50 / p99 beside, ms): " + ", ".join(f"{run['beside_p50_ms']:.1f} / {run['beside_p99_ms']:.1f}" for run in runs))
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump({"runs": runs, "chosen": chosen, "load": load}, out, indent=2)


if __name__ == "__main__":
    main()
