"""cProfile of the agent's compute thread in place: moving_avg on its own Spark fed 1,000
points/s, singly or in bursts (``--burst``), as ``run.py --cases latency`` feeds it, with every micro-batch's
``MicroBatchRunner._compute`` (or, ``--what read-ahead``, every ``Inbox.read_ahead``: the
compute thread reading the input between two micro-batches; ``--what take-in``, every
``Inbox._take_in``: the frames of a read cut and acted on) profiled inside the agent's process.

    python -m benchmarks.profile_compute [--seconds 10] [--burst 1] [--top 40] [--sort cumulative] [--what compute|read-ahead|take-in] [--save PATH]

Prints the run's p50 / p99 and the profile's top functions, and how many calls it covers:
divide a function's time by them for its cost a call (under the profiler, which inflates
Python calls several times). The time in ``recv_into`` is the wait for the resident worker.
``--save`` keeps the profile (``pstats``), e.g. to ask who calls what (``print_callers``).
What the profile of the worker's side looks like in a loop: docs/hot-path.md.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import sys
import tempfile
import threading
import time

# Inside the agent: how often its profile is written out (the agent is killed at the end).
DUMP_INTERVAL = 1.0


# What ``--what`` profiles: the class and method, each call of which is profiled.
PROFILED = {"compute": ("udf_agent.runtime.runner", "MicroBatchRunner", "_compute"), "read-ahead": ("udf_agent.runtime.inbox", "Inbox", "read_ahead"), "take-in": ("udf_agent.runtime.inbox", "Inbox", "_take_in")}


def _profiled_agent(path: str, what: str, agent_args: list[str]) -> None:
    """Runs the agent with ``agent_args``, each call of what ``what`` names profiled into ``path``."""
    import importlib

    from udf_agent.entry import main

    module, cls_name, name = PROFILED[what]
    cls = getattr(importlib.import_module(module), cls_name)
    profile = cProfile.Profile()
    original = getattr(cls, name)

    def profiled(self: object, *args: object) -> object:
        profile.enable()
        try:
            return original(self, *args)
        finally:
            profile.disable()

    setattr(cls, name, profiled)

    def dump() -> None:
        while True:
            time.sleep(DUMP_INTERVAL)
            profile.dump_stats(path)

    threading.Thread(target=dump, name="profile-dump", daemon=True).start()
    sys.argv = ["udf-agent", *agent_args]
    main()


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--profiled-agent":
        _profiled_agent(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    from benchmarks.driver import run_paced
    from benchmarks.run import ENGINE_READY_LOG, Settings, _with_metrics, ours
    from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, init_frame

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--burst", type=int, default=1, help="points a burst, written back to back every burst/1,000 s (default 1: an even trickle)")
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--sort", default="cumulative", choices=["cumulative", "tottime"])
    parser.add_argument("--what", default="compute", choices=sorted(PROFILED), help="what is profiled: each micro-batch, each read between two, or each read's frames acted on")
    parser.add_argument("--save", metavar="PATH", help="keep the profile there (pstats)")
    args = parser.parse_args()
    rate, settings = 1_000.0, Settings()
    workload = Workload(1 + int(rate) + int(rate * args.seconds), settings.groups)
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "compute.prof")
        command, metrics_url = _with_metrics(ours("moving_avg", settings))
        python, _, _, *agent_args = command.argv  # python -m udf_agent ARGS...
        command = dataclasses.replace(command, argv=[python, "-m", "benchmarks.profile_compute", "--profiled-agent", path, args.what, *agent_args])
        result = run_paced(command, init_frame(MOVING_AVG_OPTIONS), workload, rate, args.seconds, 1.0, 300, ENGINE_READY_LOG, metrics_url, args.burst)
        if result.latency is None or not os.path.exists(path):
            sys.exit(f"the run failed: {result.status} {result.error or ''}")
        stats = pstats.Stats(path)
        profiled = PROFILED[args.what][2]
        calls = next((entry[1] for key, entry in stats.stats.items() if key[2] == profiled), 0)  # type: ignore[attr-defined]
        print(f"p50 {result.latency.p50_ms:.2f} ms, p99 {result.latency.p99_ms:.2f} ms; {calls} calls of {profiled} profiled")
        stats.sort_stats(args.sort).print_stats(args.top)
        if args.save:
            stats.dump_stats(args.save)


if __name__ == "__main__":
    main()
