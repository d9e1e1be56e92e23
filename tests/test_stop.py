"""How the agent stops: EOF, task stop (output no longer read), SIGTERM, a second SIGTERM.

Kapacitor stops a UDF by closing its stdin and waiting, without limit and without a
kill, for stdout EOF and the process's exit; a task stop first stops reading the
UDF's output. Whatever is queued, the agent must be gone within the drain timeout.
These tests inject each case into real processes over real pipes and sockets.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from test_workqueue import CountedCondition

from udf_agent import udf_pb2
from udf_agent.runtime.transports import SocketConnection
from udf_agent.runtime.writer import Writer
from udf_agent.testing import grouped_point, option
from udf_agent.wire.frames import FrameDecoder, encode_frame

pytestmark = pytest.mark.integration

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What the process may take beyond its drain timeout: interpreter exit and slack for a loaded machine.
EXIT_MARGIN = 3.0


def send_points(driver, count, groups=10):
    for i in range(count):
        driver.send(udf_pb2.Request(point=grouped_point(i, f"g{i % groups}", float(i))))


def wait_accepted(driver, stamp=7):
    """A keepalive's answer means every frame sent before it was read and accepted (its own
    answer: the agent also sends unasked keepalives while it computes)."""
    driver.keepalive(stamp)
    seen = len(driver.responses.of("keepalive"))
    while not any(answer.time == stamp for answer in driver.responses.of("keepalive")):
        seen += 1
        driver.responses.wait_for("keepalive", seen, timeout=30)


@pytest.mark.parametrize("drain_timeout", ["1s", "30s"])
def test_a_task_stop_with_unread_output_exits_within_a_second_or_so(drivers, report, drain_timeout):
    # mirror answers at once; with its output unread the pipe fills and every later write
    # would block for ever. A second with no output taken after EOF shows nobody reads, so
    # even a long --drain-timeout is not waited out.
    driver = drivers("run", "mirror", "--flush-interval", "10ms", "--drain-timeout", drain_timeout)
    assert driver.init().success
    driver.responses.stop_reading()  # Kapacitor's abort: from here on nobody reads
    send_points(driver, 50_000)
    started = time.monotonic()
    assert driver.abort(timeout=60) == 0, driver.log()
    elapsed = time.monotonic() - started
    report(f"task stop with 50 k points of output unread, --drain-timeout {drain_timeout}: exit {elapsed:.2f} s after EOF")
    assert elapsed < 1.0 + EXIT_MARGIN, f"exit took {elapsed:.1f} s"
    assert "output frame(s)" in driver.log() and "not written" in driver.log()


def test_eof_with_a_slow_backlog_computes_what_the_drain_timeout_allows(drivers, report):
    # Each call takes 0.3 s and closes a micro-batch of 10 points: 200 points need 6 s.
    driver = drivers(
        "run", "tests.udfs.sample:slow_local", "--flush-interval", "10ms", "--max-batch-points", "10",
        "--drain-timeout", "1s", cwd=ROOT,
    )
    assert driver.init(udf_pb2.Option(name="seconds", values=[udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=0.3)])).success
    send_points(driver, 200, groups=1)
    wait_accepted(driver)
    # Compute is warm and under way: what the drain adds is what this test is about.
    driver.responses.wait_for("point", 1, timeout=60)
    started = time.monotonic()
    code = driver.close(timeout=30)
    elapsed = time.monotonic() - started
    assert code == 0, driver.log()
    assert elapsed < 1.0 + EXIT_MARGIN, f"exit took {elapsed:.1f} s"
    times = [p.time for p in driver.responses.of("point")]
    # What went out is the start of the input, in order, each point once; the rest is counted.
    assert 0 < len(times) < 200 and times == list(range(len(times)))
    assert "accepted point(s) not computed" in driver.log()
    report(f"EOF with a 6 s backlog and --drain-timeout 1s: {len(times)} of 200 points out, exit {elapsed:.2f} s after EOF")


def test_sigterm_sends_accepted_output_then_says_why_and_exits_0(drivers):
    driver = drivers("run", "tests.udfs.sample:local_echo", "--flush-interval", "1h", "--no-adaptive-flush", cwd=ROOT)
    assert driver.init().success
    send_points(driver, 1_000)
    wait_accepted(driver)
    driver.process.send_signal(signal.SIGTERM)
    assert driver.process.wait(timeout=10) == 0, driver.log()
    driver.responses.closed.wait(10)
    kinds = [k for k in driver.responses.kinds() if k != "keepalive"]
    assert kinds == ["init"] + ["point"] * 1_000 + ["error"], kinds[-3:]
    assert driver.responses.of("error")[0].error == "udf-agent stopped: received SIGTERM"


def test_a_second_sigterm_exits_at_once(drivers):
    driver = drivers(
        "run", "tests.udfs.sample:slow_local", "--flush-interval", "10ms", "--drain-timeout", "60s", cwd=ROOT,
    )
    assert driver.init(udf_pb2.Option(name="seconds", values=[udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=30.0)])).success
    send_points(driver, 10)
    wait_accepted(driver)
    time.sleep(0.3)  # the micro-batch is computing: the drain would take 30 s
    driver.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    started = time.monotonic()
    driver.process.send_signal(signal.SIGTERM)
    assert driver.process.wait(timeout=10) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 2.0
    assert "second SIGTERM" in driver.log()


def test_serve_shuts_down_on_sigterm_while_a_client_does_not_read():
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "mirror.sock")
        with open(os.path.join(directory, "server.err"), "wb") as err:
            server = subprocess.Popen(
                [sys.executable, "-m", "udf_agent", "serve", "--socket", path, "--flush-interval", "10ms", "--drain-timeout", "1s", "mirror"],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
            )
            try:
                client = _connect(path)
                client.sendall(encode_frame(udf_pb2.Request(init=udf_pb2.InitRequest())))
                # Enough output to fill the socket's buffers many times over; never read.
                frames = b"".join(encode_frame(udf_pb2.Request(point=grouped_point(i, "a", float(i)))) for i in range(20_000))
                client.sendall(frames)
                time.sleep(1.0)
                started = time.monotonic()
                server.send_signal(signal.SIGTERM)
                code = server.wait(timeout=30)
                elapsed = time.monotonic() - started
                client.close()
            finally:
                if server.poll() is None:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
        log = open(os.path.join(directory, "server.err"), errors="replace").read()
        assert code == 0, log
        assert elapsed < 1.0 + EXIT_MARGIN, f"shutdown took {elapsed:.1f} s\n{log}"
        assert not os.path.exists(path)


def _connect(path, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_the_writer_drops_and_counts_what_the_peer_does_not_read_by_the_deadline():
    ours, theirs = socket.socketpair()
    writer = Writer(SocketConnection(ours))
    frames = [encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=i))) for i in range(200_000)]
    for frame in frames:
        writer.send(frame)
    writer.drain_by(time.monotonic() + 0.3)
    writer.close()
    started = time.monotonic()
    writer.join()
    assert time.monotonic() - started < 0.3 + 1.0
    assert writer.unwritten_frames > 0
    # The peer gets whole frames in order (the one cut short aside), then EOF.
    received = bytearray()
    theirs.settimeout(5)
    while chunk := theirs.recv(1 << 20):
        received += chunk
    decoder = FrameDecoder(udf_pb2.Response)
    got = decoder.feed(bytes(received))
    assert [r.keepalive.time for r in got] == list(range(len(got)))
    assert len(got) + writer.unwritten_frames == len(frames)
    ours.close()
    theirs.close()


def _keepalive_frames(first: int, count: int) -> bytes:
    return b"".join(encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=i))) for i in range(first, first + count))


def test_output_sent_while_the_writer_is_idle_leaves_from_the_sender_and_otherwise_in_order_behind_the_writer():
    ours, theirs = socket.socketpair()
    connection = SocketConnection(ours)
    writer = Writer(connection)
    written_now: list[tuple[str, bool]] = []
    write_now = connection.write_now

    def counted(data: bytes) -> bool:
        wrote = write_now(data)
        written_now.append((threading.current_thread().name, wrote))
        return wrote

    connection.write_now = counted  # type: ignore[method-assign]
    first = _keepalive_frames(0, 3)
    writer.send_now(first)  # the writer is idle: written by this thread, at once
    assert written_now == [(threading.current_thread().name, True)]
    theirs.settimeout(10)
    assert theirs.recv(1 << 16) == first
    # More than the peer's socket holds, not read: the writer thread's write waits.
    backlog = _keepalive_frames(3, 200_000)
    writer.send(backlog)
    deadline = time.monotonic() + 10
    while writer.queued_bytes:  # taken by the writer thread: its write is under way
        assert time.monotonic() < deadline
        time.sleep(0.001)
    after = _keepalive_frames(200_003, 2)
    writer.send_now(after)  # queued behind the write under way, not written past it
    writer.send_now(_keepalive_frames(200_005, 400))  # over ATOMIC_WRITE: always the writer's
    assert written_now == [(threading.current_thread().name, True)]
    writer.close()
    received = bytearray()
    while chunk := theirs.recv(1 << 20):
        received += chunk
    writer.join()
    assert bytes(received) == backlog + after + _keepalive_frames(200_005, 400)
    ours.close()
    theirs.close()


def test_output_written_by_its_sender_never_wakes_the_idle_writer_thread(monkeypatch):
    """On a trickle each micro-batch's output leaves from the compute thread (``send_now``);
    waking the idle writer thread after each would cost the compute thread a preemption and
    the GIL for nothing."""
    monkeypatch.setattr(threading, "Condition", CountedCondition)
    ours, theirs = socket.socketpair()
    writer = Writer(SocketConnection(ours))
    monkeypatch.undo()
    cond = writer._cond
    assert isinstance(cond, CountedCondition)
    frames = _keepalive_frames(0, 1)
    theirs.settimeout(10)
    for _ in range(100):
        writer.send_now(frames)
        assert theirs.recv(1 << 16) == frames
    assert cond.wakes == 0
    writer.close()
    writer.join()
    ours.close()
    theirs.close()


def _initialised(args: list[str], err, init: udf_pb2.InitRequest | None = None, cwd: str | None = None) -> subprocess.Popen:
    """``udf-agent run ARGS`` over pipes, once it has answered Init."""
    agent = subprocess.Popen(
        [sys.executable, "-m", "udf_agent", "run", *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True, cwd=cwd,
    )
    agent.stdin.write(encode_frame(udf_pb2.Request(init=init or udf_pb2.InitRequest())))
    agent.stdin.flush()
    decoder = FrameDecoder(udf_pb2.Response)
    while not decoder.feed(os.read(agent.stdout.fileno(), 65536)):
        pass  # the InitResponse
    return agent


def test_output_nobody_reads_stops_input_instead_of_growing_memory():
    """Kapacitor stops reading stdout but keeps the task: the agent's queues stay bounded
    (input stops being read), and once output is read again every point comes back."""
    import threading

    frame = encode_frame(udf_pb2.Request(point=grouped_point(1, "a", 1.0)))
    count = 2_000_000  # ~110 MB of input
    with tempfile.TemporaryFile() as err:
        # This test's reader decodes every frame in Python: on a busy machine the output queued
        # when input ends takes it longer than the default --drain-timeout (5 s), and the rest
        # would be dropped, as that option says. The drain deadline is not what is tested here.
        agent = _initialised(["mirror", "--max-pending-points", "10000", "--drain-timeout", "120s"], err)
        try:
            decoder = FrameDecoder(udf_pb2.Response)
            written = [0]

            def feed() -> None:
                data = memoryview(frame * count)
                for start in range(0, len(data), 1 << 20):
                    written[0] += agent.stdin.write(data[start : start + (1 << 20)]) or 0
                agent.stdin.close()

            feeder = threading.Thread(target=feed, daemon=True)
            feeder.start()
            # Nobody reads stdout: input must stop long before all of it is taken.
            previous = -1
            while written[0] != previous:
                previous = written[0]
                time.sleep(1.0)
            with open(f"/proc/{agent.pid}/status") as status:
                rss_mb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS")) / 1024
            assert written[0] < 70 * 2**20, f"{written[0] / 2**20:.0f} MiB taken while output was not read"
            assert rss_mb < 400, rss_mb
            # Reading again: everything comes back, and the agent ends normally.
            received = 0
            while chunk := os.read(agent.stdout.fileno(), 1 << 20):
                received += sum(1 for r in decoder.feed(chunk) if r.WhichOneof("message") == "point")
            feeder.join(30)
            assert received == count
            assert agent.wait(30) == 0
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)


def test_sigterm_while_the_output_queue_is_full_exits_within_the_drain_timeout():
    import threading

    frame = encode_frame(udf_pb2.Request(point=grouped_point(1, "a", 1.0)))
    with tempfile.TemporaryFile() as err:
        agent = _initialised(["mirror", "--max-pending-points", "10000", "--drain-timeout", "1s"], err)
        try:

            def feed() -> None:
                try:
                    agent.stdin.write(frame * 2_000_000)
                except (BrokenPipeError, ValueError):
                    pass  # the agent is gone: what the test wants

            threading.Thread(target=feed, daemon=True).start()
            time.sleep(3.0)  # output unread: the queue fills, compute and then the reader wait
            started = time.monotonic()
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=15) == 0
            assert time.monotonic() - started < 4.0
            err.seek(0)
            assert "not written" in err.read().decode()
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)


def test_eof_behind_input_held_back_by_the_budget_starts_the_drain_at_once():
    # The reader holds back a pipe full of unread points (the pending budget is full and
    # compute is slow), so it cannot read its way to the end of input: the hang-up must
    # be seen without reading, or the stop would wait for the whole backlog.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    chunk = encode_frame(udf_pb2.Request(point=grouped_point(1, "a", 1.0))) * 1000
    seconds = udf_pb2.Option(name="seconds", values=[udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=2.0)])
    args = [
        "tests.udfs.sample:slow_local", "--max-pending-points", "5", "--max-batch-points", "1",
        "--no-adaptive-flush", "--flush-interval", "10ms", "--drain-timeout", "1s",
    ]
    with tempfile.TemporaryFile() as err:
        # Once Init is answered, the pending budget applies.
        agent = _initialised(args, err, udf_pb2.InitRequest(options=[seconds]), cwd=root)
        try:
            fd = agent.stdin.fileno()
            os.set_blocking(fd, False)
            stalled_since = None
            while stalled_since is None or time.monotonic() - stalled_since < 1.0:
                try:
                    os.write(fd, chunk)
                    stalled_since = None
                except BlockingIOError:
                    stalled_since = stalled_since or time.monotonic()
                    time.sleep(0.05)
            started = time.monotonic()
            agent.stdin.close()  # the pipe is full: the reader has not seen this by reading
            assert agent.wait(timeout=20) == 0
            assert time.monotonic() - started < 3.5
            err.seek(0)
            assert "accepted point(s) not computed" in err.read().decode()
        finally:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)


def test_sigint_while_spark_starts_ends_the_task_and_its_jvm_within_the_drain_timeout(drivers):
    from benchmarks.driver import java_descendants

    driver = drivers("run", "moving_avg", "--no-local-while-starting", "--drain-timeout", "1s", cwd=ROOT)
    assert driver.init(option("field", "x"), option("size", 2)).success
    driver.point(time=1, name="m", fieldsDouble={"x": 1.0})  # waits for Spark, which is starting
    wait_accepted(driver)  # else the signal can beat the reader to the point, never accepted
    deadline = time.monotonic() + 60
    while not (jvms := java_descendants(driver.process.pid)):
        assert time.monotonic() < deadline, driver.log()
        time.sleep(0.05)
    started = time.monotonic()
    driver.process.send_signal(signal.SIGINT)
    assert driver.process.wait(timeout=15) == 0, driver.log()
    for jvm in jvms:  # the JVM follows its parent down
        while _running(jvm):
            assert time.monotonic() - started < 10, "the JVM outlived the agent"
            time.sleep(0.05)
    assert time.monotonic() - started < 10
    assert "1 accepted point(s) not computed" in driver.log()


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False
