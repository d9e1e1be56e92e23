"""The benchmark suite itself, on tiny sizes and without Spark (baseline agents and ``udf-agent run mirror`` only)."""

from __future__ import annotations

import io
import json
import os
import sys
import time

import pytest

from benchmarks.driver import run_paced
from benchmarks.framing import point_time, split_frames
from benchmarks.run import PASSTHROUGH, Settings, _median_latency_run, arrival_label, baseline, format_table, ours, run_benchmarks
from benchmarks.workload import MOVING_AVG_OPTIONS, Workload, group_id, group_tags, init_frame
from udf_agent import udf_pb2
from udf_agent.wire.frames import encode_varint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.integration

TINY = Settings(points=2_000, groups=20, new_group_points=2_000, memory_points=(2_000,), time_limit_scale=0.5)


def test_workload_frames_parse_as_kapacitor_points():
    workload = Workload(300, 7)
    data = workload.frames(0, workload.points)
    spans, rest = split_frames(data)
    assert rest == len(data) and len(spans) == workload.points
    assert {end - start for start, end in spans} == {workload.frame_length - 2}
    values = workload.values(0, workload.points)
    for index in (0, 1, 8, 299):
        point = udf_pb2.Request.FromString(data[spans[index][0] : spans[index][1]]).point
        tags = group_tags(index % 7)
        assert point.time == workload.time_of(index)
        assert (point.name, point.database, point.retentionPolicy) == ("cpu", "telegraf", "autogen")
        assert dict(point.tags) == tags and list(point.dimensions) == ["cpu", "host"]
        assert point.group == group_id(tags) == f"cpu={tags['cpu']},host={tags['host']}"
        assert [point.fieldsDouble[name] for name in ("usage_idle", "usage_system", "usage_user")] == list(values[index])
        response = udf_pb2.Response(point=point).SerializeToString()
        assert point_time(response) == point.time


def test_runner_counts_every_point_and_writes_the_report():
    out, progress = io.StringIO(), io.StringIO()
    report = run_benchmarks(TINY, ["limits", "echo", "new_groups"], out=out, progress=progress)
    report = json.loads(json.dumps(report, default=str))

    assert {"schema", "started", "finished", "interrupted", "machine", "settings", "cases", "rows"} <= report.keys()
    assert {"nproc", "cpu_model", "mem_total_mb", "load_average_start", "load_average_end", "python", "pyspark"} <= report["machine"].keys()
    assert list(report["cases"]) == ["limits", "echo", "new_groups"]
    for name in ("echo", "new_groups"):
        case = report["cases"][name]
        assert case["status"] == "ok", case
        for run in case["runs"].values():
            assert run["status"] == "ok", run
            assert run["points_sent"] == run["points_out"] == 2_000
            # Output that arrives in a single read has no steady interval to measure.
            assert run["steady_pps"] is None or run["steady_pps"] > 0
            assert run["total_pps"] > 0 and run["first_output_s"] > 0
            assert run["keepalive"]["unanswered"] == 0
    # Both limits are measured (how they compare is for the benchmark, not a test, to say).
    assert report["cases"]["limits"]["figures"]["framing_pps"] > 0 and report["cases"]["limits"]["figures"]["parse_pps"] > 0
    row_keys = {"case", "figure", "value", "unit", "baseline", "ratio", "goal", "met", "note"}
    assert all(row.keys() == row_keys for row in report["rows"])
    figures = {(row["case"], row["figure"]) for row in report["rows"]}
    # Every throughput row says where its micro-batches ran.
    assert ("echo", f"points/s steady ({PASSTHROUGH})") in figures and ("echo", "keepalive p99 (flat out)") in figures
    assert ("new_groups", "points/s steady vs parse limit") in figures
    printed = out.getvalue()
    assert "machine:" in printed and "load average at end" in printed and "ours/base" in printed
    assert format_table([]).startswith("case")


@pytest.mark.parametrize("burst", [1, 100], ids=["a point at a time", "bursts of 100"])
@pytest.mark.parametrize("command", [ours("mirror", TINY), baseline("echo")], ids=lambda c: c.label)
def test_paced_run_matches_every_output_to_its_input(command, burst):
    workload = Workload(1 + 100 + 400, 20)
    result = run_paced(command, init_frame([]), workload, rate=500, seconds=0.8, warmup_seconds=0.2, time_limit=30, burst=burst)
    assert result.status == "ok", (result.error, result.stderr_tail)
    assert result.points_out == workload.points
    assert result.latency is not None and result.latency.count == 400 and result.latency.unanswered == 0
    assert 0 < result.latency.p50_ms <= result.latency.p99_ms <= result.latency.max_ms


def test_arrival_patterns_are_named_by_their_bursts():
    assert arrival_label(1, 1_000) == "a point every 1 ms"
    assert arrival_label(100, 1_000) == "100 points every 100 ms"
    assert arrival_label(10_000, 1_000) == "10,000 points every 10 s"


def test_repeated_paced_runs_report_the_median_p50_run_and_every_runs_figures():
    from benchmarks.driver import LatencyStats, RunResult

    def run(p50: float, p99: float, status: str = "ok") -> RunResult:
        return RunResult(agent="ours", workload="latency", status=status, latency=LatencyStats(count=10, p50_ms=p50, p99_ms=p99, max_ms=p99))

    runs = [run(4.0, 9.0), run(2.0, 5.0), run(3.0, 30.0), run(1.0, 2.0, status="timeout")]
    median = _median_latency_run(runs)
    # 2, 3, 4 ms and a failure ranked last: the lower middle one is 3 ms.
    assert (median.latency.p50_ms, median.latency.p99_ms) == (3.0, 30.0)
    assert median.repeats_latency_ms == [(4.0, 9.0), (2.0, 5.0), (3.0, 30.0), None]
    assert _median_latency_run([runs[0]]) is runs[0]


def _baseline_moving_avg(frames: bytes) -> list[udf_pb2.Point]:
    from udf_agent.testing import KapacitorDriver, option

    driver = KapacitorDriver.command([sys.executable, os.path.join(REPO, "benchmarks", "baseline_agent.py"), "moving_avg"], cwd=REPO)
    try:
        assert driver.init(*(option(name, value) for name, value in MOVING_AVG_OPTIONS)).success
        driver.send_raw(frames)
        assert driver.close(timeout=30) == 0, driver.log()
    finally:
        driver.kill()
    return driver.responses.of("point")


def _project_moving_avg(frames: bytes) -> list[udf_pb2.Point]:
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.library.builtins import BUILTINS
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines
    from udf_agent.testing import InProcessAgent, option

    # A fresh clone compiles the numba kernels on the first micro-batch (10-20 s on a loaded
    # machine, over 60 s in a slow hour): the default 5 s drain after EOF would drop the output
    # this test compares, and the wait for the end must outlast the drain.
    agent = InProcessAgent(BUILTINS["moving_avg"], Engines(LocalEngine), AgentConfig(drain_timeout=240))
    assert agent.driver.init(*(option(name, value) for name, value in MOVING_AVG_OPTIONS)).success
    agent.driver.send_raw(frames)
    assert agent.finish(timeout=300) == 0
    return agent.driver.responses.of("point")


def _quarters(workload: Workload) -> bytes:
    """The workload's frames with usage_user rounded to quarters, so every window sum is exact in any order."""
    data = workload.frames(0, workload.points)
    spans, _ = split_frames(data)
    out = bytearray()
    for start, end in spans:
        request = udf_pb2.Request.FromString(data[start:end])
        request.point.fieldsDouble["usage_user"] = round(request.point.fieldsDouble["usage_user"] * 4) / 4
        out += encode_varint(request.ByteSize()) + request.SerializeToString()
    return bytes(out)


@pytest.mark.parametrize("exact", [True, False], ids=["quarter-values", "random-values"])
def test_baseline_moving_avg_equals_the_projects(exact):
    workload = Workload(1_000, 13)  # 13 groups: windows both filling up (n < size) and full
    frames = _quarters(workload) if exact else workload.frames(0, workload.points)
    theirs, mine = _baseline_moving_avg(frames), _project_moving_avg(frames)
    assert len(theirs) == len(mine) == workload.points
    assert [point.time for point in theirs] == [workload.time_of(i) for i in range(workload.points)]
    # The project keeps input order within a group, not across groups: compare by time.
    by_time = {point.time: point for point in mine}
    for point in theirs:
        other = by_time[point.time]
        assert list(point.fieldsDouble) == list(other.fieldsDouble) == ["avg"]
        if exact:
            assert point == other
        else:
            # Summation order differs (numpy vs Python's sum): equal up to rounding in the last bits.
            assert point.fieldsDouble["avg"] == pytest.approx(other.fieldsDouble["avg"], rel=1e-12, abs=0)
            point.fieldsDouble["avg"] = other.fieldsDouble["avg"]
            assert point == other


def test_repeated_runs_report_the_median_one_and_keep_every_rate():
    from benchmarks.driver import RunResult
    from benchmarks.run import _median_run

    runs = [RunResult("a", "w", steady_pps=rate) for rate in (300.0, 100.0, 200.0)]
    median = _median_run(runs)
    assert median.steady_pps == 200.0 and median.repeats_steady_pps == [300.0, 100.0, 200.0]
    failed = RunResult("a", "w", status="error", steady_pps=900.0)
    assert _median_run([failed, RunResult("a", "w", steady_pps=100.0)]).status == "error"  # the lower middle: the failure
    assert _median_run(runs[:1]).repeats_steady_pps is None


def test_repeated_runs_pool_their_keepalives_into_one_set_of_figures():
    from benchmarks.driver import LatencyStats, RunResult
    from benchmarks.run import _median_run

    def run(rate: float, latencies_ms: list[float], unanswered: int = 0) -> RunResult:
        result = RunResult("a", "w", steady_pps=rate)
        result.keepalive = LatencyStats.of([value / 1000 for value in latencies_ms], unanswered)
        return result

    # The median-rate run saw no slow answer; the pooled figures still carry the others'.
    runs = [run(300.0, [1.0] * 60 + [50.0]), run(200.0, [2.0] * 100), run(100.0, [3.0] * 39, unanswered=1)]
    median = _median_run(runs)
    assert median.steady_pps == 200.0 and median.keepalive_runs == 3
    k = median.keepalive
    assert (k.count, k.unanswered, k.max_ms) == (200, 1, 50.0)
    assert k.p50_ms == 2.0 and k.p99_ms == 3.0  # nearest rank 198 of 200
    assert _median_run(runs[1:2]).keepalive.max_ms == 2.0 and _median_run(runs[1:2]).keepalive_runs == 1


@pytest.mark.parametrize("command", [baseline("echo"), ours("mirror", TINY)], ids=["baseline", "ours"])
def test_kapacitor_feed_measures_rate_and_the_whole_trees_cpu(command):
    from benchmarks.kapacitor_feed import measure, table

    workload = Workload(points=100_000, groups=100)  # long enough for keepalives and CPU samples
    run = measure(command, workload, init_frame([]), time_limit=60, shared_dir=None, warm_log=None)
    assert run.status == "ok", run.error
    assert run.points == 100_000 and run.points_per_s > 0 and run.seconds > 0
    assert 0 < run.cpu_s < run.seconds * (os.cpu_count() or 1) + 1
    assert run.keepalive.count > 0 and run.keepalive.unanswered == 0
    official = {"status": "ok", "error": "", "points_per_s": 100.0, "cpu_us_per_point": 4.0, "keepalive": {"samples_ms": [1.0]}}
    ours_run = {**official, "points_per_s": 50.0, "cpu_us_per_point": 2.0}
    rows = {row["agent"]: row for row in table({"official moving_avg": [official], "ours": [ours_run]})}
    assert (rows["ours"]["rate_vs_official"], rows["ours"]["cpu_vs_official"]) == (0.5, 0.5)


def test_kapacitor_feed_counts_the_shared_servers_tree_beside_the_task():
    from benchmarks.driver import AgentCommand
    from benchmarks.kapacitor_feed import measure
    from benchmarks.shared_deployment import shared_directory, shared_env

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    workload = Workload(points=100_000, groups=100)
    with shared_directory("kfeed-test-") as shared_dir:
        # Computed in the shared server's own process (no Spark): the relay only copies bytes.
        command = AgentCommand("relayed local_echo", [sys.executable, "-m", "udf_agent", "run", "tests.udfs.sample:local_echo"], cwd=root, env=shared_env(shared_dir))
        run = measure(command, workload, init_frame([]), time_limit=120, shared_dir=shared_dir, warm_log=None)
    assert run.status == "ok", run.error
    assert 0 < run.server_cpu_s < run.cpu_s  # both trees counted
    assert run.server_cpu_s > run.cpu_s - run.server_cpu_s  # the server, which computes, costs more than the relay


def test_kapacitor_harness_reads_the_harness_log_and_gives_mirror_an_init_of_no_options(tmp_path):
    from benchmarks.kapacitor_feed import median_rows
    from benchmarks.kapacitor_harness import RATE, ops_done, without_options

    log = "[   1.764s] op#1 (line 7) init: ok in 1.76s: init 1.76s\n[  26.765s] op#2 (line 8) sleep: ok in 25.00s\n[  40.607s] op#4 (line 10) wait: ok in 0.05s\n"
    assert ops_done(log) == {1: 1.764, 2: 26.765, 4: 40.607}
    found = RATE.search("PASS throughput (40.7s) | init 1.76s; sent 1000000 points in 13.79s (72512/s), 996288 outputs")
    assert found is not None and (found["points"], found["rate"]) == ("1000000", "72512")
    scenario = tmp_path / "s.jsonl"
    scenario.write_text('# a comment\n{"op":"init","options":{"field":"value","size":10}}\n{"op":"sleep","ms":5}\n')
    lines = open(without_options(str(scenario), str(tmp_path))).read().splitlines()
    assert lines == ["# a comment", '{"op": "init", "options": {}}', '{"op":"sleep","ms":5}']
    runs = {
        "official moving_avg -u": [{"status": "ok", "error": "", "points_per_s": 50.0, "cpu_us_per_point": 10.0}],
        "ours": [{"status": "ok", "error": "", "points_per_s": v, "cpu_us_per_point": c} for v, c in ((60.0, 4.0), (90.0, 5.0), (70.0, 7.0))],
    }
    ours = median_rows(runs, ("points_per_s", "cpu_us_per_point"))[1]
    assert (ours["points_per_s"], ours["rate_vs_official"], ours["cpu_vs_official"]) == (70.0, 1.4, 0.5)


def test_kapacitor_harness_splits_a_trees_cpu_by_process_and_tells_each_by_its_command_line():
    from benchmarks.kapacitor_harness import CPUTimeline, role_of

    assert role_of(["/usr/bin/python3", "-m", "pyspark.daemon"]) == "Spark's Python workers"
    assert role_of(["bash", "/venv/pyspark/bin/spark-class", "org.apache.spark.deploy.SparkSubmit"]) == "Spark's JVM"
    assert role_of(["/venv/bin/python", "-m", "udf_agent", "shared-server", "--socket", "s"]) == "shared server"
    assert role_of(["/venv/bin/python", "-u", "moving_avg.py"]) == "the task's process"
    timeline = CPUTimeline(lambda: [os.getpid()])  # pytest itself: "the task's process"

    def sampled_after(moment: float) -> None:  # however late a busy machine runs the sampler
        while not timeline.samples or timeline.samples[-1][0] < moment:
            time.sleep(0.01)

    try:
        start = time.monotonic()
        sampled_after(start)  # the samples nearest ``start`` all came before the spin
        spun_until = time.process_time() + 0.3  # CPU, not wall time: a busy machine spins as long
        while time.process_time() < spun_until:
            pass
        sampled_after(time.monotonic())  # ... and those nearest ``end`` after it
        end = time.monotonic()
    finally:
        timeline.stop()
    used = timeline.by_role(start, end)
    assert list(used) == ["the task's process"]
    assert 0.28 < used["the task's process"] < 0.6  # the 0.3 s spun, read in 10 ms ticks


def test_a_paced_runs_micro_batch_figures_come_from_the_agents_metrics_page():
    """What run.py's latency case reports of the micro-batches: counters of every task on the
    page summed, differences over the window divided as the rows say."""
    import http.server
    import threading

    from benchmarks.driver import micro_batch_figures, scrape_counters

    pages = iter([
        'udf_agent_micro_batches_total{task="t",node="n",udf="moving_avg"} 10.0\n'
        'udf_agent_points_received_total{task="t",node="n",udf="moving_avg"} 40.0\n'
        'udf_agent_compute_seconds_sum{task="t",node="n",udf="moving_avg"} 0.03\n'
        "udf_agent_compute_seconds_count 10.0\n",
        'udf_agent_micro_batches_total{task="t",node="n",udf="moving_avg"} 300.0\n'
        'udf_agent_micro_batches_total{task="u",node="n",udf="moving_avg"} 10.0\n'
        'udf_agent_points_received_total{task="t",node="n",udf="moving_avg"} 1200.0\n'
        'udf_agent_points_received_total{task="u",node="n",udf="moving_avg"} 40.0\n'
        'udf_agent_compute_seconds_sum{task="t",node="n",udf="moving_avg"} 0.9\n'
        'udf_agent_compute_seconds_sum{task="u",node="n",udf="moving_avg"} 0.03\n'
        '# HELP udf_agent_micro_batches_created no\n',
    ])

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            body = next(pages).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        start, end = scrape_counters(url), scrape_counters(url)
    finally:
        server.shutdown()
    assert start[1] == {"udf_agent_micro_batches_total": 10, "udf_agent_points_received_total": 40, "udf_agent_compute_seconds_sum": 0.03}
    figures = micro_batch_figures((0.0, start[1]), (2.0, end[1]))
    assert figures is not None
    assert figures.per_second == pytest.approx(150) and figures.points_each == pytest.approx(4)
    assert figures.compute_ms == pytest.approx(3) and figures.compute_share == pytest.approx(0.45)
    assert micro_batch_figures((0.0, start[1]), (2.0, start[1])) is None  # no micro-batch: no figures


def test_the_path_floor_udf_takes_moving_avgs_init_and_answers_every_point_with_a_zero():
    """run.py's latency case runs it with moving_avg's Init: it must accept it and answer
    every point, or its latency would measure nothing."""
    from test_compute import decode, rich_points, stream_tasks

    from benchmarks.path_floor import zeros
    from udf_agent.compute.contract import Job
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.library.builtins import moving_avg
    from udf_agent.testing import option

    _, bound = zeros.bind([option(name, value) for name, value in MOVING_AVG_OPTIONS])
    assert dict(bound.raw()) == dict(MOVING_AVG_OPTIONS)
    # Frames of the same columns as moving_avg's: the path is the one moving_avg takes.
    assert zeros.frame_columns(bound) == moving_avg.frame_columns(bound) == {"usage_user"}
    points = rich_points(30)
    results = LocalEngine().run(Job(zeros, dict(bound.raw())), stream_tasks(points)).to_pandas()
    out = [response.point for output in results["output"] for response in decode(output)]
    assert len(out) == len(points) and {point.fieldsDouble["avg"] for point in out} == {0.0}


def test_cycle_cpu_reads_every_thread_of_the_agent_and_every_process_below_it():
    """``cycle_cpu`` divides what ``/proc`` says each thread and process spent: each must be
    there, under its own name, with the CPU it burnt."""
    import subprocess
    import threading

    from benchmarks import cycle_cpu

    burn = "import sys, time\nwhile time.process_time() < 0.2: pass\nprint('burnt', flush=True)\ntime.sleep(60)"
    child = subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        taken = cycle_cpu._snapshot(os.getpid())
        assert f"agent thread {threading.get_native_id()}" in taken
        (label,) = [name for name in taken if name.endswith(f"({child.pid})")]
        assert label.startswith(sys.executable[:40]) or "python" in label
        assert sum(taken[label]) >= 0.1  # /proc counts in ticks: half of what it burnt, at least
    finally:
        child.kill()
        child.wait()


def test_cycle_stages_times_each_micro_batch_of_an_agent_from_its_first_read_to_its_write():
    """``cycle_stages`` stamps a real agent (in-process, its engine local) through the methods
    it wraps: every micro-batch has each stage, in order, and the methods are restored after."""
    from benchmarks import cycle_stages
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.library.builtins import moving_avg
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines
    from udf_agent.runtime.runner import MicroBatchRunner
    from udf_agent.testing import InProcessAgent, option

    original = MicroBatchRunner._take
    stamps: list[tuple] = []
    with cycle_stages.stamped(stamps):
        agent = InProcessAgent(moving_avg, Engines(LocalEngine), AgentConfig(flush_interval=0.01))
        assert agent.driver.init(option("field", "v"), option("size", 3)).success
        started = time.monotonic()
        for number in range(20):
            agent.driver.point(time=number, name="m", group=f"g{number % 3}", fieldsDouble={"v": float(number)})
            time.sleep(0.02)  # a micro-batch each, or nearly
        agent.driver.responses.wait_for("point", 20, timeout=60)
        assert agent.finish() == 0
    assert MicroBatchRunner._take is original
    found = cycle_stages.stages(stamps, started)
    batches = len(found["engine"])
    assert batches >= 5, found
    assert all(len(found[stage]) == batches for stage in ("queued", "prepare", "output"))
    assert len(found["gap"]) == len(found["cycle"]) >= batches - 1
    assert len(found["written"]) >= batches - 1  # the last write may be the agent's end
    assert all(value >= 0 for values in found.values() for value in values)
    assert all(cycle >= engine for cycle, engine in zip(found["cycle"], found["engine"][-len(found["cycle"]):]))
    assert "| engine |" in cycle_stages.table(found)


def test_every_choice_of_profile_computes_what_names_a_method_of_the_agent():
    """``--what`` patches the method it names inside the agent: a renamed one would leave the
    profile empty, not fail."""
    import importlib

    from benchmarks import profile_compute

    assert sorted(profile_compute.PROFILED) == ["compute", "read-ahead", "take-in"]
    for module, cls_name, name in profile_compute.PROFILED.values():
        assert callable(getattr(getattr(importlib.import_module(module), cls_name), name)), (cls_name, name)


def test_the_cores_benchmark_measures_from_micro_batch_to_micro_batch():
    from benchmarks.cores import answered_rate

    # Micro-batches of 1,000 outputs answered at 1, 3, 5 and 7 s, sampled every half second: from
    # the first answered at or after 2 s (3 s) to the last (7 s), 2,000 outputs came in 4 s.
    marks = [(t / 2, 1000 * sum(1 for at in (1, 3, 5, 7) if at <= t / 2)) for t in range(17)]
    assert answered_rate(marks, since=2.0) == (500.0, 3)
    with pytest.raises(RuntimeError, match="too few"):
        answered_rate(marks, since=4.0)


def test_the_growth_case_keeps_up_from_when_every_15_s_of_output_keeps_pace_with_its_input():
    from benchmarks.cores import answered_share, kept_up_from, window_rates

    # Fed 100 points/s for 40 s; outputs come at 50/s for 12 s, then at 150/s until caught up
    # (at 24 s), then as fed, but for a stall from 30 to 32 s.
    def outputs(at: float) -> int:
        caught_up = min(50 * min(at, 12) + 150 * max(0.0, at - 12), 100 * at)
        return int(caught_up - 100 * min(2.0, max(0.0, at - 30)))

    marks = [(t / 10, outputs(t / 10)) for t in range(401)]
    sent = [int(100 * t / 10) for t in range(401)]
    windows = window_rates(marks, 40)
    assert windows == [50, 50, 110, 150, 140, 100, 60, 100]
    # 15 s stretches from 0, 5, 10, ... s: 70, 103, 133, 130, 100, 87 points/s. The last, with
    # the stall, falls short of 0.9 x 100; 0.9 x 95 it meets.
    assert kept_up_from(windows, 100) is None
    assert kept_up_from(windows, 95) == 5.0
    assert kept_up_from(windows[:7], 100) == 5.0  # without the stall's last stretch
    assert kept_up_from(windows, 120) is None
    assert answered_share(marks, sent, 10.0) == 0.8
