"""Where a point's wait goes at a trickle: each micro-batch's cycle through the agent cut into
its stages, timed in place while moving_avg on its own Spark takes 1,000 points/s, one point
per write, as ``run.py --cases latency`` feeds it.

    python -m benchmarks.cycle_stages [--udf moving_avg] [--seconds 10] [--repeat 1] [--deployment own|default]

The agent runs with its reads, writes, micro-batches and engine calls stamped (monotonic
clock, a few µs each). For the measured seconds it prints, per micro-batch, p10 / p50 / p90 ms
of:

- **queued**: from the micro-batch's first point read to the compute thread taking it
- **gap**: from the compute thread done with one micro-batch to taking the next (the reader
  left input unread while it computed: the wake-ups and the read in between); negative when
  the next was taken while the one before computed (chained, ``Engine.chain_stream``)
- **prepare**: grouping and packing, up to the engine's call (for a chained one, up to its send)
- **engine**: from the engine's call (or send) to the results in, the resident worker's round
  trip included (for a chained one, its wait behind the one before it too)
- **output**: from the results in to the compute thread done with the micro-batch
- **written**: from the results in to the output's write (by the compute thread when the
  writer is idle, else by the writer thread)
- **cycle**: from one micro-batch done to the next

A point waits about half a cycle for the one under way, then a cycle of its own. cycle_cpu.py
says what CPU each side spends in a cycle; this says where its time goes.

``--deployment default`` times the shared server's side of a relayed task instead: the server a
warm-up task started is replaced by the same command under the stamps, warmed again, and the
tasks relay to it as Kapacitor's would (the relay's own hops are in the p50 and p99 only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import numpy as np

# Inside the agent: how often the new stamps are appended to the trace file.
DUMP_INTERVAL = 0.5
STAGES = ("queued", "gap", "prepare", "engine", "output", "written", "cycle")


@contextmanager
def stamped(stamps: list[tuple[Any, ...]]) -> Iterator[None]:
    """Appends (monotonic time, kind, ...) to ``stamps`` at each read, write, micro-batch taken
    and done, engine call (or chained send) and results in, of every agent in this process; a
    micro-batch's stamps carry its task tables' id, as micro-batches chained overlap. Undone on exit."""
    from spark_backend.engine import SparkEngine
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.runtime.runner import MicroBatchRunner
    from udf_agent.runtime.tasks import BatchTaskTables, StreamTaskTables
    from udf_agent.runtime.transports import FdConnection, SocketConnection

    def stamp(kind: str, *more: Any) -> None:
        stamps.append((time.monotonic(), kind, *more))

    patched: list[tuple[type, str, Any]] = []

    def wrap(cls: type, name: str, make: Any) -> None:
        original = getattr(cls, name)
        setattr(cls, name, make(original))
        patched.append((cls, name, original))

    def around(cls: type, name: str, before: Any, after: Any) -> None:
        def make(original: Any) -> Any:
            def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
                before(self, *args)
                result = original(self, *args, **kwargs)
                after(self, result, *args)
                return result

            return wrapped

        wrap(cls, name, make)

    def none(*_: Any) -> None:
        return None

    def written_now(original: Any) -> Any:
        """``write_now`` stamped as a write when it wrote (the compute thread's own writes)."""

        def wrapped(self: Any, data: bytes) -> bool:
            at = time.monotonic()
            wrote: bool = original(self, data)
            if wrote:
                stamps.append((at, "write"))
            return wrote

        return wrapped

    def taken(original: Any) -> Any:
        def wrapped(self: Any, batch: Any) -> Any:
            at = time.monotonic()
            link = original(self, batch)
            stamps.append((at, "start", id(link.task_tables), batch.opened_at))
            return link

        return wrapped

    # A chained slice is known by the task tables it came from (``single_slice``).
    tables_of: dict[int, int] = {}

    def chained(original: Any) -> Any:
        def wrapped(self: Any, job: Any, tasks: Any, tenant: Any, follow: Any) -> Any:
            def follow_stamped() -> Any:
                following = follow()
                if following is not None and id(following) in tables_of:
                    stamp("ask", tables_of[id(following)])
                return following

            if id(tasks) in tables_of:
                stamp("ask", tables_of[id(tasks)])
            return original(self, job, tasks, tenant, follow_stamped)

        return wrapped

    for cls in (FdConnection, SocketConnection):
        around(cls, "read_into", none, lambda *_: stamp("read"))
        around(cls, "write", lambda *_: stamp("write"), none)
        if hasattr(cls, "write_now"):
            wrap(cls, "write_now", written_now)
    wrap(MicroBatchRunner, "_take", taken)
    around(MicroBatchRunner, "_keep_results", lambda self, job, tasks, task_tables, *_: stamp("answer", id(task_tables)), none)
    around(MicroBatchRunner, "_output", none, lambda self, result, link: stamp("end", id(link.task_tables)))
    around(StreamTaskTables, "single_slice", none, lambda self, result: tables_of.__setitem__(id(result), id(self)) if result is not None else None)
    for tables in (StreamTaskTables, BatchTaskTables):
        around(tables, "run", lambda self, *_: stamp("ask", id(self)), none)
    for engine in (LocalEngine, SparkEngine):
        wrap(engine, "chain_stream", chained)
    try:
        yield
    finally:
        for cls, name, original in reversed(patched):
            setattr(cls, name, original)


def stages(stamps: list[tuple[Any, ...]], since: float) -> dict[str, list[float]]:
    """Each stage's seconds, one per micro-batch taken at ``since`` or later (the first such one
    has no gap or cycle: they reach back to the one before)."""
    found: dict[str, list[float]] = {stage: [] for stage in STAGES}
    last_end: float | None = None
    under_way: dict[int, dict[str, float]] = {}  # by task tables' id: taken, not done
    counted: dict[int, bool] = {}  # done: whether it counts (its output may be written after)
    # The last results in whose output is not written yet: the write may come before or after
    # its micro-batch is done.
    answered: tuple[int, float] | None = None
    for at, kind, *more in stamps:
        if kind == "write":
            if answered is not None:
                key, answer_at = answered
                if key in under_way:
                    under_way[key]["written"] = at - answer_at
                elif counted.get(key):
                    found["written"].append(at - answer_at)
                answered = None
        elif kind == "start":
            under_way[more[0]] = {"start": at, "opened": more[1]}
        elif kind in ("ask", "answer") and more[0] in under_way:
            batch = under_way[more[0]]
            if kind == "ask":
                batch.setdefault("ask", at)  # a micro-batch in several slices: its first call...
            else:
                batch["answered"] = at  # ... and its last results
                answered = (more[0], at)
        elif kind == "end" and more[0] in under_way:
            batch = under_way.pop(more[0])
            counted[more[0]] = batch["start"] >= since and "ask" in batch and "answered" in batch
            if counted[more[0]]:
                found["queued"].append(batch["start"] - batch["opened"])
                found["prepare"].append(batch["ask"] - batch["start"])
                found["engine"].append(batch["answered"] - batch["ask"])
                found["output"].append(at - batch["answered"])
                if "written" in batch:
                    found["written"].append(batch["written"])
                if last_end is not None:
                    found["gap"].append(batch["start"] - last_end)
                    found["cycle"].append(at - last_end)
            last_end = at
    return found


def table(found: dict[str, list[float]]) -> str:
    lines = ["| stage | p10 ms | p50 ms | p90 ms | micro-batches |", "| --- | ---: | ---: | ---: | ---: |"]
    for stage in STAGES:
        values = np.asarray(found[stage]) * 1e3
        if len(values):
            p10, p50, p90 = np.percentile(values, [10, 50, 90])
            lines.append(f"| {stage} | {p10:.3f} | {p50:.3f} | {p90:.3f} | {len(values)} |")
    return "\n".join(lines)


def _stamped_agent(path: str, agent_args: list[str]) -> None:
    """Runs the agent with ``agent_args``, its stamps appended to ``path`` as JSON lines."""
    from udf_agent.entry import main

    stamps: list[tuple[Any, ...]] = []

    def dump() -> None:
        written = 0
        while True:
            time.sleep(DUMP_INTERVAL)
            count = len(stamps)
            with open(path, "a") as out:
                out.writelines(json.dumps(entry) + "\n" for entry in stamps[written:count])
            written = count

    threading.Thread(target=dump, name="stamps-dump", daemon=True).start()
    sys.argv = ["udf-agent", *agent_args]
    with stamped(stamps):
        main()


def read_stamps(path: str) -> list[tuple[Any, ...]]:
    with open(path) as lines:
        return [tuple(json.loads(line)) for line in lines]


def _stamped_shared_server(directory: str, path: str) -> None:
    """Replaces the shared server running in ``directory`` with the same command under the
    stamps (written to ``path``), logging where it logged."""
    from benchmarks.shared_deployment import REPO, kill_shared_servers
    from udf_agent.serve.shared import shared_server_pids

    (pid,) = shared_server_pids(directory)
    with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
        argv = [arg.decode() for arg in cmdline.read().split(b"\0")[:-1]]
    kill_shared_servers(directory)
    (log_name,) = [name for name in os.listdir(directory) if name.endswith(".log")]
    server_args = argv[argv.index("shared-server") :]
    log_path = os.path.join(directory, log_name)
    with open(log_path, "wb") as log:  # emptied: the next warm-up waits for its engine
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.cycle_stages", "--stamped-agent", path, *server_args],
            cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True,
        )
    # Listening before a task looks for it: else the task's relay starts a server of its own.
    deadline = time.monotonic() + 120
    while "listening on" not in open(log_path, errors="replace").read():
        if time.monotonic() > deadline:
            raise RuntimeError("the stamped shared server never listened")
        time.sleep(0.1)


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--stamped-agent":
        _stamped_agent(sys.argv[2], sys.argv[3:])
        return
    from benchmarks.driver import run_paced
    from benchmarks.run import ENGINE_READY_LOG, Settings, ours, shared
    from benchmarks.shared_deployment import shared_directory, warm_shared_server
    from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, init_frame

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--udf", default="moving_avg")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--deployment", choices=["own", "default"], default="own", help="own Spark (default), or relayed to a shared server")
    parser.add_argument("--burst", type=int, default=1, help="points a write comes in, at the same 1,000 points/s (default 1: a trickle)")
    args = parser.parse_args()
    rate, settings = 1_000.0, Settings()
    workload = Workload(1 + int(rate) + int(rate * args.seconds), settings.groups)
    init = init_frame(MOVING_AVG_OPTIONS)
    with ExitStack() as stack:
        directory = stack.enter_context(tempfile.TemporaryDirectory())
        path = os.path.join(directory, "stamps.jsonl")
        if args.deployment == "default":
            shared_dir = stack.enter_context(shared_directory("cycle-stages-"))
            warm_shared_server(args.udf, shared_dir, init)
            _stamped_shared_server(shared_dir, path)
            warm_shared_server(args.udf, shared_dir, init)
            command, warm_log = shared(args.udf, shared_dir), None
        else:
            command = ours(args.udf, settings)
            python, _, _, *agent_args = command.argv  # python -m udf_agent ARGS...
            command = dataclasses.replace(command, argv=[python, "-m", "benchmarks.cycle_stages", "--stamped-agent", path, *agent_args])
            warm_log = ENGINE_READY_LOG
        for run in range(args.repeat):
            result = run_paced(command, init, workload, rate, args.seconds, 1.0, 300, warm_log, None, args.burst)
            if result.latency is None or not os.path.exists(path):
                sys.exit(f"the run failed: {result.status} {result.error or ''}{'' if os.path.exists(path) else '(no stamps)'}")
            time.sleep(2 * DUMP_INTERVAL)  # the last stamps
            stamps = read_stamps(path)
            # The measured points are the last ones: their seconds, back from the last stamp.
            found = stages(stamps, stamps[-1][0] - args.seconds)
            print(f"run {run + 1} ({args.deployment}): p50 {result.latency.p50_ms:.2f} ms, p99 {result.latency.p99_ms:.2f} ms")
            print(table(found))


if __name__ == "__main__":
    main()
