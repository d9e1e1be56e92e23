"""What each way of deploying the agent costs, measured: memory per task and time to first
output (the default shared Spark per host for N concurrent tasks, a task's own embedded
Spark, ``serve`` sharing one Spark, Spark Connect, a standalone cluster),
and how a compute-heavy batch UDF scales from 1 to 2 executors on a local standalone cluster.

    .venv/bin/python benchmarks/deployment.py [--json PATH]
    .venv/bin/python benchmarks/deployment.py --only-first-answer 7   # a task's first answers

Starts every server it needs from the installed pyspark and stops them on the way out.
Prints a table; the figures are for the machine it runs on (see docs/deployment.md).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.driver import _rss_mb, descendants, java_descendants  # noqa: E402
from benchmarks.spark_servers import connect_server, standalone_cluster  # noqa: E402
from udf_agent import udf_pb2  # noqa: E402
from udf_agent.serve.shared import shared_server_pids  # noqa: E402
from udf_agent.testing import KapacitorDriver, SocketDriver, grouped_point, option  # noqa: E402

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
POINTS = 2_000  # per task: a few micro-batches of moving_avg over 20 groups
READY_LOG = "compute engine ready"
# From process start to the first KeepaliveResponse, on a host with no shared server yet.
FIRST_KEEPALIVE_GOAL_MS = 100


def tree_mb(pid: int) -> float:
    return _rss_mb(pid) + sum(_rss_mb(child) for child in descendants(pid))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(*pids: int) -> float:
    """CPU seconds (user + system) the live processes PIDS have used."""
    return sum(_cpu_by_pid(pids).values())


def _cpu_by_pid(pids: Iterable[int]) -> dict[int, float]:
    found = {}
    for member in pids:
        try:
            with open(f"/proc/{member}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        found[member] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    return found


class TreeCPU:
    """CPU seconds of a process tree over a while, sampled often so that a process that ends
    meanwhile (a resident worker released when idle) still counts what it used."""

    def __init__(self, root: int):
        self._root = root
        self._start = _cpu_by_pid([root, *descendants(root)])
        self._last = dict(self._start)

    def sample(self) -> None:
        self._last.update(_cpu_by_pid([self._root, *descendants(self._root)]))

    def used(self) -> float:
        return sum(self.used_by_pid().values())

    def used_by_pid(self) -> dict[int, float]:
        self.sample()
        return {pid: cpu - self._start.get(pid, 0.0) for pid, cpu in self._last.items()}


def feed_moving_avg(driver: KapacitorDriver | SocketDriver, first: int = 0) -> tuple[float, float]:
    """Init, then POINTS points; seconds from Init to its answer and to the first output point."""
    started = time.monotonic()
    assert driver.init(option("field", "value"), option("size", 10)).success
    answered = time.monotonic() - started
    for i in range(POINTS):
        driver.send(udf_pb2.Request(point=grouped_point(T0 + (first + i) * SECOND, f"h{i % 20}", float(i))))
    driver.responses.wait_for("point", 1, timeout=180)
    first_output = time.monotonic() - started
    driver.responses.wait_for("point", POINTS, timeout=180)
    return answered, first_output


def wait_for_log(read_log: Any, timeout: float = 180) -> float:
    started = time.monotonic()
    while READY_LOG not in read_log():
        if time.monotonic() - started > timeout:
            raise RuntimeError(f"no {READY_LOG!r} within {timeout} s")
        time.sleep(0.1)
    return time.monotonic() - started


def shared_tasks(work: Path, tasks: int, idle_seconds: float) -> dict[str, Any]:
    """The default deployment: TASKS moving_avg process UDFs started one after another, all
    computing on the one shared server the first starts. Memory of every process involved
    (each task's relay, the server, its JVM and workers), time to Info and to first output
    per task, and the CPU of idle tasks (keepalives only, as Kapacitor sends them)."""
    env = {"UDF_AGENT_SHARED_DIR": str(work), "UDF_AGENT_OWN_SPARK": "0"}
    drivers: list[KapacitorDriver] = []
    info_ms, first_output_s, totals_mb = [], [], []

    def total_mb() -> float:
        # The first task started the server, which is its child: a task's own memory is its process's.
        return sum(_rss_mb(driver.process.pid) for driver in drivers) + sum(tree_mb(pid) for pid in shared_server_pids(str(work)))

    try:
        for n in range(tasks):
            driver = KapacitorDriver("run", "moving_avg", env=env, cwd=REPO)
            drivers.append(driver)
            driver.info()
            info_ms.append(round((time.monotonic() - driver.started) * 1000))
            _, first_output = feed_moving_avg(driver, first=n * 10 * POINTS)
            first_output_s.append(round(first_output, 2))
            if n == 0:
                (server,) = shared_server_pids(str(work))
                wait_for_log(lambda: (work / next(p for p in os.listdir(work) if p.endswith(".log"))).read_text(errors="replace"))
            time.sleep(1)
            totals_mb.append(round(total_mb()))
        relays_mb = [round(_rss_mb(driver.process.pid), 1) for driver in drivers]

        def server_log() -> str:
            return (work / next(p for p in os.listdir(work) if p.endswith(".log"))).read_text(errors="replace")

        # Idle as a task is for most of its life: past --resident-idle, its workers released.
        released_after = keep_alive(drivers, lambda: "resident workers released" in server_log(), limit=120)
        relay_cpu = [cpu_s(driver.process.pid) for driver in drivers]
        server_cpu = TreeCPU(server)
        keep_alive(drivers, lambda: False, limit=idle_seconds, sample=server_cpu.sample)
        relay_idle = [(cpu_s(driver.process.pid) - before) / idle_seconds * 100 for driver, before in zip(drivers, relay_cpu)]
        server_idle = server_cpu.used() / idle_seconds * 100
        return {
            "tasks": tasks,
            "info_ms_after_process_start": info_ms,
            "first_output_s": first_output_s,
            "total_mb_after_each_task": totals_mb,
            "per_task_past_first_mb": round((totals_mb[-1] - totals_mb[0]) / (tasks - 1), 1) if tasks > 1 else None,
            "relay_mb": relays_mb,
            "workers_released_after_s": released_after,
            "idle_relay_cpu_percent_of_core_max": round(max(relay_idle), 3),
            "idle_server_cpu_percent_of_core_all_tasks": round(server_idle, 3),
            # A task's whole tree when idle: its relay and its share of the server.
            "idle_cpu_percent_of_core_per_task": round((server_idle + sum(relay_idle)) / tasks, 3),
            "total_mb_after_idle": round(total_mb()),
        }
    finally:
        for driver in drivers:
            driver.kill()
        for pid in shared_server_pids(str(work)):
            os.killpg(pid, 9)


def first_answers(work: Path, repeats: int, command: str) -> dict[str, Any]:
    """On a fresh host (a private shared directory, no server in it), ms from a task's process
    start (``command run moving_avg``, as Kapacitor starts it) to its first KeepaliveResponse
    and to its InfoResponse, both asked at once as Kapacitor asks at its start; then the same
    for a task started with the same command line while that server is up (a remembered
    launch). REPEATS fresh hosts, medians. An editable install (``pip install -e``) starts
    Python ~20 ms later than a regular one: its import hook loads first."""
    from benchmarks.shared_deployment import kill_shared_servers, shared_env  # it imports this module

    fresh_keepalive, fresh_info, again_keepalive, again_info = [], [], [], []
    for n in range(repeats):
        directory = work / f"fresh-{n}"
        directory.mkdir(mode=0o700)
        env = shared_env(str(directory))
        try:
            for keepalives, infos in ((fresh_keepalive, fresh_info), (again_keepalive, again_info)):
                driver = KapacitorDriver.command([command, "run", "moving_avg"], env=env, cwd=REPO)
                try:
                    driver.send(udf_pb2.Request(info=udf_pb2.InfoRequest()))
                    driver.keepalive(1)
                    driver.responses.wait_for("keepalive", 1, timeout=60)
                    keepalives.append(round((driver.responses.keepalive_seen[1] - driver.started) * 1000))
                    driver.responses.wait_for("info", 1, timeout=60)
                    infos.append(round((time.monotonic() - driver.started) * 1000))
                finally:
                    driver.kill()
        finally:
            kill_shared_servers(str(directory))

    return {
        "repeats": repeats,
        "fresh_host_keepalive_ms": fresh_keepalive,
        "fresh_host_info_ms": fresh_info,
        "remembered_launch_keepalive_ms": again_keepalive,
        "remembered_launch_info_ms": again_info,
        "fresh_host_keepalive_ms_median": statistics.median(fresh_keepalive),
        "fresh_host_info_ms_median": statistics.median(fresh_info),
        "remembered_launch_keepalive_ms_median": statistics.median(again_keepalive),
        "remembered_launch_info_ms_median": statistics.median(again_info),
        "goal_fresh_host_keepalive_ms": FIRST_KEEPALIVE_GOAL_MS,
        "command": command,
    }


def keep_alive(drivers: list[KapacitorDriver], done: Any, limit: float, sample: Any = None) -> float | None:
    """Sends each task a keepalive every 5 s (Kapacitor: every timeout / 2) until ``done()``
    or ``limit`` seconds; the seconds it took for ``done()``, None if it never was."""
    started = time.monotonic()
    next_beat = started
    while time.monotonic() - started < limit:
        if done():
            return round(time.monotonic() - started, 1)
        if time.monotonic() >= next_beat:
            for driver in drivers:
                driver.keepalive(int(next_beat))
            next_beat += 5
        time.sleep(0.5)
        if sample is not None:
            sample()
    return None


def process_udf(*where: str) -> dict[str, Any]:
    """One task as a process UDF: Init -> first output, Init -> Spark ready, its process tree."""
    driver = KapacitorDriver("run", "moving_avg", *where, env={"UDF_AGENT_OWN_SPARK": "1"}, cwd=REPO)
    try:
        started = time.monotonic()
        _, first_output = feed_moving_avg(driver)
        wait_for_log(driver.log)
        spark_ready = time.monotonic() - started
        time.sleep(1)  # the task runs on: its memory, warm
        return {
            "first_output_s": round(first_output, 2),
            "spark_ready_s": round(spark_ready, 1),
            "task_tree_mb": round(tree_mb(driver.process.pid)),
            "jvm_in_task": bool(java_descendants(driver.process.pid)),
        }
    finally:
        driver.kill()


def serve_shared(work: Path) -> dict[str, Any]:
    """``serve``: Spark started at listen; Init -> first output per task; memory per extra task."""
    import subprocess

    path = str(work / "udf.sock")
    log_path = work / "serve.log"
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "udf_agent", "serve", "--socket", path, "moving_avg"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
        )
    try:
        warm_after = wait_for_log(lambda: log_path.read_text(errors="replace"))
        idle_mb = tree_mb(server.pid)
        sessions, firsts, trees = [], [], []
        for n in range(2):
            driver = SocketDriver.connect(path)
            sessions.append(driver)
            _, first_output = feed_moving_avg(driver, first=n * 10 * POINTS)
            firsts.append(round(first_output, 2))
            time.sleep(1)
            trees.append(tree_mb(server.pid))
        for driver in sessions:
            driver.close()
        return {
            "server_spark_ready_s": round(warm_after, 1),
            "first_output_s": firsts,
            "server_tree_mb_idle": round(idle_mb),
            "server_tree_mb_with_1_and_2_tasks": [round(mb) for mb in trees],
            "per_extra_task_mb": round(trees[1] - trees[0]),
        }
    finally:
        os.killpg(server.pid, 9)
        server.wait()


def server_tree_mb(daemons: Any) -> float:
    return sum(tree_mb(process.pid) for process in daemons.started)


def batch_frames(batches: int, points: int) -> bytes:
    """``batches`` Kapacitor batches of ``points`` points each, framed once, outside any timing."""
    from udf_agent.wire.frames import encode_frame

    frames = []
    for b in range(batches):
        tags = {"host": f"h{b}"}
        group = f"host=h{b}"
        frames.append(encode_frame(udf_pb2.Request(begin=udf_pb2.BeginBatch(name="cpu", group=group, tags=tags, size=points))))
        for i in range(points):
            point = udf_pb2.Point(time=T0 + i * SECOND, name="cpu", group=group, tags=tags, fieldsDouble={"value": float((i * 7919 + b) % 1000)})
            frames.append(encode_frame(udf_pb2.Request(point=point)))
        frames.append(encode_frame(udf_pb2.Request(end=udf_pb2.EndBatch(name="cpu", group=group, tags=tags, tmax=T0 + points * SECOND))))
    return b"".join(frames)


# One BLAS thread per executor, as Spark deployments set it: else one executor's numpy
# would already use every core and the comparison would measure nothing.
SINGLE_THREADED = [f"--conf=spark.executorEnv.{name}=1" for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")]


def scaling(work: Path, batches: int, points: int, resamples: int, rounds: int = 3) -> dict[str, Any]:
    """The same heavy batch UDF on a standalone cluster of 1 and then 2 one-core workers:
    batches/s of the best of ``rounds`` rounds, each ``batches`` batches sent at once."""
    frames = batch_frames(batches, points)
    results: dict[str, Any] = {}
    for workers in (1, 2):
        with standalone_cluster(work / f"scaling{workers}", workers=workers, cores=1) as (url, _):
            driver = KapacitorDriver(
                "run", "benchmarks.heavy_udfs:trend_fit", "--master", url, "--flush-interval", "50ms", f"--conf=spark.cores.max={workers}", *SINGLE_THREADED, env={"UDF_AGENT_OWN_SPARK": "1"}, cwd=REPO
            )
            try:
                assert driver.init(option("field", "value"), option("resamples", resamples)).success
                wait_for_log(driver.log)
                round_times = []
                for round_number in range(rounds):
                    started = time.monotonic()
                    driver.send_raw(frames)
                    driver.responses.wait_for("point", (round_number + 1) * batches, timeout=600)
                    round_times.append(time.monotonic() - started)
                results[f"{workers}_executor"] = {"batches_per_s": round(batches / min(round_times), 2), "round_s": [round(t, 2) for t in round_times]}
            finally:
                driver.kill()
    one, two = results["1_executor"]["batches_per_s"], results["2_executor"]["batches_per_s"]
    results["speed_up"] = round(two / one, 2)
    results["batch"] = {"batches": batches, "points": points, "resamples": resamples}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=os.path.join(REPO, "benchmarks", "results", "deployment.json"))
    parser.add_argument("--scaling-batches", type=int, default=16)
    parser.add_argument("--scaling-points", type=int, default=5_000)
    parser.add_argument("--scaling-resamples", type=int, default=400, help="least-squares fits per batch: the work per batch")
    parser.add_argument("--only-scaling", action="store_true", help="skip the deployment figures")
    parser.add_argument("--only-shared", action="store_true", help="only the shared Spark per host (the default deployment)")
    parser.add_argument("--only-first-answer", type=int, metavar="REPEATS", help="only the first KeepaliveResponse and Info after process start, on REPEATS fresh hosts and again with the server up")
    parser.add_argument("--tasks", type=int, default=10, help="concurrent tasks on the shared Spark")
    parser.add_argument("--idle-seconds", type=float, default=60, help="how long the idle tasks' CPU is measured")
    parser.add_argument("--command", default=os.path.join(os.path.dirname(sys.executable), "udf-agent"), help="the udf-agent command --only-first-answer starts (default: this Python's)")
    args = parser.parse_args()
    report: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "load_average_start": os.getloadavg()}}
    with tempfile.TemporaryDirectory(prefix="udf-deploy") as tmp:
        work = Path(tmp)
        if args.only_first_answer:
            report["first_answer"] = first_answers(work, args.only_first_answer, args.command)
        elif args.only_scaling:
            report["scaling"] = scaling(work, args.scaling_batches, args.scaling_points, args.scaling_resamples)
        else:
            print(f"shared Spark per host, {args.tasks} tasks ...", file=sys.stderr)
            (work / "shared").mkdir(mode=0o700)
            report["shared"] = shared_tasks(work / "shared", args.tasks, args.idle_seconds)
        if not (args.only_scaling or args.only_shared or args.only_first_answer):
            everything_else(work, report, args)
    report["machine"]["load_average_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as out:
        json.dump(report, out, indent=1)
    print(json.dumps(report, indent=1))
    return 0


def everything_else(work: Path, report: dict[str, Any], args: argparse.Namespace) -> None:
    """Each other deployment, one after another: embedded, serve, Connect, standalone, scaling."""
    print("embedded Spark (process UDF, --own-spark) ...", file=sys.stderr)
    report["embedded"] = process_udf("--own-spark")
    print("serve, one Spark shared ...", file=sys.stderr)
    (work / "serve").mkdir()
    report["serve"] = serve_shared(work / "serve")
    print("Spark Connect ...", file=sys.stderr)
    with connect_server(work / "connect") as (url, daemons):
        report["connect"] = process_udf("--remote", url)
        report["connect"]["server_tree_mb"] = round(server_tree_mb(daemons))
    print("standalone cluster ...", file=sys.stderr)
    with standalone_cluster(work / "standalone") as (url, daemons):
        report["standalone"] = process_udf("--master", url)
        report["standalone"]["cluster_tree_mb"] = round(server_tree_mb(daemons))
    print("scaling: 1 vs 2 executors ...", file=sys.stderr)
    report["scaling"] = scaling(work, args.scaling_batches, args.scaling_points, args.scaling_resamples)


if __name__ == "__main__":
    sys.exit(main())
