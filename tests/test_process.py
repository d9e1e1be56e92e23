"""``udf-agent run`` as a real process, driven over real pipes as Kapacitor drives it."""

import json
import os
import re
import statistics
import sys
import threading
import time

import pytest

from udf_agent import udf_pb2
from udf_agent.testing import KapacitorDriver, option, reference_stream
from udf_agent.wire.frames import FrameDecoder, encode_frame

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECOND = 1_000_000_000


def reference_points(driver):
    for point in reference_stream(database="telegraf", retentionPolicy="autogen", tags={"host": "h1"}):
        driver.send(udf_pb2.Request(point=point))


class Keepalives:
    """Sends a KeepaliveRequest every 100 ms, as a strict Kapacitor would."""

    def __init__(self, driver, interval=0.1):
        self.driver = driver
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self):
        while not self._stop.is_set():
            self.sent += 1
            self.driver.keepalive(1_000_000 + self.sent)
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def assert_keepalives_answered(driver, label, report, limit=1.0):
    # Every request had its answer, each within Kapacitor-safe time.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(latency == float("inf") for latency in driver.keepalive_latencies()):
        time.sleep(0.05)
    latencies = sorted(driver.keepalive_latencies())
    assert latencies, "no keepalives were sent"
    p50 = statistics.median(latencies)
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
    report(f"keepalive answers {label}: {len(latencies)} sent every 100 ms, p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms")
    assert latencies[-1] <= limit, f"slowest keepalive answer took {latencies[-1]:.3f} s"


def assert_only_frames(driver, kinds):
    """Everything on stdout parses as whole frames of the expected kinds: no stray byte."""
    decoder = FrameDecoder(udf_pb2.Response)
    responses = decoder.feed(bytes(driver.responses.raw))
    decoder.close()
    assert {r.WhichOneof("message") for r in responses} <= kinds
    assert len(responses) == len(driver.responses.items)


def test_info_is_answered_within_a_second_of_process_start(drivers, report):
    timings = []
    for _ in range(3):
        driver = drivers("run", "moving_avg")
        info = driver.info(timeout=10)
        timings.append(time.monotonic() - driver.started)
        assert info.wants == udf_pb2.STREAM and info.provides == udf_pb2.STREAM
        assert {name: list(o.valueTypes) for name, o in info.options.items()} == {
            "field": [udf_pb2.STRING],
            "size": [udf_pb2.INT],
            "as": [udf_pb2.STRING],
        }
        assert driver.close(timeout=10) == 0
        # Info alone never starts Spark.
        assert "starting Spark" not in driver.log()
    report(f"Info answered {', '.join(f'{t * 1000:.0f} ms' for t in timings)} after process start")
    assert statistics.median(timings) < 1.0


def test_moving_avg_reference_with_keepalives_during_spark_start(drivers, report):
    driver = drivers(
        "run", "moving_avg", "--master", "local[2]", "--resident-slots", "1", "--no-local-while-starting", "--flush-interval", "100ms",
        "--conf", "spark.sql.shuffle.partitions=3",
    )  # fmt: skip
    # Once the process is up, so the figure is about Spark's start-up, not Python's.
    assert driver.info().wants == udf_pb2.STREAM
    with Keepalives(driver):
        init = driver.init(option("field", "value"), option("size", 10), option("as", "mean"))
        assert init.success, init.error
        reference_points(driver)
        # Info is answered at any time, also while Spark starts with points waiting.
        info_started = time.monotonic()
        assert driver.info().provides == udf_pb2.STREAM
        info_during_start = time.monotonic() - info_started
        points = driver.responses.wait_for("point", 24, timeout=180)
    assert driver.close() == 0, driver.log()
    assert "starting Spark" in driver.log()
    assert "Spark conf spark.sql.shuffle.partitions=3" in driver.log()
    assert "1 of 1 resident Spark worker(s) connected" in driver.log()  # --resident-slots, not local[2]'s 2
    assert info_during_start < 1.0
    assert_keepalives_answered(driver, "during Spark start-up", report)

    by_group = {}
    for point in points:
        by_group.setdefault(point.tags["group"], []).append(point)
    for group, expected_at_10 in (("a", 0.9), ("b", 1.9)):
        series = by_group[group]
        assert [p.time for p in series] == [t * SECOND for t in range(12)]
        at_10 = series[10]
        assert at_10.fieldsDouble["mean"] == pytest.approx(expected_at_10, rel=1e-9)
        # The point keeps everything but its fields, which are replaced.
        assert (at_10.name, at_10.database, at_10.retentionPolicy) == ("cpu", "telegraf", "autogen")
        assert list(at_10.dimensions) == ["group"]
        assert dict(at_10.tags) == {"group": group, "host": "h1"}
        assert set(at_10.fieldsDouble) == {"mean"}
        assert not at_10.fieldsInt and not at_10.fieldsString and not at_10.fieldsBool


def test_small_micro_batches_are_answered_before_spark_is_up(drivers, report):
    # By default (embedded Spark) a micro-batch of a few points is computed in the agent:
    # Kapacitor's reference results come back while the JVM is still starting.
    driver = drivers("run", "moving_avg", "--log-level", "debug")
    init = driver.init(option("field", "value"), option("size", 10), option("as", "mean"))
    assert init.success, init.error
    started = time.monotonic()
    reference_points(driver)
    points = driver.responses.wait_for("point", 24, timeout=60)
    elapsed = time.monotonic() - started
    assert driver.close() == 0, driver.log()
    batches = [line for line in driver.log().splitlines() if "micro-batch:" in line]
    assert batches and all(line.endswith("in the agent") for line in batches), batches
    # What start-up built no longer lengthens the full collections that pause the reader.
    assert re.search(r"hot path loaded: \d+ start-up objects kept out of full garbage collections", driver.log()), driver.log()
    report(f"moving_avg, 24 reference points without waiting for Spark: all out {elapsed:.2f} s after the first was sent")
    means = {(p.tags["group"], p.time): p.fieldsDouble["mean"] for p in points}
    assert means[("a", 10 * SECOND)] == pytest.approx(0.9, rel=1e-9)
    assert means[("b", 10 * SECOND)] == pytest.approx(1.9, rel=1e-9)


def test_keepalives_are_answered_during_a_slow_micro_batch(drivers, report):
    driver = drivers("run", "tests.udfs.sample:sleepy", "--master", "local[2]", "--no-local-while-starting", "--flush-interval", "50ms", cwd=ROOT)
    assert driver.info().wants == udf_pb2.STREAM
    with Keepalives(driver):
        assert driver.init(option("seconds", 5.0)).success
        driver.point(time=1, name="m", fieldsDouble={"x": 1.0})
        first = driver.responses.wait_for("point", 1, timeout=180)
        started = time.monotonic()
        driver.point(time=2, name="m", fieldsDouble={"x": 2.0})
        driver.responses.wait_for("point", 2, timeout=60)
        slow_batch = time.monotonic() - started
    assert first[0].fieldsDouble["x"] == 1.0
    assert slow_batch >= 5.0
    assert driver.close() == 0, driver.log()
    assert_keepalives_answered(driver, "during Spark start-up and a 5 s micro-batch", report)
    # The worker's print reached stderr, and stdout held nothing but frames.
    assert "sleepy: about to sleep" in driver.log()
    assert "sample UDF module imported" in driver.log()
    assert_only_frames(driver, {"info", "init", "keepalive", "point"})


def test_a_udf_that_prints_does_not_corrupt_stdout(drivers):
    driver = drivers("run", "tests.udfs.sample:noisy", "--flush-interval", "10ms", cwd=ROOT)
    assert driver.init().success
    for t in range(50):
        driver.point(time=t, name="m", tags={"k": "v"}, fieldsInt={"n": t})
    points = driver.responses.wait_for("point", 50, timeout=30)
    assert driver.close(timeout=30) == 0
    assert [p.fieldsInt["n"] for p in points] == list(range(50))
    assert_only_frames(driver, {"init", "point"})
    log = driver.log()
    for line in ("noisy print from the UDF", "noisy sys.stdout.write", "noisy os.write to fd 1", "sample UDF module imported"):
        assert line in log


def test_eof_mid_stream_loses_no_accepted_point(drivers, report):
    # EOF arrives while Spark is still starting and with a micro-batch open; the drain
    # timeout leaves a cold Spark the time to start.
    driver = drivers("run", "moving_avg", "--master", "local[2]", "--no-local-while-starting", "--flush-interval", "1h", "--no-adaptive-flush", "--max-batch-points", "700", "--drain-timeout", "300s")
    assert driver.init(option("field", "v"), option("size", 3)).success
    for i in range(2_000):
        driver.point(time=i, name="m", group=f"g={i % 7}", dimensions=["g"], tags={"g": str(i % 7)}, fieldsInt={"v": i})
    started = time.monotonic()
    assert driver.close() == 0, driver.log()
    points = driver.responses.of("point")
    assert len(points) == 2_000
    report(f"EOF during Spark start-up: all 2000 points out {time.monotonic() - started:.1f} s after stdin closed")
    last = {}
    for point in points:
        group = point.tags["g"]
        last.setdefault(group, []).append(point.time)
        window = [v for v in last[group][-3:]]
        assert point.fieldsDouble["avg"] == pytest.approx(sum(window) / len(window), rel=1e-9)


def test_eof_flushes_every_buffered_point_without_spark(drivers):
    # Nothing computes until EOF: every point is still buffered when stdin closes.
    driver = drivers("run", "tests.udfs.sample:local_echo", "--flush-interval", "1h", "--no-adaptive-flush", cwd=ROOT)
    assert driver.init().success
    for i in range(10_000):
        driver.point(time=i, name="m", fieldsDouble={"x": i * 0.5}, fieldsBool={"b": i % 2 == 0})
    assert driver.close(timeout=60) == 0
    points = driver.responses.of("point")
    assert [p.time for p in points] == list(range(10_000))
    assert all(p.fieldsBool["b"] == (p.time % 2 == 0) for p in points)
    assert "starting Spark" not in driver.log()


def test_mirror_sends_back_the_bytes_kapacitor_sent_in_arrival_order(drivers):
    driver = drivers("run", "mirror")
    assert driver.init().success
    frames = []
    for i in range(5_000):
        point = udf_pb2.Point(time=i, name="cpu", database="db", retentionPolicy="rp", group=f"host=h{i % 97}",
                              dimensions=["host"], tags={"host": f"h{i % 97}"}, fieldsDouble={"v": i / 7, "nan": float("nan")})
        frames.append(encode_frame(udf_pb2.Request(point=point)))
    driver.send_raw(b"".join(frames))
    assert driver.close(timeout=60) == 0
    init_reply = bytes.fromhex("04 12 02 08 01")
    assert bytes(driver.responses.raw) == init_reply + b"".join(frames)
    assert "starting Spark" not in driver.log()


@pytest.mark.parametrize(
    "garbage, reason",
    [
        (b"\x80" * 11, "malformed varint"),
        (b"\x80\x80\x80\x80\x08", "limit"),
        (b"\x03\xff\xff\xff", "not a valid Request"),
    ],
)
def test_garbage_input_ends_with_an_error_response(drivers, garbage, reason):
    driver = drivers("run", "mirror", "--flush-interval", "1h")
    assert driver.init().success
    driver.point(time=7, name="m", fieldsDouble={"x": 1.0})
    driver.send_raw(garbage)
    errors = driver.responses.wait_for("error", timeout=30)
    code = driver.process.wait(30)
    assert code != 0
    assert reason in errors[0].error
    # The point accepted before the garbage still came out, before the error.
    assert driver.responses.kinds()[-2:] == ["point", "error"]
    assert "Traceback" not in driver.log()


def test_with_log_format_json_every_stderr_line_is_an_object_naming_the_task(drivers):
    driver = drivers("run", "mirror", "--log-format", "json")
    assert driver.init().success
    driver.send_raw(b"\x03\xff\xff\xff")
    assert "not a valid Request" in driver.responses.wait_for("error", timeout=30)[0].error
    assert driver.process.wait(30) == 1
    lines = [json.loads(line) for line in driver.log().splitlines()]
    (error,) = [line for line in lines if line["level"] == "error"]
    assert (error["taskID"], error["nodeID"], error["udf"]) == ("test", "udf1", "mirror")
    assert "protocol error" in error["message"] and error["pid"] == driver.process.pid


def test_bad_options_fail_init_but_keep_the_process(drivers):
    driver = drivers("run", "moving_avg")
    init = driver.init(option("size", 2.0), option("size", 3), option("bogus", "x"))
    assert not init.success
    for fragment in ("'size' must be INT, got DOUBLE", "given 2 times", "unknown option 'bogus'", "missing required option 'field'"):
        assert fragment in init.error
    assert driver.info().wants == udf_pb2.STREAM
    init = driver.init(option("field", "x"), option("size", 0))
    assert not init.success and "must be > 0" in init.error
    assert driver.close(timeout=30) == 0


def test_a_failing_udf_reports_the_group_and_the_exception(drivers):
    driver = drivers("run", "tests.udfs.sample:failing", "--master", "local[2]", "--no-local-while-starting", "--flush-interval", "50ms", cwd=ROOT)
    assert driver.init().success
    driver.point(time=1, name="m", group="host=a", dimensions=["host"], tags={"host": "a"}, fieldsDouble={"x": 1.0})
    error = driver.responses.wait_for("error", timeout=180)[0].error
    assert "failing" in error and "host=a" in error and "ValueError: boom in the UDF" in error
    assert driver.process.wait(60) == 1
    assert "Traceback" in driver.log()


def test_keepalives_are_answered_while_the_udf_module_imports(drivers, report):
    driver = drivers("run", "tests.udfs.slow_import:echo", cwd=ROOT)
    with Keepalives(driver):
        driver.send(udf_pb2.Request(info=udf_pb2.InfoRequest()))
        time.sleep(1.0)
        # The module is still importing: keepalives are answered, Info waits for it.
        assert len(driver.responses.of("keepalive")) >= 5
        assert driver.responses.of("info") == []
        info = driver.responses.wait_for("info", timeout=30)[0]
        assert driver.init().success
        driver.point(time=3, name="m", fieldsDouble={"x": 1.0})
        driver.responses.wait_for("point", timeout=30)
    assert info.wants == udf_pb2.STREAM
    assert driver.close(timeout=30) == 0
    # The first request can only be answered once the interpreter is up (~0.1 s, more under load).
    assert_keepalives_answered(driver, "while the UDF module imports for 2 s", report)


def test_a_malformed_point_is_reported_as_a_protocol_error(drivers):
    # Well-framed, the group readable, but a field inside is not valid protobuf. (mirror
    # forwards points undecoded: it would hand this one back as Kapacitor sent it.)
    driver = drivers("run", "tests.udfs.sample:local_echo", "--flush-interval", "10ms", cwd=ROOT)
    assert driver.init().success
    point = udf_pb2.Point(group="g", name="m").SerializeToString() + b"\x3a\x04\x0a\x05ab"  # a tags entry whose key overruns it
    body = b"\x8a\x01" + bytes([len(point)]) + point
    driver.send_raw(bytes([len(body)]) + body)
    error = driver.responses.wait_for("error", timeout=30)[0].error
    assert error.startswith("protocol error") and "'g'" in error
    assert driver.process.wait(30) == 1


def test_a_snapshot_taken_in_one_process_continues_in_another(drivers):
    first = drivers("run", "tests.udfs.sample:local_counter", "--flush-interval", "10ms", cwd=ROOT)
    assert first.init().success
    for t in range(4):
        first.point(time=t, name="m", group="g=a", dimensions=["g"], tags={"g": "a"}, fieldsDouble={"x": 1.0})
    first.responses.wait_for("point", 4, timeout=30)
    snapshot = first.snapshot(timeout=30)
    assert first.close(timeout=30) == 0

    second = drivers("run", "tests.udfs.sample:local_counter", "--flush-interval", "10ms", cwd=ROOT)
    assert second.init().success
    assert second.restore(snapshot, timeout=30).success
    for t in range(4, 8):
        second.point(time=t, name="m", group="g=a", dimensions=["g"], tags={"g": "a"}, fieldsDouble={"x": 1.0})
    points = second.responses.wait_for("point", 4, timeout=30)
    assert second.close(timeout=30) == 0
    # The UDF's own state (ctx.state) came across: the count goes on from 4.
    assert [p.fieldsInt["count"] for p in first.responses.of("point")] == [1, 2, 3, 4]
    assert [p.fieldsInt["count"] for p in points] == [5, 6, 7, 8]


def test_the_console_script_runs_a_user_module_from_the_working_directory(tmp_path):
    script = os.path.join(os.path.dirname(sys.executable), "udf-agent")
    if not os.path.exists(script):
        pytest.skip("the console script is not installed next to this interpreter")
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mymod.py").write_text(
        "import pandas as pd\n"
        "from udf_agent import Option, stream_udf\n\n"
        "@stream_udf(options=[Option('factor', float)], compute=False)\n"
        "def my_udf(df, ctx):\n"
        "    return pd.DataFrame({'scaled': df['x'] * ctx.options.factor}, index=df.index)\n"
    )
    driver = KapacitorDriver.command([script, "run", "mypkg.mymod:my_udf", "--flush-interval", "10ms"], cwd=str(tmp_path))
    try:
        assert driver.init(option("factor", 3.0)).success
        driver.point(time=1, name="m", fieldsDouble={"x": 2.0})
        (point,) = driver.responses.wait_for("point", 1, timeout=30)
        assert driver.close(timeout=30) == 0
    finally:
        driver.kill()
    assert dict(point.fieldsDouble) == {"scaled": 6.0}


def test_a_protocol_error_behind_a_slow_backlog_is_answered_within_two_seconds(drivers):
    # 40 micro-batches of one point, 0.5 s each: 20 s of backlog when the garbage arrives.
    driver = drivers(
        "run", "tests.udfs.sample:slow_local", "--max-batch-points", "1", "--no-adaptive-flush", "--flush-interval", "1h",
        cwd=ROOT,
    )
    assert driver.init(option("seconds", 0.5)).success
    for t in range(40):
        driver.point(time=t, name="m", group=f"g={t % 4}", dimensions=["g"], tags={"g": str(t % 4)}, fieldsDouble={"x": 1.0})
    sent = time.monotonic()
    driver.send_raw(b"\xff" * 11)  # a frame length beyond any limit
    (error,) = driver.responses.wait_for("error", timeout=30)
    answered = time.monotonic() - sent
    assert "protocol error: frame 42" in error.error
    assert answered < 2.0, answered
    assert driver.process.wait(30) == 1
    # What was computed by then came out first, in order; the rest is counted in the log.
    times = [p.time for p in driver.responses.of("point")]
    assert times == list(range(len(times))) and len(times) < 40
    assert f"{40 - len(times)} accepted point(s) not computed" in driver.log()
    assert "Traceback" not in driver.log()


@pytest.mark.parametrize("udf, expected", [("mirror", 1024 * 1024), ("moving_avg", 256 * 1024)])
def test_the_input_pipe_holds_only_what_the_udf_reads_within_milliseconds(udf, expected):
    """A keepalive request waits behind everything queued unread in the pipe: a computed
    UDF's pipe is kept small, a passthrough one (read several times faster) larger."""
    import fcntl

    from udf_agent.compute.engine import LocalEngine
    from udf_agent.library.builtins import BUILTINS
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.engines import Engines
    from udf_agent.runtime.transports import FdConnection

    agent_reads, kapacitor_writes = os.pipe()
    kapacitor_reads, agent_writes = os.pipe()
    try:
        agent = Agent(BUILTINS[udf], FdConnection(agent_reads, agent_writes), Engines(LocalEngine))
        assert fcntl.fcntl(agent_reads, fcntl.F_GETPIPE_SZ) == expected
        agent.writer.close()  # closes agent_writes
        agent.writer.join()
    finally:
        for fd in (kapacitor_writes, agent_reads, kapacitor_reads):
            os.close(fd)


@pytest.mark.parametrize("option_name, scheme, kind", [("--master", "spark", "Spark master"), ("--remote", "sc", "Spark Connect server")])
def test_an_unreachable_spark_is_one_error_naming_it_and_the_cause_within_seconds(drivers, option_name, scheme, kind):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"{scheme}://127.0.0.1:{probe.getsockname()[1]}"
    driver = drivers("run", "moving_avg", option_name, url)
    started = time.monotonic()
    assert driver.init(option("field", "x"), option("size", 2)).success
    driver.point(time=1, name="m", fieldsDouble={"x": 1.0})
    (error,) = driver.responses.wait_for("error", timeout=60)
    assert time.monotonic() - started < 15
    assert f"cannot reach the {kind} {url}" in error.error and "refused" in error.error, error.error
    assert driver.process.wait(30) == 1
