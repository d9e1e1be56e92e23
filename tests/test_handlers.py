"""Kapacitor's own Python Handler scripts on udf-agent: the scripts in tests/handlers are
written against ``kapacitor.udf.agent`` as Kapacitor's users write them, and run unmodified."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from udf_agent import udf_pb2
from udf_agent.cli import main as cli
from udf_agent.compute.handlers import CHECKPOINT_MAGIC, HandlerHosts, HandlerLog, capture
from udf_agent.runtime.events import Compute, Send, Started
from udf_agent.runtime.session import Session
from udf_agent.targets import TargetError, resolve_target
from udf_agent.testing import KapacitorDriver, SocketDriver, option
from udf_agent.wire.batches import HandlerMicroBatch
from udf_agent.wire.frames import FrameSplitter, encode_frame

HERE = os.path.join(os.path.dirname(__file__), "handlers")
COUNTER = os.path.join(HERE, "counter.py")
BATCH_MEAN = os.path.join(HERE, "batch_mean.py")
BAD_WRITER = os.path.join(HERE, "bad_writer.py")
ECHO_SERVER = os.path.join(HERE, "echo_server.py")
CRASHER = os.path.join(HERE, "crasher.py")
SLEEPY = os.path.join(HERE, "sleepy.py")


def init_frame(*options: udf_pb2.Option) -> bytes:
    return encode_frame(udf_pb2.Request(init=udf_pb2.InitRequest(options=options, taskID="t", nodeID="n")))


def point_frames(*points: tuple[str, int, float], **fields: dict) -> bytes:
    return b"".join(
        encode_frame(udf_pb2.Request(point=udf_pb2.Point(name="cpu", group=group, time=when, fieldsDouble={"value": value}, **fields)))
        for group, when, value in points
    )


def responses(output: bytes) -> list[udf_pb2.Response]:
    return [udf_pb2.Response.FromString(body) for body in FrameSplitter().feed(output)]


def counts(output: bytes) -> list[tuple[str, str, int]]:
    return [(r.point.name, r.point.group, r.point.fieldsInt["count"]) for r in responses(output)]


class Runner:
    """A task's handler fed through the same host code as on a resident worker, in this process."""

    def __init__(self, path: str, hosts: HandlerHosts | None = None):
        self.script = resolve_target(path).handler
        self.hosts = hosts or HandlerHosts()
        self.log = HandlerLog()
        self.now = 0.0

    def feed(self, frames: bytes, init: bytes | None = None, snapshot: bool = False):
        call = self.log.call(self.script, frames, self.now, init=init, force_snapshot=snapshot)
        outcome = self.hosts.call(call, rebuild=call.task not in self.hosts)
        if outcome.error is None:
            self.log.ran(call, outcome, self.now)
        return outcome


# ---- the script, its Info and its handler, without Spark ----


def test_a_scripts_info_is_its_handlers():
    spec = resolve_target(COUNTER)
    assert (spec.name, spec.wants, spec.provides) == ("counter.py", "stream", "stream")
    info = udf_pb2.InfoResponse.FromString(spec.handler.info)
    assert list(info.options) == ["every"] and list(info.options["every"].valueTypes) == [udf_pb2.INT]
    assert resolve_target(BATCH_MEAN).wants == "batch" and resolve_target(BATCH_MEAN).provides == "stream"


def test_each_capture_builds_a_handler_of_its_own():
    script = resolve_target(COUNTER).handler
    first, second = capture(script), capture(script)
    assert first.handler is not second.handler and type(first.handler) is not type(second.handler)  # a namespace each


def test_a_script_that_starts_no_agent_is_refused_saying_so():
    with pytest.raises(TargetError, match="ran to its end without starting an Agent"):
        resolve_target(os.path.join(HERE, "no_agent.py"))
    with pytest.raises(TargetError, match="cannot read the script"):
        resolve_target(os.path.join(HERE, "missing.py"))


def test_requests_reach_the_handler_in_order_and_every_write_comes_back_in_order():
    runner = Runner(COUNTER)
    outcome = runner.feed(init_frame(option("every", 2)), init=init_frame(option("every", 2)))
    assert [r.init.success for r in responses(outcome.output)] == [True]
    assert "counter initialised: every 2" in outcome.printed  # print() is a log line, never output
    outcome = runner.feed(point_frames(("a", 1, 1.0), ("b", 2, 1.0), ("a", 3, 1.0)) + point_frames(("a", 4, 1.0), fieldsInt={"skip": 1}))
    # Two responses for the second point of a group, none for a skipped point.
    assert counts(outcome.output) == [("cpu", "a", 1), ("cpu", "b", 1), ("cpu", "a", 2), ("milestone", "a", 2)]


def test_a_handler_fed_for_long_holds_no_memory_for_the_requests_it_was_fed():
    # One Request reused for the task's life (Kapacitor's agent) keeps ~600 bytes of every point
    # parsed into it (upb frees nothing of a reused message): 180 MB for these 300,000 points.
    runner = Runner(COUNTER)
    runner.feed(init_frame(option("every", 1000)), init=init_frame(option("every", 1000)))
    batch = point_frames(*((f"g{i % 4}", i, 1.0) for i in range(3000)))

    def resident_bytes() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    runner.feed(batch)
    before = resident_bytes()
    for _ in range(100):
        assert runner.feed(batch).error is None
    assert resident_bytes() - before < 60 * 2**20


def test_an_init_the_script_refuses_is_its_own_answer():
    runner = Runner(COUNTER)
    outcome = runner.feed(init_frame(option("every", 0)))
    (reply,) = responses(outcome.output)
    assert (reply.init.success, reply.init.error) == (False, "every must be > 0")


def test_an_exception_in_a_handler_becomes_kapacitors_agents_error_naming_it_after_the_output_before_it():
    runner = Runner(COUNTER)
    runner.feed(init_frame(option("every", 5)))
    outcome = runner.feed(point_frames(("a", 1, 1.0), ("a", 2, -1.0), ("a", 3, 1.0)))
    assert outcome.error.startswith("error processing request of type point: negative value -1.0 [ValueError in point (counter.py:")
    assert counts(outcome.output) == [("cpu", "a", 1)]  # the point before it; none after


def test_a_response_a_handlers_own_thread_writes_goes_out_with_the_next_output():
    import threading

    runner = Runner(COUNTER)
    runner.feed(init_frame(option("every", 5)))
    host = runner.hosts._hosts[runner.log.task]
    late = udf_pb2.Response(point=udf_pb2.Point(name="late", group="a"))
    writer = threading.Thread(target=host.agent.write_response, args=(late,))
    writer.start()
    writer.join()
    outcome = runner.feed(point_frames(("a", 1, 1.0)))
    assert counts(outcome.output) == [("cpu", "a", 1), ("late", "a", 0)] and outcome.written == 2


def test_a_batch_to_stream_handler_gets_batches_in_order():
    runner = Runner(BATCH_MEAN)
    runner.feed(init_frame(option("field", "value")))
    begin = encode_frame(udf_pb2.Request(begin=udf_pb2.BeginBatch(name="cpu", group="g", size=2)))
    end = encode_frame(udf_pb2.Request(end=udf_pb2.EndBatch(name="cpu", group="g", tmax=9, tags={"host": "h"})))
    outcome = runner.feed(begin + point_frames(("g", 1, 1.0), ("g", 2, 4.0)) + end + begin + end)
    (mean,) = responses(outcome.output)  # the empty batch gives nothing
    assert (mean.point.time, dict(mean.point.tags), mean.point.fieldsDouble["mean"]) == (9, {"host": "h"}, 2.5)


@pytest.mark.parametrize(
    ("write", "refusal"),
    [
        ("empty", "empty Response"),
        ("end", "EndBatch with no open BeginBatch"),
        ("negative", "BeginBatch of size -1"),
        ("init", "init response itself"),
    ],
)
def test_what_would_crash_kapacitord_is_refused_and_ends_the_task_saying_why(write, refusal):
    runner = Runner(BAD_WRITER)
    runner.feed(init_frame())
    frame = encode_frame(udf_pb2.Request(point=udf_pb2.Point(name="x", fieldsString={"write": write})))
    outcome = runner.feed(frame)
    assert outcome.output == b"" and refusal in outcome.error
    assert "(bad_writer.py:" in outcome.error  # the script's line that wrote it, not udf-agent's


def test_a_well_formed_batch_written_by_a_handler_passes():
    runner = Runner(BAD_WRITER)
    runner.feed(init_frame())
    outcome = runner.feed(encode_frame(udf_pb2.Request(point=udf_pb2.Point(name="x", fieldsString={"write": "batch"}))))
    assert outcome.error is None and [r.WhichOneof("message") for r in responses(outcome.output)] == ["begin", "end"]


def test_a_handler_rebuilt_elsewhere_from_its_snapshot_and_the_requests_since_goes_on_as_if_never_moved():
    steps = [point_frames(("a", t, 1.0), ("b", t, 1.0)) for t in range(1, 7)]
    whole = Runner(COUNTER)
    whole.feed(init_frame(option("every", 3)), init=init_frame(option("every", 3)))
    expected = [whole.feed(step).output for step in steps]

    moved = Runner(COUNTER)
    moved.feed(init_frame(option("every", 3)), init=init_frame(option("every", 3)))
    got = [moved.feed(steps[0]).output, moved.feed(steps[1], snapshot=True).output, moved.feed(steps[2]).output]
    assert moved.log.snapshot is not None and len(moved.log.replay) == 1  # the snapshot, then one call since
    moved.hosts = HandlerHosts()  # its worker was lost: a new one rebuilds the handler
    got += [moved.feed(step).output for step in steps[3:]]
    assert got == expected

    # A relayed task's checkpoint carries the same rebuild to a new server.
    carried = Runner(COUNTER)
    checkpoint = moved.log.checkpoint()
    assert checkpoint.startswith(CHECKPOINT_MAGIC)
    carried.log.adopt(checkpoint)
    assert counts(carried.feed(point_frames(("a", 7, 1.0))).output) == [("cpu", "a", 7)]


def test_a_handler_without_a_usable_snapshot_is_rebuilt_by_replaying_everything():
    runner = Runner(BATCH_MEAN)  # its snapshot is empty bytes: valid, restores nothing
    runner.feed(init_frame(option("field", "value")), init=init_frame(option("field", "value")))
    assert runner.feed(b"", snapshot=True).snapshot == b""
    counter = Runner(COUNTER)

    def no_snapshot(self):
        return None

    counter.feed(init_frame(option("every", 2)), init=init_frame(option("every", 2)))
    counter.feed(point_frames(("a", 1, 1.0)))
    handler = counter.hosts._hosts[counter.log.task].handler
    type(handler).snapshot = no_snapshot  # this task's class only: each capture has its own
    outcome = counter.feed(point_frames(("a", 2, 1.0)), snapshot=True)
    assert outcome.snapshot is None and "returned None" in outcome.snapshot_problem
    assert not counter.log.snapshots_work and len(counter.log.replay) == 3  # Init and both points
    counter.hosts = HandlerHosts()
    assert counts(counter.feed(point_frames(("a", 3, 1.0))).output) == [("cpu", "a", 3)]


def test_kapacitors_agent_module_has_its_public_names():
    import io

    from kapacitor.udf import udf_pb2 as theirs
    from kapacitor.udf.agent import EOF, Agent, Handler, Server, decodeUvarint32, encodeUvarint

    assert (theirs.STREAM, theirs.BATCH, theirs.STRING) == (udf_pb2.STREAM, udf_pb2.BATCH, udf_pb2.STRING)
    assert theirs.Response().WhichOneof("message") is None and callable(Server) and Handler().info() is None
    stream = io.BytesIO()
    for value in (0, 1, 127, 128, 300, 2**32 - 1):
        encodeUvarint(stream, value)
    stream.seek(0)
    assert [decodeUvarint32(stream) for _ in range(6)] == [0, 1, 127, 128, 300, 2**32 - 1]
    with pytest.raises(EOF):
        decodeUvarint32(stream)
    with pytest.raises(RuntimeError, match="not serving a task"):
        Agent().write_response(theirs.Response())


# ---- the session: every request but keepalives and Info goes to the handler ----


def test_a_scripts_session_sends_every_request_to_its_handler_in_order_cut_anywhere():
    spec = resolve_target(COUNTER)
    stream = b"".join(
        [
            encode_frame(udf_pb2.Request(info=udf_pb2.InfoRequest())),
            init_frame(option("every", 2)),
            point_frames(("a", 1, 1.0)),
            encode_frame(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=5))),
            encode_frame(udf_pb2.Request(begin=udf_pb2.BeginBatch(name="x"))),  # the handler decides (it raises)
            point_frames(("a", 2, 1.0)),
            encode_frame(udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest())),
        ]
    )
    expected_requests = stream[len(encode_frame(udf_pb2.Request(info=udf_pb2.InfoRequest()))) :].replace(
        encode_frame(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=5))), b""
    )
    for cut in [None, *range(1, len(stream))]:
        session = Session(spec, max_batch_points=1000)
        events = []
        for piece in ([stream] if cut is None else [stream[:cut], stream[cut:]]):
            session.receive_data(piece)
            events += session.next_events(0.0)
        events += session.flush()
        batches = [event.batch for event in events if isinstance(event, Compute)]
        assert all(isinstance(batch, HandlerMicroBatch) for batch in batches)
        assert b"".join(batch.frames() for batch in batches) == expected_requests
        assert batches[0].init_frame == init_frame(option("every", 2))  # the Init alone: its answer waits for nothing
        sent = [udf_pb2.Response.FromString(FrameSplitter().feed(event.frame)[0]) for event in events if isinstance(event, Send)]
        assert [r.WhichOneof("message") for r in sent] == ["info", "keepalive"]
        assert sent[0].info.options["every"].valueTypes == [udf_pb2.INT]
        assert [event.reply for event in events if isinstance(event, Started)] == [None]


# ---- the command line ----


def test_info_prints_a_scripts_kapacitor_conf_block():
    done = CliRunner().invoke(cli, ["info", COUNTER, "--kapacitor-conf", "counter"])
    assert done.exit_code == 0, done.output
    assert f'args = ["run", "{COUNTER}"]' in done.output and "@counter().every(10)" in done.output
    assert f'  # args = ["-u", "{COUNTER}"]' in done.output


def test_arguments_after_the_target_are_for_scripts_only():
    done = CliRunner().invoke(cli, ["run", "--own-spark", "mirror", "--", "x"])
    assert done.exit_code == 2 and "for a Kapacitor Handler script" in done.output


def test_a_script_that_would_import_kapacitors_own_agent_is_refused_saying_which(tmp_path):
    theirs = tmp_path / "kapacitor" / "udf"
    theirs.mkdir(parents=True)
    (tmp_path / "kapacitor" / "__init__.py").write_text("")
    (theirs / "__init__.py").write_text("")
    (theirs / "agent.py").write_text("raise SystemExit('Kapacitor agent imported')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "udf_agent", "info", COUNTER], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 2 and f"from {theirs / 'agent.py'}" in done.stderr and "off PYTHONPATH" in done.stderr
    doctor = subprocess.run([sys.executable, "-c", "from udf_agent.tools.doctor import check_kapacitor_agent; print(check_kapacitor_agent())"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert "ok=False" in doctor.stdout and str(theirs / "agent.py") in doctor.stdout


# ---- on Spark: the handler lives on a resident worker ----


@pytest.mark.spark
def test_a_handler_lives_on_a_resident_worker_and_a_lost_worker_is_replaced_and_the_handler_rebuilt(spark_engine, engines):
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.testing import InProcessAgent

    resident = spark_engine.resident
    agent = InProcessAgent(resolve_target(COUNTER), engines, AgentConfig(flush_interval=0.02))
    driver = agent.driver
    assert driver.init(option("every", 3), timeout=120).success
    for when in range(1, 4):
        driver.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
    driver.responses.wait_for("point", 4, timeout=120)
    where = agent.agent.status()["computed"]
    assert where.startswith("on resident worker"), where
    pid = int(where.rsplit("pid ", 1)[1].rstrip(")"))
    losses = resident.worker_losses
    os.kill(pid, signal.SIGKILL)
    for when in range(4, 7):
        driver.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
    points = driver.responses.wait_for("point", 8, timeout=120)
    assert [(p.name, p.fieldsInt["count"]) for p in points] == [("cpu", 1), ("cpu", 2), ("cpu", 3), ("milestone", 3), ("cpu", 4), ("cpu", 5), ("cpu", 6), ("milestone", 6)]
    assert resident.worker_losses == losses + 1 and pid not in resident.worker_pids()
    assert agent.finish(60) == 0


@pytest.mark.spark
def test_a_handler_that_kills_its_worker_costs_a_neighbouring_scripts_task_nothing(spark_engine, engines):
    """Both tasks' handlers live on the host's two resident workers; the crashing one kills
    the one it runs on, then (retried there) the other: whichever held the neighbour's
    handler, the neighbour goes on counting, rebuilt from its snapshot, every output once."""
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.testing import InProcessAgent

    resident = spark_engine.resident
    steady = InProcessAgent(resolve_target(COUNTER), engines, AgentConfig(flush_interval=0.02))
    assert steady.driver.init(option("every", 1000), timeout=120).success
    sent = 0

    def steady_point() -> None:
        nonlocal sent
        sent += 1
        steady.driver.point(name="cpu", group="a", time=sent, fieldsDouble={"value": 1.0})
        steady.driver.responses.wait_for("point", sent, timeout=120)

    for _ in range(3):
        steady_point()
    losses = resident.worker_losses
    crashing = InProcessAgent(resolve_target(CRASHER), engines, AgentConfig(flush_interval=0.02))
    assert crashing.driver.init(timeout=120).success
    crashing.driver.point(name="cpu", group="c", time=1, fieldsDouble={"value": 1.0})
    deadline = time.monotonic() + 120
    while not crashing.driver.responses.of("error"):
        assert time.monotonic() < deadline, "the crashing task did not end within 120 s"
        steady_point()
    (error,) = crashing.driver.responses.of("error")
    assert "crasher.py: its handler's requests failed twice on Spark's resident workers" in error.error, error.error
    assert resident.worker_losses == losses + 2
    for _ in range(3):
        steady_point()
    assert [p.fieldsInt["count"] for p in steady.driver.responses.of("point")] == list(range(1, sent + 1))
    assert not steady.driver.responses.of("error")
    assert steady.finish(60) == 0
    crashing.finish(60)
    assert resident.wait_for_workers(2, timeout=120)  # the next tests find both slots back


@pytest.mark.spark
def test_a_slow_handler_holds_up_no_neighbouring_scripts_task_their_handlers_living_on_different_workers(engines):
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.testing import InProcessAgent

    steady = InProcessAgent(resolve_target(COUNTER), engines, AgentConfig(flush_interval=0.02))
    assert steady.driver.init(option("every", 1000), timeout=120).success
    steady.driver.point(name="cpu", group="a", time=1, fieldsDouble={"value": 1.0})
    steady.driver.responses.wait_for("point", 1, timeout=120)
    slow = InProcessAgent(resolve_target(SLEEPY), engines, AgentConfig(flush_interval=0.02))
    assert slow.driver.init(option("seconds", 3.0), timeout=120).success
    for when in range(1, 4):  # one call of 9 s
        slow.driver.point(name="cpu", group="s", time=when, fieldsDouble={"value": 1.0})
    deadline = time.monotonic() + 60
    while slow.agent.status()["slots_held"] != 1:
        assert time.monotonic() < deadline, "the slow handler never started computing"
        time.sleep(0.05)
    trips = []
    for when in range(2, 7):
        started = time.monotonic()
        steady.driver.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
        steady.driver.responses.wait_for("point", when, timeout=120)
        trips.append(time.monotonic() - started)
    assert len(slow.driver.responses.of("point")) == 0, "the slow call ended before the neighbour's round trips did: they show nothing"
    # Each handler lives on a worker of its own: the neighbour's calls never waited for the 9 s one.
    assert max(trips) < 2.0, trips
    assert steady.agent.status()["computed"] != slow.agent.status()["computed"]
    slow.driver.responses.wait_for("point", 3, timeout=60)
    assert steady.finish(60) == 0 and slow.finish(60) == 0


@pytest.mark.spark
def test_an_exception_in_a_handler_on_spark_ends_the_task_with_its_error(engines):
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.testing import InProcessAgent

    agent = InProcessAgent(resolve_target(COUNTER), engines, AgentConfig(flush_interval=0.02))
    assert agent.driver.init(option("every", 3), timeout=120).success
    agent.driver.point(name="cpu", group="a", time=1, fieldsDouble={"value": -2.0})
    (error,) = agent.driver.responses.wait_for("error", 1, timeout=120)
    assert error.error.startswith("error processing request of type point: negative value -2.0 [ValueError in point (counter.py:")
    assert agent.finish(60) == 1


# ---- unmodified, as Kapacitor starts them: python -u script.py, and a socket Server script ----


@pytest.mark.integration
def test_python_u_script_runs_unmodified_on_the_shared_server_and_its_snapshot_restores_in_a_new_process(tmp_path):
    env = {"UDF_AGENT_OWN_SPARK": "0"}
    first = KapacitorDriver.command([sys.executable, "-u", COUNTER], env=env, cwd=str(tmp_path))
    try:
        assert list(first.info(timeout=60).options) == ["every"]
        assert first.init(option("every", 2), timeout=180).success
        for when in range(1, 4):
            first.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
        first.responses.wait_for("point", 4, timeout=120)
        status = subprocess.run([sys.executable, "-m", "udf_agent", "status", "--json"], capture_output=True, text=True, timeout=60)
        (task,) = [task for server in json.loads(status.stdout) for task in server["tasks"] if task["udf"] == "counter.py"]
        assert task["computed"].startswith("on resident worker") and (task["points_in"], task["points_out"]) == (4, 5)  # Init included
        snapshot = first.snapshot()
        assert json.loads(snapshot) == {"a": 3}
        assert first.close(60) == 0
        assert "counter initialised: every 2" in first.log()  # the handler's print(), on the task's stderr
        assert len(first.responses.raw) and all(r.WhichOneof("message") for r in first.responses.items)
    finally:
        first.kill()
    # udf-agent's own options for a script started as python -u: UDF_AGENT_RUN_OPTIONS.
    second = KapacitorDriver.command([sys.executable, "-u", COUNTER], env={**env, "UDF_AGENT_RUN_OPTIONS": "--log-format json"}, cwd=str(tmp_path))
    try:
        assert second.init(option("every", 2), timeout=120).success
        assert second.restore(snapshot).success
        second.point(name="cpu", group="a", time=4, fieldsDouble={"value": 1.0})
        points = second.responses.wait_for("point", 2, timeout=120)
        assert [(p.name, p.fieldsInt["count"]) for p in points] == [("cpu", 4), ("milestone", 4)]
        assert second.close(60) == 0
        records = [json.loads(line) for line in second.log().splitlines() if line.startswith("{")]
        assert any("computing on the shared Spark server" in record["message"] for record in records), second.log()
    finally:
        second.kill()


@pytest.mark.integration
def test_a_scripts_handler_keeps_its_state_when_the_shared_server_dies(tmp_path):
    from udf_agent.serve.shared import shared_server_pids

    driver = KapacitorDriver.command([sys.executable, "-u", COUNTER], env={"UDF_AGENT_OWN_SPARK": "0"}, cwd=str(tmp_path))
    try:
        assert driver.init(option("every", 100), timeout=180).success
        for when in range(1, 4):
            driver.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
        driver.responses.wait_for("point", 3, timeout=120)
        time.sleep(6)  # a checkpoint is taken after the next read, 5 s on
        driver.point(name="cpu", group="a", time=4, fieldsDouble={"value": 1.0})
        driver.responses.wait_for("point", 4, timeout=120)
        for pid in shared_server_pids(os.environ["UDF_AGENT_SHARED_DIR"]):
            os.killpg(pid, signal.SIGKILL)  # the server, its JVM and the worker the handler lived on
        for when in range(5, 7):
            driver.point(name="cpu", group="a", time=when, fieldsDouble={"value": 1.0})
        points = driver.responses.wait_for("point", 6, timeout=180)
        assert [(p.time, p.fieldsInt["count"]) for p in points] == [(t, t) for t in range(1, 7)]  # each once, counts carried over
        assert driver.close(60) == 0
        assert "carried over to the shared Spark server" in driver.log()
    finally:
        driver.kill()


@pytest.mark.integration
def test_a_socket_server_script_serves_its_socket_each_connection_a_task(tmp_path):
    path = str(tmp_path / "echo.sock")
    # SIGINT as a terminal sends it: a run in the background (nohup, CI) would pass it on ignored.
    server = subprocess.Popen(
        [sys.executable, ECHO_SERVER, path], env={**os.environ, "UDF_AGENT_OWN_SPARK": "0"}, cwd=str(tmp_path),
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        for connection in range(2):
            driver = SocketDriver.connect(path, timeout=30)
            assert driver.init(timeout=180).success
            driver.point(name="cpu", group="a", time=connection, fieldsDouble={"value": 1.0})
            (echoed,) = driver.responses.wait_for("point", 1, timeout=120)
            assert (echoed.time, echoed.fieldsDouble["value"], echoed.fieldsInt["connection"]) == (connection, 1.0, 1)
            driver.close(60)
    finally:
        server.send_signal(signal.SIGINT)  # Kapacitor's agent's Server removes its socket on an interrupt
        server.wait(30)
    deadline = time.monotonic() + 5
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(path)
