"""One Spark per host: ``udf-agent run`` tasks relay to a shared server started on first use.

Real processes over real pipes (Kapacitor's side) and a real unix socket (the relay's).
Most tests relay a UDF that never starts Spark (``RELAYED``), so that what is tested is the
sharing itself; one runs moving_avg on the shared Spark. mirror is not relayed: with no Spark
to share, it runs in the task's own process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.driver import java_descendants
from udf_agent import udf_pb2
from udf_agent.runtime.shared import shared_server_pids
from udf_agent.testing import KapacitorDriver, grouped_point, option
from udf_agent.wire.frames import encode_frame

pytestmark = pytest.mark.integration

SECOND = 1_000_000_000
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELAYED = "tests.udfs.sample:local_echo"


@pytest.fixture
def shared_dir():
    """A private directory for this test's shared servers; they are killed afterwards."""
    directory = tempfile.mkdtemp(prefix="uas-")  # short: a socket path has 107 bytes at most
    yield directory
    for pid in shared_server_pids(directory):
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(directory, ignore_errors=True)


def shared_env(directory: str) -> dict[str, str]:
    """The default way: no UDF_AGENT_OWN_SPARK (which the other tests set)."""
    return {"UDF_AGENT_SHARED_DIR": directory, "UDF_AGENT_OWN_SPARK": "0"}


def sockets(directory: str) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.endswith(".sock"))


def echo(driver, t: int, value: float = 1.0) -> udf_pb2.Point:
    # Counted before the point goes out: its answer can arrive before the next line runs.
    expected = len(driver.responses.of("point")) + 1
    driver.point(time=t, name="m", fieldsDouble={"x": value})
    return driver.responses.wait_for("point", expected, timeout=30)[-1]


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_tasks_with_the_same_settings_share_one_server_and_a_task_is_a_light_relay(drivers, shared_dir):
    env = shared_env(shared_dir)
    first, second = drivers("run", RELAYED, env=env, cwd=ROOT), drivers("run", RELAYED, env=env, cwd=ROOT)
    for n, driver in enumerate((first, second)):
        assert driver.init(timeout=60).success, driver.log()
        assert echo(driver, n * SECOND).time == n * SECOND
    (server,) = shared_server_pids(shared_dir)
    assert len(sockets(shared_dir)) == 1
    assert f"computing on the shared Spark server (pid {server})" in first.log()
    for driver in (first, second):
        # The relay imports neither pandas nor numpy: the task costs a few tens of MB.
        assert "numpy" not in maps(driver.process.pid) and "pandas" not in maps(driver.process.pid)
        assert rss_mb(driver.process.pid) < 40
    assert first.close(timeout=30) == 0 and second.close(timeout=30) == 0
    assert not first.responses.of("error") and not second.responses.of("error")
    # The server outlives its tasks, for the next ones.
    assert shared_server_pids(shared_dir) == [server]


def test_other_spark_settings_get_their_own_server(drivers, shared_dir):
    env = shared_env(shared_dir)
    plain = drivers("run", RELAYED, env=env, cwd=ROOT)
    tuned = drivers("run", RELAYED, "--conf", "spark.sql.shuffle.partitions=3", env=env, cwd=ROOT)
    smaller = drivers("run", RELAYED, "--master", "local[1]", env=env, cwd=ROOT)
    for driver in (plain, tuned, smaller):
        assert driver.init(timeout=60).success, driver.log()
    assert len(sockets(shared_dir)) == 3
    assert len(shared_server_pids(shared_dir)) == 3


def test_a_killed_server_fails_its_tasks_at_once_and_the_next_task_starts_a_fresh_one(drivers, shared_dir):
    env = shared_env(shared_dir)
    tasks = [drivers("run", RELAYED, env=env, cwd=ROOT) for _ in range(2)]
    for driver in tasks:
        assert driver.init(timeout=60).success, driver.log()
        echo(driver, 0)
    (server,) = shared_server_pids(shared_dir)
    killed = time.monotonic()
    os.kill(server, signal.SIGKILL)
    for driver in tasks:
        (error,) = driver.responses.wait_for("error", timeout=5)
        assert time.monotonic() - killed < 2.0
        assert f"the shared Spark server (pid {server}) was killed or crashed" in error.error
        assert driver.process.wait(5) == 1
        assert driver.responses.kinds()[-1] == "error"  # the last frame, whole
    fresh = drivers("run", RELAYED, env=env, cwd=ROOT)
    assert fresh.init(timeout=60).success, fresh.log()
    assert echo(fresh, 5 * SECOND).time == 5 * SECOND
    assert shared_server_pids(shared_dir) not in ([], [server])


def imported(driver: KapacitorDriver, module: str) -> bool:
    """Whether a process started with ``-X importtime`` imported ``module``."""
    return re.search(rf"^import time:.*\|\s+{re.escape(module)}$", driver.log(), re.MULTILINE) is not None


@pytest.fixture
def importtime_tasks(shared_dir):
    """Starts ``python -X importtime -m udf_agent ARGS`` tasks (the same command line to
    udf-agent) on the test's shared directory; each is killed after the test."""
    started = []

    def start(*args: str) -> KapacitorDriver:
        driver = KapacitorDriver.command([sys.executable, "-X", "importtime", "-m", "udf_agent", *args], env=shared_env(shared_dir), cwd=ROOT)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


def test_a_task_started_as_an_earlier_one_was_rejoins_its_server_without_parsing_the_command_line(importtime_tasks, shared_dir):
    first = importtime_tasks("run", RELAYED)
    assert first.init(timeout=60).success, first.log()
    assert imported(first, "click")
    (launch,) = [name for name in os.listdir(shared_dir) if name.endswith(".launch")]
    again = importtime_tasks("run", RELAYED)
    assert again.info().wants == udf_pb2.STREAM
    assert again.init(timeout=60).success, again.log()
    assert echo(again, SECOND).time == SECOND
    assert not imported(again, "click"), "a remembered launch went through the command line"
    assert "computing on the shared Spark server" in again.log()
    # Another command line is parsed, and remembered on its own; the server is the same one.
    other = importtime_tasks("run", RELAYED, "--flush-interval", "10ms")
    assert other.init(timeout=60).success, other.log()
    assert imported(other, "click")
    assert len([name for name in os.listdir(shared_dir) if name.endswith(".launch")]) == 2
    assert len(shared_server_pids(shared_dir)) == 1
    assert launch in os.listdir(shared_dir)


def test_a_damaged_launch_record_is_ignored_saying_so_and_rewritten(importtime_tasks, shared_dir):
    first = importtime_tasks("run", RELAYED)
    assert first.init(timeout=60).success, first.log()
    (launch,) = [os.path.join(shared_dir, name) for name in os.listdir(shared_dir) if name.endswith(".launch")]
    with open(launch, "w") as f:
        f.write('{"server": ')
    again = importtime_tasks("run", RELAYED)
    assert again.init(timeout=60).success, again.log()
    assert echo(again, SECOND).time == SECOND
    assert "ignoring the remembered launch for this command line" in again.log()
    assert imported(again, "click")
    with open(launch) as f:
        assert f.read().startswith('{"server": "')


def test_a_task_abort_with_output_unread_ends_the_relay_within_seconds(drivers, shared_dir):
    """Kapacitor's abort: it stops reading the task's output, closes its input and waits for
    the process. The relay drops what no one takes for a second, as the agent's writer does."""
    driver = drivers("run", RELAYED, env=shared_env(shared_dir), cwd=ROOT)
    assert driver.init(timeout=60).success, driver.log()
    point = udf_pb2.Request(point=udf_pb2.Point(time=1, name="m", fieldsDouble={"x": 1.0}))
    driver.send_raw(encode_frame(point) * 200_000)  # megabytes of echoes: every pipe on the way full
    driver.responses.wait_for("point", 1, timeout=30)
    stopped = time.monotonic()
    assert driver.abort(timeout=15) == 0, driver.log()
    assert time.monotonic() - stopped < 5
    assert "(a task abort): the rest of this task's output is dropped" in driver.log()


def test_an_idle_server_exits_by_itself_and_removes_its_socket_and_logs_as_the_task_that_started_it(drivers, shared_dir):
    task = drivers("run", RELAYED, "--shared-idle-exit", "1s", "--log-format", "json", env=shared_env(shared_dir), cwd=ROOT)
    assert task.init(timeout=60).success, task.log()
    time.sleep(1.5)  # a task connected is not idleness, however quiet
    (server,) = shared_server_pids(shared_dir)
    assert echo(task, 0).time == 0
    assert task.close(timeout=30) == 0
    deadline = time.monotonic() + 10
    while shared_server_pids(shared_dir):
        assert time.monotonic() < deadline, "the shared server did not exit after --shared-idle-exit"
        time.sleep(0.1)
    assert sockets(shared_dir) == []
    (log,) = [name for name in os.listdir(shared_dir) if name.endswith(".log")]
    # --log-format json, in the relay's stderr and in the server's log: a JSON object a line.
    server_lines = [json.loads(line) for line in open(os.path.join(shared_dir, log)).read().splitlines()]
    relay_lines = [json.loads(line) for line in task.log().splitlines()]
    assert any("no task for 1 s (--idle-exit): stopping" in line["message"] for line in server_lines)
    (initialised,) = [line for line in server_lines if "initialised" in line["message"]]
    assert (initialised["taskID"], initialised["nodeID"], initialised["udf"], initialised["level"]) == ("test", "udf1", "local_echo", "info")
    assert any("computing on the shared Spark server" in line["message"] for line in relay_lines)
    del server


def test_a_directory_others_may_enter_is_refused_with_the_fix(drivers, shared_dir):
    os.chmod(shared_dir, 0o755)
    task = drivers("run", RELAYED, env=shared_env(shared_dir), cwd=ROOT)
    (error,) = task.responses.wait_for("error", timeout=30)
    assert f"{shared_dir} is open to other users (mode 755); run 'chmod 700 {shared_dir}'" in error.error
    assert task.process.wait(10) == 1
    assert sockets(shared_dir) == []


def test_the_directory_is_created_private(drivers, shared_dir):
    directory = os.path.join(shared_dir, "new")
    task = drivers("run", RELAYED, env=shared_env(directory), cwd=ROOT)
    assert task.init(timeout=60).success, task.log()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(os.path.join(directory, sockets(directory)[0])).st_mode) == 0o600


def test_mirror_which_never_starts_spark_runs_in_the_tasks_own_process(drivers, shared_dir):
    """Relaying it would add a hop, and start a server with its Spark, for nothing to share."""
    task = drivers("run", "mirror", env=shared_env(shared_dir))
    assert task.init(timeout=60).success, task.log()
    assert echo(task, 0).time == 0
    assert os.listdir(shared_dir) == [] and shared_server_pids(shared_dir) == []
    assert "computing on the shared Spark server" not in task.log()
    assert task.close(timeout=30) == 0


def test_the_spark_free_built_ins_run_does_not_relay_are_those_declared_so():
    from udf_agent.cli import SPARK_FREE_BUILTINS
    from udf_agent.library.builtins import BUILTINS

    assert SPARK_FREE_BUILTINS == {name for name, spec in BUILTINS.items() if not spec.compute}


def test_own_spark_keeps_the_task_in_its_own_process(drivers, shared_dir):
    task = drivers("run", "mirror", "--own-spark", env=shared_env(shared_dir))
    assert task.init(timeout=60).success, task.log()
    assert echo(task, 0).time == 0
    assert os.listdir(shared_dir) == [] and shared_server_pids(shared_dir) == []


def test_a_target_the_server_cannot_load_fails_the_task_saying_why(drivers, shared_dir):
    task = drivers("run", "no_such_udf", env=shared_env(shared_dir))
    (error,) = task.responses.wait_for("error", timeout=60)
    assert "'no_such_udf' is neither a built-in" in error.error
    assert task.process.wait(10) == 1


def test_a_redefined_task_runs_the_udf_module_as_edited_since(drivers, shared_dir, tmp_path):
    module = tmp_path / "scaled.py"

    def write(factor: int) -> None:
        module.write_text(textwrap.dedent(f"""
            from udf_agent import stream_udf

            @stream_udf(compute=False)
            def scale(df, ctx):
                return df.assign(x=df["x"] * {factor})
        """))
        os.utime(module, (time.time() + factor, time.time() + factor))  # a new mtime, however fast

    env = shared_env(shared_dir)
    for factor in (2, 3):
        write(factor)
        task = drivers("run", "scaled:scale", env=env, cwd=str(tmp_path))
        assert task.init(timeout=60).success, task.log()
        assert echo(task, 0, value=1.0).fieldsDouble["x"] == factor
        assert task.close(timeout=30) == 0
    assert len(shared_server_pids(shared_dir)) == 1


@pytest.mark.spark
def test_moving_avg_tasks_compute_on_the_one_shared_spark(drivers, shared_dir):
    env = shared_env(shared_dir)
    args = ("run", "moving_avg", "--master", "local[2]", "--no-local-while-starting", "--metrics-address", "127.0.0.1:0")
    for first_time in (0, 100):
        task = drivers(*args, env=env)
        assert task.init(option("field", "value"), option("size", 2), timeout=60).success, task.log()
        for i in range(4):
            task.send(udf_pb2.Request(point=grouped_point((first_time + i) * SECOND, "a", float(i))))
        points = task.responses.wait_for("point", 4, timeout=180)
        assert [p.fieldsDouble["avg"] for p in points] == [0.0, 0.5, 1.5, 2.5]
        if first_time:
            # `udf-agent status` finds the shared server by itself and lists the live task.
            status = subprocess.run([sys.executable, "-m", "udf_agent", "status", "--json"], env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
            assert status.returncode == 0, status.stderr
            ((shown,),) = [server["tasks"] for server in json.loads(status.stdout)]
            assert (shown["udf"], shown["points_in"], shown["points_out"], shown["groups"]) == ("moving_avg", 4, 4, 1)
            assert shown["computed"] == "on Spark's resident workers"
            # The server the first task started serves the metrics that task asked for.
            (log,) = [name for name in os.listdir(shared_dir) if name.endswith(".log")]
            url = re.search(r"metrics at (http://\S+/metrics)", open(os.path.join(shared_dir, log)).read()).group(1)
            with urllib.request.urlopen(url, timeout=10) as answer:
                samples = {(s.name, s.labels.get("udf")): s.value for family in text_string_to_metric_families(answer.read().decode()) for s in family.samples}
            assert samples[("udf_agent_points_received_total", "moving_avg")] == 4 and samples[("udf_agent_micro_batches_total", "moving_avg")] >= 1
            assert samples[("udf_agent_spark_workers_connected", None)] >= 1
        assert task.close(timeout=60) == 0
    (server,) = shared_server_pids(shared_dir)
    assert len(java_descendants(server)) == 1  # one JVM for both tasks
