"""Real Spark servers on 127.0.0.1, started from the installed pyspark and stopped at the end
even when a test fails: a standalone cluster (a master and one worker, ``spark-class``) and a
Spark Connect server (``spark-submit`` of its server class). The agent runs as Kapacitor runs
it, ``udf-agent run TARGET --master spark://...`` or ``--remote sc://...``, and its resident
workers are the servers' executors, which connect back to it."""

from __future__ import annotations

import os
import random
import signal
import textwrap
import threading
import time
from pathlib import Path

import pandas as pd
import pytest
from test_compute import TUKEY_VALUES, tukey_batch

from benchmarks.driver import java_descendants
from benchmarks.spark_servers import connect_server, standalone_cluster
from udf_agent.testing import KapacitorDriver, option

# One test process takes them all (pytest -n 2 --dist loadgroup): clusters come and go one at a time.
pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def standalone(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("standalone")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def connect(tmp_path_factory):
    with connect_server(tmp_path_factory.mktemp("connect")) as (url, _):
        yield url


@pytest.fixture(params=["standalone", "connect"])
def agent(request):
    """Starts ``udf-agent run`` against a standalone cluster or a Spark Connect server; every
    agent is killed after the test."""
    url = request.getfixturevalue(request.param)
    where = ["--master", url] if request.param == "standalone" else ["--remote", url]
    started = []

    def start(target: str, cwd: str = ROOT) -> KapacitorDriver:
        driver = KapacitorDriver("run", target, *where, "--flush-interval", "50ms", cwd=cwd)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


def _outputs(driver: KapacitorDriver, count: int, timeout: float = 180) -> list:
    try:
        points = driver.responses.wait_for("point", count, timeout=timeout)
    except AssertionError as exc:  # an ErrorResponse: say it, with the end of the agent's log
        errors = [e.error for e in driver.responses.of("error")]
        raise AssertionError(f"{exc}: {errors}\n{driver.log()[-4000:]}") from None
    if "--remote" in driver.process.args:
        assert not java_descendants(driver.process.pid), "a JVM under an agent computing on Spark Connect"
    return points


def _send_points(driver: KapacitorDriver, rng: random.Random, times: range) -> list[tuple[int, str, float]]:
    """A point at each of ``times`` in one of five groups; what was sent."""
    sent = [(t, f"g{rng.randrange(5)}", rng.uniform(-100, 100)) for t in times]
    for t, group, value in sent:
        driver.point(time=t, name="m", group=f"k={group}", dimensions=["k"], tags={"k": group}, fieldsDouble={"v": value})
    return sent


def _assert_moving_avg(points: list, sent: list[tuple[int, str, float]], size: int) -> None:
    """Every output is the mean of its group's last ``size`` values, as plain pandas computes it."""
    frame = pd.DataFrame(sent, columns=["time", "group", "v"])
    expected = frame.groupby("group")["v"].transform(lambda s: s.rolling(size, min_periods=1).mean())
    assert [p.time for p in points] == list(frame["time"])  # arrival order across groups
    assert [p.fieldsDouble["avg"] for p in points] == pytest.approx(list(expected), rel=1e-12)


def test_moving_avg_on_a_standalone_cluster_matches_plain_pandas(agent):
    driver = agent("moving_avg")
    assert driver.init(option("field", "v"), option("size", 4)).success
    sent = _send_points(driver, random.Random(7), range(300))
    points = _outputs(driver, len(sent))
    assert driver.close(timeout=60) == 0, driver.log()
    _assert_moving_avg(points, sent, 4)
    assert "s: micro-batches run on Spark's resident workers" in driver.log()


def test_outliers_on_a_standalone_cluster_match_the_tukey_fences(agent):
    driver = agent("outliers")
    assert driver.init(option("field", "value")).success
    tukey_batch(driver, group="host=a", tags={"host": "a"}, values=TUKEY_VALUES, tmax=12345)
    driver.responses.wait_for("end", 1, timeout=180)
    assert driver.close(timeout=60) == 0, driver.log()
    values = pd.Series(TUKEY_VALUES, dtype=float)
    q1, q3 = values.quantile(0.25), values.quantile(0.75)
    fences = (q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1))
    got = sorted(p.fieldsDouble["value"] for p in driver.responses.of("point"))
    assert got == sorted(v for v in TUKEY_VALUES if not fences[0] <= v <= fences[1])


def test_a_udf_in_a_file_outside_the_package_reaches_the_executors(agent, tmp_path):
    (tmp_path / "site_udfs.py").write_text(
        textwrap.dedent(
            """
            from udf_agent import Option, stream_udf


            def scaled(values, factor):
                return values * factor


            @stream_udf(options=[Option("factor", float)])
            def scale(df, ctx):
                return df.assign(v=scaled(df["v"], ctx.options["factor"]))[["v"]]
            """
        )
    )
    driver = agent("site_udfs:scale", cwd=str(tmp_path))
    assert driver.init(option("factor", 2.5)).success
    for t in range(10):
        driver.point(time=t, name="m", fieldsDouble={"v": float(t)})
    points = _outputs(driver, 10)
    assert driver.close(timeout=60) == 0, driver.log()
    assert [p.fieldsDouble["v"] for p in points] == [2.5 * t for t in range(10)]
    assert "the UDF's module site_udfs is shipped to Spark's workers with each job" in driver.log()


# ---- sharing the cores: no task starves another ----


class Feeder:
    """Feeds a task a point every 50 ms on a thread, as a busy stream would."""

    def __init__(self, driver: KapacitorDriver):
        self.driver, self.sent, self._stop = driver, 0, threading.Event()
        self._thread = threading.Thread(target=self._feed, daemon=True)
        self._thread.start()

    def _feed(self) -> None:
        while not self._stop.wait(0.05):
            self.driver.point(time=self.sent, name="m", fieldsDouble={"v": float(self.sent)})
            self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _first_output_after_init(driver: KapacitorDriver, timeout: float) -> None:
    """Inits the task and waits up to ``timeout`` s for its first output point (it computes on
    Spark only)."""
    assert driver.init(option("field", "v"), option("size", 2)).success
    driver.point(time=0, name="m", fieldsDouble={"v": 1.0})
    try:
        driver.responses.wait_for("point", 1, timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {[e.error for e in driver.responses.of('error')]}\n{driver.log()[-4000:]}") from None


@pytest.fixture
def tasks(request):
    """Starts moving_avg tasks against a cluster or Connect server, computing on Spark only."""
    started = []

    def start(*where: str) -> KapacitorDriver:
        driver = KapacitorDriver("run", "moving_avg", *where, "--no-local-while-starting", "--flush-interval", "50ms", cwd=ROOT)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


@pytest.mark.parametrize("server", ["standalone", "connect"])
def test_a_second_long_lived_task_computes_while_the_first_keeps_computing(server, tasks, request):
    """A 2-core worker (or a local[2] Connect server): a task's resident workers hold only
    its share of the cores, so a second task gets its first output while the first computes."""
    url = request.getfixturevalue(server)
    where = ("--master", url) if server == "standalone" else ("--remote", url)
    first = tasks(*where)
    _first_output_after_init(first, timeout=120)
    feeder = Feeder(first)
    try:
        second = tasks(*where)
        # Starved, it would never compute: the first task's resident workers would hold every
        # core. The bound only has to outlast a second Spark and an executor starting on a
        # loaded machine.
        _first_output_after_init(second, timeout=120)
        before = len(first.responses.of("point"))
        time.sleep(2)
        assert len(first.responses.of("point")) > before, "the first task stopped computing"
    finally:
        feeder.stop()
    for driver in (first, second):
        assert "resident Spark worker(s) connected" in driver.log(), driver.log()[-3000:]


def test_a_one_core_worker_gives_a_task_its_first_output(tasks, tmp_path):
    """Slots come from the cores the application has (here 1), not from Spark's
    defaultParallelism, which a cluster floors at 2."""
    with standalone_cluster(tmp_path, cores=1) as (url, _):
        driver = tasks("--master", url)
        # Well under the 120 s a task waited for a second slot's core when slots were
        # Spark's defaultParallelism; the first output may come from a Spark job, if its
        # task gets the executor's one core before the resident worker's does.
        _first_output_after_init(driver, timeout=60)
        deadline = time.monotonic() + 60
        while "1 of 1 resident Spark worker(s) connected" not in driver.log():
            assert time.monotonic() < deadline, driver.log()[-3000:]
            time.sleep(0.1)


@pytest.mark.parametrize("server", ["standalone", "connect"])
def test_an_idle_task_gives_its_cores_back(server, tasks, request):
    """Two busy tasks hold both cores (of a 2-core worker, or a local[2] Connect server); the
    one that goes idle releases its resident worker after --resident-idle (on the cluster its
    executor goes back 10 s later), and a third task then gets that core."""
    url = request.getfixturevalue(server)
    where = ("--master", url) if server == "standalone" else ("--remote", url)
    idle = tasks(*where, "--resident-idle", "2s")
    busy = tasks(*where)
    _first_output_after_init(idle, timeout=120)
    _first_output_after_init(busy, timeout=120)
    feeder = Feeder(busy)
    try:
        deadline = time.monotonic() + 30
        while "resident workers released, their cores given back to Spark" not in idle.log():
            assert time.monotonic() < deadline, idle.log()[-3000:]
            time.sleep(0.2)
        third = tasks(*where, "--resident-idle", "2s")  # so that the idle task gets a core back soon
        _first_output_after_init(third, timeout=120)  # starved, it would never compute
        if server == "standalone":
            # No core for it at first: its first micro-batches run as Spark jobs (the first may
            # finish before the worker connects, or be cancelled for it), then on the worker.
            assert "micro-batches run as Spark jobs until one connects" in third.log(), third.log()[-3000:]
            deadline = time.monotonic() + 30
            while "micro-batches run on Spark's resident workers again" not in third.log():
                third.point(time=100, name="m", fieldsDouble={"v": 1.0})
                assert time.monotonic() < deadline, third.log()[-3000:]
                time.sleep(0.5)
        assert "1 of 1 resident Spark worker(s) connected" in third.log()
        # The idle task computes again when points come: its first micro-batch relaunches.
        idle.point(time=10, name="m", fieldsDouble={"v": 3.0})
        idle.responses.wait_for("point", 2, timeout=60)
    finally:
        feeder.stop()


# ---- a Spark Connect session for as long as the task lives ----

# A server that closes a session after 10 s without a request (Spark's default is an hour),
# looking for such sessions every 5 s.
SHORT_SESSIONS = {"spark.connect.session.manager.defaultSessionTimeout": "10s", "spark.connect.session.manager.maintenanceInterval": "5s"}
EXPIRED = "that expired and will be closed"


def _expired(server_log: Path) -> list[str]:
    """The server's log lines about sessions it closed for want of a request."""
    return [line for line in server_log.read_text(errors="replace").splitlines() if EXPIRED in line]


def _wait_until(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout:g} s"
        time.sleep(0.2)


def test_a_task_outlives_its_spark_connect_session_timeout(tmp_path):
    """The task's session is kept alive while the task idles past the server's session timeout
    (a session of the test's own, idle as long, is closed meanwhile); when the server closes
    it anyway (the agent stopped, SIGSTOP, past the timeout), the next micro-batch opens a new
    session, relaunches the resident workers on it and is computed there. The windows go on
    across both: every output is the uninterrupted run's."""
    from pyspark.sql.connect.session import SparkSession

    rng = random.Random(11)
    with connect_server(tmp_path / "server", conf=SHORT_SESSIONS) as (url, _):
        server_log = tmp_path / "server" / "connect.log"
        driver = KapacitorDriver("run", "moving_avg", "--remote", url, "--flush-interval", "50ms", "--resident-idle", "2s", cwd=ROOT)
        try:
            assert driver.init(option("field", "v"), option("size", 4)).success
            sent = _send_points(driver, rng, range(500))
            _outputs(driver, 500)
            _wait_until(lambda: "resident workers released" in driver.log(), "the idle task's workers released")
            # Idle twice past the timeout (the release's last requests come just after its line):
            # a session of the test's own, opened then idle, is closed by the server each time.
            for _ in range(2):
                idle = SparkSession.builder.remote(url).create()
                try:
                    idle.conf.get("spark.sql.session.timeZone")
                    _wait_until(lambda session=idle.session_id: any(session in line for line in _expired(server_log)), "the test's idle session closed by the server")
                finally:
                    idle.stop()
            sent += _send_points(driver, rng, range(500, 1000))
            _outputs(driver, 1000)
            assert len(_expired(server_log)) == 2 and "was lost" not in driver.log(), driver.log()[-4000:]

            _wait_until(lambda: driver.log().count("resident workers released") == 2, "the task's workers released again")
            os.kill(driver.process.pid, signal.SIGSTOP)
            try:
                _wait_until(lambda: len(_expired(server_log)) == 3, "the stopped task's session closed by the server")
            finally:
                os.kill(driver.process.pid, signal.SIGCONT)
            sent += _send_points(driver, rng, range(1000, 1500))
            points = _outputs(driver, 1500)
            log = driver.log()
            assert "INVALID_HANDLE.SESSION_CLOSED" in log and "opening a new one and computing the micro-batch again" in log, log[-4000:]
            assert "a new Spark Connect session after" in log, log[-4000:]
        finally:
            driver.kill()
    _assert_moving_avg(points, sent, 4)


def _compute_across_a_restart(driver: KapacitorDriver, restart, rng: random.Random) -> tuple[list, list[tuple[int, str, float]]]:
    """500 points computed, ``restart`` called, 500 more sent at once: the micro-batch waits
    for the server while Kapacitor's keepalives are answered. The outputs and what was sent."""
    assert driver.init(option("field", "v"), option("size", 4)).success
    sent = _send_points(driver, rng, range(500))
    _outputs(driver, 500)
    _wait_until(lambda: "resident Spark worker(s) connected" in driver.log(), "a resident worker connected")
    restart()
    sent += _send_points(driver, rng, range(500, 1000))
    keepalives, deadline = 0, time.monotonic() + 240
    while len(driver.responses.of("point")) < 1000 and not driver.responses.of("error") and time.monotonic() < deadline:
        keepalives += 1
        driver.keepalive(keepalives)
        # Answered within Kapacitor's default UDF timeout, past which it would kill the task.
        driver.responses.wait_for("keepalive", keepalives, timeout=10)
        time.sleep(0.5)
    assert keepalives > 0
    return _outputs(driver, 1000, timeout=1), sent


def test_a_task_waits_for_its_spark_connect_server_to_restart(tmp_path):
    """The server is killed between micro-batches and started again on its port: the next
    micro-batch waits for it, opens a new session, relaunches the resident workers there and
    is computed; every output is the uninterrupted run's."""
    with connect_server(tmp_path) as (url, daemons):
        driver = KapacitorDriver("run", "moving_avg", "--remote", url, "--flush-interval", "50ms", "--batch-timeout", "180s", cwd=ROOT)
        try:
            points, sent = _compute_across_a_restart(driver, lambda: daemons.restart("connect"), random.Random(13))
            log = driver.log()
        finally:
            driver.kill()
    assert "opening a new one and computing the micro-batch again" in log, log[-4000:]
    _assert_moving_avg(points, sent, 4)


def test_a_task_waits_for_its_standalone_master_to_restart(tmp_path):
    """A master run with a recovery mode, killed between micro-batches and started again,
    takes the task's application back. The worker registers with it again and, told to, kills
    the task's executor; the next micro-batch waits for a new one (its resident worker is
    relaunched there) and is computed; every output is the uninterrupted run's."""
    with standalone_cluster(tmp_path, recovery=True) as (url, daemons):
        driver = KapacitorDriver("run", "moving_avg", "--master", url, "--flush-interval", "50ms", "--batch-timeout", "180s", cwd=ROOT)

        def restart() -> None:
            daemons.restart("master")
            worker_log = tmp_path / "worker0.log"
            _wait_until(lambda: "Asked to kill executor" in worker_log.read_text(errors="replace"), "the task's executor killed after the restart")

        try:
            points, sent = _compute_across_a_restart(driver, restart, random.Random(17))
        finally:
            driver.kill()
    _assert_moving_avg(points, sent, 4)


def test_a_spark_connect_server_gone_past_the_batch_timeout_fails_the_micro_batch_saying_what_was_tried(tmp_path):
    with connect_server(tmp_path) as (url, daemons):
        driver = KapacitorDriver("run", "moving_avg", "--remote", url, "--flush-interval", "50ms", "--batch-timeout", "5s", cwd=ROOT)
        try:
            assert driver.init(option("field", "v"), option("size", 4)).success
            # The first point on a resident worker: as a Spark job it could outlast the 5 s
            # batch timeout on a busy machine, which is not what this test is about.
            _wait_until(lambda: "resident Spark worker(s) connected" in driver.log(), "a resident worker connected")
            driver.point(time=0, name="m", fieldsDouble={"v": 1.0})
            _outputs(driver, 1)
            daemons.stop()
            # Its resident job ended with the server (its worker with it).
            _wait_until(lambda: "resident job of slot 0 ended" in driver.log(), "the resident job's end seen")
            driver.point(time=1, name="m", fieldsDouble={"v": 2.0})
            [error] = driver.responses.wait_for("error", 1, timeout=120)
        finally:
            driver.kill()
    assert f"the Spark Connect session on {url} was lost (cannot reach the Spark Connect server {url}" in error.error, error.error
    assert "Connection refused" in error.error and "--batch-timeout (5 s)" in error.error, error.error
