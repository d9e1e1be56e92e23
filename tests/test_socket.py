"""``udf-agent serve`` as a real process, reached over a real unix socket as Kapacitor reaches it.

Kapacitor dials the socket once per UDF node per task, plus one short Info-only
connection at start-up, and never reconnects; on stop it half-closes and reads
until the agent closes its side. These tests drive a real server subprocess the
same way and check what comes back frame by frame (parsed, never raw bytes).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from benchmarks.driver import java_descendants
from udf_agent import udf_pb2
from udf_agent.testing import SocketDriver, grouped_point, option
from udf_agent.wire.frames import FrameDecoder, encode_frame

pytestmark = pytest.mark.integration

SECOND = 1_000_000_000
T0 = 1_700_000_000 * SECOND
MAX_SOCKET_PATH = 107
SERVE = [sys.executable, "-m", "udf_agent", "serve"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- helpers


class Server:
    """One ``udf-agent serve`` subprocess; its stdout and stderr go to files."""

    def __init__(self, path: str, target: str, *extra: str, log_dir: str, preexec_fn=None, env=None):
        self.path = path
        index = len(os.listdir(log_dir))
        self._out_path = os.path.join(log_dir, f"server{index}.out")
        self._err_path = os.path.join(log_dir, f"server{index}.err")
        self._out = open(self._out_path, "wb")
        self._err = open(self._err_path, "wb")
        self.process = subprocess.Popen(
            [*SERVE, "--socket", path, *extra, target],
            stdin=subprocess.DEVNULL,
            stdout=self._out,
            stderr=self._err,
            start_new_session=True,  # its own process group: teardown also reaches a Spark JVM
            preexec_fn=preexec_fn,
            cwd=ROOT,  # test UDFs are imported as tests.udfs.*
            env=None if env is None else {**os.environ, **env},
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        self._err.flush()
        with open(self._err_path, "rb") as f:
            err = f.read().decode(errors="replace")
        with open(self._out_path, "rb") as f:
            out = f.read().decode(errors="replace")
        return f"--- stderr ---\n{err}\n--- stdout ---\n{out}"

    def wait_ready(self, timeout: float = 30) -> Server:
        deadline = time.monotonic() + timeout
        while True:
            code = self.process.poll()
            if code is not None:
                raise AssertionError(f"server exited with {code} before listening\n{self.log()}")
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(self.path)
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"server did not listen on {self.path} within {timeout} s\n{self.log()}") from None
                time.sleep(0.05)
            finally:
                probe.close()

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"server still running after {timeout} s\n{self.log()}") from None

    def kill(self) -> None:
        """Teardown: whatever is left of this server's process group is killed."""
        if self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGTERM)
                self.process.wait(5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.kill()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._out.close()
        self._err.close()


@pytest.fixture
def sock_dir(tmp_path):
    """A directory for socket files whose paths fit in sun_path."""
    if len(os.fsencode(str(tmp_path / "s" / "udf-agent.sock"))) <= 100:
        yield str(tmp_path)
        return
    short = tempfile.mkdtemp(prefix="udfs", dir="/tmp")
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def servers(tmp_path):
    """Starts servers (``servers.start(path, target, *args)``) and kills leftovers at teardown."""
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    started: list[Server] = []

    class Factory:
        def start(self, path: str, target: str = "mirror", *extra: str, ready: bool = True, timeout: float = 30, preexec_fn=None, env=None) -> Server:
            server = Server(path, target, *extra, log_dir=str(log_dir), preexec_fn=preexec_fn, env=env)
            started.append(server)
            return server.wait_ready(timeout) if ready else server

    yield Factory()
    for server in started:
        server.kill()


@pytest.fixture
def drivers():
    """Every SocketDriver opened by a test is closed at teardown."""
    opened: list[SocketDriver] = []

    def connect(path: str, timeout: float = 10) -> SocketDriver:
        driver = SocketDriver.connect(path, timeout=timeout)
        opened.append(driver)
        return driver

    yield connect
    for driver in opened:
        try:
            driver.sock.close()
        except OSError:
            pass


def serve_once(path: str, target: str = "mirror", *extra: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Runs a server that is expected to refuse to start."""
    return subprocess.run(
        [*SERVE, "--socket", path, *extra, target],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=timeout,
    )


def make_point(conn: int, j: int) -> udf_pb2.Point:
    """The j-th point of connection `conn`: its tags, values and time are its own."""
    host = f"h{j % 3}"
    return udf_pb2.Point(
        time=T0 + j * SECOND + conn,
        name="cpu",
        database="telegraf",
        retentionPolicy="autogen",
        group=f"host={host}",
        dimensions=["host"],
        tags={"host": host, "conn": f"c{conn}"},
        fieldsDouble={"value": conn * 1000.0 + j + 0.25},
        fieldsInt={"seq": conn * 100_000 + j},
        fieldsString={"label": f"conn{conn}-point{j}"},
        fieldsBool={"odd": j % 2 == 1},
    )


def by_time(points) -> list[udf_pb2.Point]:
    return sorted(points, key=lambda p: (p.time, p.group))


def assert_same_points(got: list[udf_pb2.Point], expected: list[udf_pb2.Point], label: str) -> None:
    got, expected = by_time(got), by_time(expected)
    assert len(got) == len(expected), f"{label}: {len(got)} point(s) came back, {len(expected)} were sent"
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"{label}: point {index} differs\n got: {g}\nwant: {e}"


def assert_echo_task(driver: SocketDriver, conn: int, count: int, label: str) -> None:
    """A whole mirror task on a fresh connection: Init, points, close; every point comes back unchanged."""
    assert driver.init(timeout=30).success
    points = [make_point(conn, j) for j in range(count)]
    for point in points:
        driver.send(udf_pb2.Request(point=point))
    driver.close(timeout=30)
    assert_no_error(driver, label)
    assert "info" not in driver.responses.kinds()
    assert_same_points(driver.responses.of("point"), points, label)


def assert_no_error(driver: SocketDriver, label: str) -> None:
    errors = driver.responses.of("error")
    assert not errors, f"{label}: ErrorResponse {[e.error for e in errors]}"
    assert driver.responses.error is None, f"{label}: reading failed: {driver.responses.error!r}"


def connect_refused(path: str) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(2)
    try:
        probe.connect(path)
        return False
    except (ConnectionRefusedError, FileNotFoundError):
        return True
    finally:
        probe.close()


class RawClient:
    """Kapacitor's side of a connection that reads only when told to.

    Not reading lets a test hold a session open: the agent's writer blocks once
    the socket buffer is full.
    """

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.decoder = FrameDecoder(udf_pb2.Response)
        self.items: list[udf_pb2.Response] = []
        self.eof = False

    def send(self, *requests: udf_pb2.Request) -> None:
        self.sock.sendall(b"".join(encode_frame(r) for r in requests))

    def of(self, kind: str) -> list:
        return [getattr(r, kind) for r in self.items if r.WhichOneof("message") == kind]

    def init(self) -> udf_pb2.InitResponse:
        self.send(udf_pb2.Request(init=udf_pb2.InitRequest(taskID="t", nodeID="mirror1")))
        self.read_until(lambda: self.of("init"), timeout=30)
        return self.of("init")[0]

    def read_until(self, done, timeout: float, until_eof: bool = False) -> None:
        """Reads until ``done()``; with ``until_eof`` the server closing the connection is the goal, not a failure."""
        deadline = time.monotonic() + timeout
        while not done():
            if self.eof:
                if until_eof:
                    self.decoder.close()
                    return
                raise AssertionError(f"the server closed the connection; got {[r.WhichOneof('message') for r in self.items][-10:]}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"timed out after {timeout} s; got {len(self.items)} response(s)")
            self.sock.settimeout(remaining)
            try:
                data = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            if not data:
                self.eof = True
                continue
            self.items.extend(self.decoder.feed(data))

    def read_to_eof(self, timeout: float) -> None:
        self.read_until(lambda: False, timeout, until_eof=True)

    def close(self) -> None:
        self.sock.close()


# ---------------------------------------------------------------- concurrency


def test_concurrent_connections_each_get_exactly_their_own_points(servers, drivers, sock_dir):
    path = os.path.join(sock_dir, "mirror.sock")
    server = servers.start(path)
    connections, per_connection = 6, 200
    conns = [drivers(path) for _ in range(connections)]
    for conn in conns:
        assert conn.init(timeout=30).success
    sent = {i: [make_point(i, j) for j in range(per_connection)] for i in range(connections)}
    barrier = threading.Barrier(connections)
    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            for j, point in enumerate(sent[i]):
                conns[i].send(udf_pb2.Request(point=point))
                if j % 7 == 0:
                    time.sleep(0.001)  # let the other threads' frames interleave with ours
            conns[i].close(timeout=60)
        except BaseException as exc:  # reported below, with the connection number
            failures.append(AssertionError(f"connection {i}: {exc!r}"))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(90)
    assert not any(t.is_alive() for t in threads), "a connection did not finish within 90 s"
    assert not failures, failures

    for i, conn in enumerate(conns):
        assert_no_error(conn, f"connection {i}")
        kinds = set(conn.responses.kinds())
        assert kinds <= {"init", "point", "keepalive"}, f"connection {i} got {kinds}"
        got = conn.responses.of("point")
        strangers = {p.tags["conn"] for p in got} - {f"c{i}"}
        assert not strangers, f"connection {i} received points of {sorted(strangers)}"
        assert_same_points(got, sent[i], f"connection {i}")
    assert server.process.poll() is None, server.log()


# ---------------------------------------------------------------- Kapacitor's start-up Info


@pytest.mark.parametrize(
    "target, options",
    [
        ("mirror", {}),
        ("moving_avg", {"field": [udf_pb2.STRING], "size": [udf_pb2.INT], "as": [udf_pb2.STRING]}),
    ],
)
def test_info_only_connection_then_server_keeps_serving(servers, drivers, sock_dir, target, options):
    path = os.path.join(sock_dir, "info.sock")
    server = servers.start(path, target)
    # kapacitord start-up: connect, Info, close; a restart of kapacitord does it again.
    for attempt in range(3):
        driver = drivers(path)
        started = time.monotonic()
        info = driver.info(timeout=10)
        elapsed = time.monotonic() - started
        driver.close(timeout=10)
        assert driver.responses.kinds() == ["info"], f"attempt {attempt}: {driver.responses.kinds()}"
        assert info.wants == udf_pb2.STREAM and info.provides == udf_pb2.STREAM
        assert {name: list(o.valueTypes) for name, o in info.options.items()} == options
        assert elapsed < 1.0
        assert_no_error(driver, f"info attempt {attempt}")
    assert server.process.poll() is None, f"server died after Info-only connections\n{server.log()}"

    if target == "mirror":
        # A task starts afterwards: a fresh connection, Init, data.
        assert_echo_task(drivers(path), 9, 20, "task connection")
    assert server.process.poll() is None, server.log()


# ---------------------------------------------------------------- the socket file


def test_stale_socket_file_is_replaced(servers, drivers, sock_dir):
    path = os.path.join(sock_dir, "stale.sock")
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(path)
    leftover.close()  # a crashed server's file: a socket nobody listens on
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert connect_refused(path)

    server = servers.start(path)
    driver = drivers(path)
    info = driver.info(timeout=10)
    assert info.wants == udf_pb2.STREAM
    driver.close(timeout=10)
    assert stat.S_ISSOCK(os.lstat(path).st_mode)
    assert server.process.poll() is None, server.log()


def test_regular_file_at_the_path_is_refused_and_kept(sock_dir):
    path = os.path.join(sock_dir, "precious.sock")
    with open(path, "w") as f:
        f.write("not a socket: keep me\n")
    before = os.lstat(path)

    result = serve_once(path)

    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, err
    assert "not a socket" in err and path in err, err
    assert "Traceback" not in err, err
    after = os.lstat(path)
    assert stat.S_ISREG(after.st_mode)
    assert after.st_ino == before.st_ino
    with open(path) as f:
        assert f.read() == "not a socket: keep me\n"


def test_socket_path_too_long_is_refused(sock_dir):
    path = os.path.join(sock_dir, "x" * (MAX_SOCKET_PATH + 10 - len(sock_dir)) + ".sock")
    assert len(os.fsencode(path)) > MAX_SOCKET_PATH
    result = serve_once(path)
    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, err
    assert "107" in err and "Traceback" not in err, err
    assert not os.path.exists(path)


def test_second_server_on_a_live_socket_refuses_and_first_keeps_working(servers, drivers, sock_dir):
    path = os.path.join(sock_dir, "owned.sock")
    first = servers.start(path)
    inode = os.lstat(path).st_ino

    result = serve_once(path)

    err = result.stderr.decode(errors="replace")
    assert result.returncode != 0, err
    assert "already listening" in err and path in err, err
    assert "Traceback" not in err, err
    # The live server's file is untouched and the server still answers.
    assert stat.S_ISSOCK(os.lstat(path).st_mode) and os.lstat(path).st_ino == inode
    assert first.process.poll() is None, first.log()
    assert_echo_task(drivers(path), 1, 30, "first server")


@pytest.mark.parametrize("mode_args, expected", [((), 0o660), (("--socket-mode", "0600"), 0o600)])
def test_socket_file_permissions(servers, sock_dir, mode_args, expected):
    path = os.path.join(sock_dir, "perm.sock")
    server = servers.start(path, "mirror", *mode_args)
    info = os.lstat(path)
    assert stat.S_ISSOCK(info.st_mode)
    mode = stat.S_IMODE(info.st_mode)
    assert mode == expected, f"socket file mode {mode:o}, expected {expected:o}"
    assert not mode & stat.S_IWOTH, f"socket file is world-writable ({mode:o})"
    assert not mode & stat.S_IXOTH
    assert server.process.poll() is None


# ---------------------------------------------------------------- stopping


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_finishes_open_session_and_removes_socket(servers, sock_dir, signum):
    path = os.path.join(sock_dir, "stop.sock")
    # A long flush interval: the points stay pending, only the stop can send them.
    server = servers.start(path, "tests.udfs.sample:local_echo", "--flush-interval", "60s", "--no-adaptive-flush")
    client = RawClient(path)
    try:
        assert client.init().success
        # Enough output to fill the socket buffer while we do not read: the
        # session stays open after the signal until we read.
        points = [make_point(3, j) for j in range(10_000)]
        client.send(*(udf_pb2.Request(point=p) for p in points))
        # The keepalive is read after every point: its answer proves they were all accepted.
        client.send(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=4242)))
        client.read_until(lambda: any(k.time == 4242 for k in client.of("keepalive")), timeout=30)
        assert not client.of("point"), "points were echoed before the stop (flush interval ignored?)"

        signalled = time.monotonic()
        server.process.send_signal(signum)

        # New connections are refused while the open session is still being finished.
        deadline = signalled + 10
        while not connect_refused(path):
            assert time.monotonic() < deadline, f"server still accepts connections 10 s after {signum!r}\n{server.log()}"
            time.sleep(0.05)
        assert server.process.poll() is None, f"server exited before its open session was read\n{server.log()}"

        client.read_to_eof(timeout=60)  # the server closes the connection itself
        assert time.monotonic() - signalled < 60
        # Every accepted point goes out, then the reason the task ends (Kapacitor's
        # reader would take a bare EOF silently).
        assert [e.error for e in client.of("error")] == [f"udf-agent stopped: received {signal.Signals(signum).name}"]
        assert client.items[-1].WhichOneof("message") == "error"
        assert_same_points(client.of("point"), points, "open session")
        kinds = {r.WhichOneof("message") for r in client.items}
        assert kinds <= {"init", "keepalive", "point", "error"}, kinds

        assert server.wait(30) == 0, server.log()
        assert not os.path.lexists(path), "the socket file was left behind"
    finally:
        client.close()


def test_stop_while_kapacitor_is_between_a_length_and_its_body(servers, sock_dir):
    # Kapacitor writes a frame's length and body separately: a stop can fall between them.
    path = os.path.join(sock_dir, "split.sock")
    server = servers.start(path, "tests.udfs.sample:local_echo", "--flush-interval", "60s", "--no-adaptive-flush")
    client = RawClient(path)
    try:
        assert client.init().success
        point = make_point(4, 0)
        client.send(udf_pb2.Request(point=point))
        client.send(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=77)))
        client.read_until(lambda: client.of("keepalive"), timeout=30)
        client.sock.sendall(encode_frame(udf_pb2.Request(point=point))[:1])
        server.process.send_signal(signal.SIGTERM)
        client.read_to_eof(timeout=60)
        # A stop is no truncated frame: the only error is the stop's own reason.
        assert [e.error for e in client.of("error")] == ["udf-agent stopped: received SIGTERM"]
        assert_same_points(client.of("point"), [point], "split frame")
        assert server.wait(30) == 0, server.log()
    finally:
        client.close()


# ---------------------------------------------------------------- bad input


GARBAGE = {
    "invalid-body": b"\x0c" + b"\xff" * 12 + b"more junk that is no protobuf",
    "absurd-length": b"\xff\xff\xff\xff\xff\xff\xff\xff\x7f" + b"\x00" * 64,
    "http": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n" + bytes(random.Random(7).randbytes(4096)),
}


@pytest.mark.parametrize("garbage", list(GARBAGE), ids=list(GARBAGE))
def test_garbage_ends_only_its_own_connection_with_an_error(servers, drivers, sock_dir, garbage):
    path = os.path.join(sock_dir, "garbage.sock")
    server = servers.start(path)
    good = drivers(path)
    assert good.init(timeout=30).success
    first = [make_point(1, j) for j in range(50)]
    for point in first:
        good.send(udf_pb2.Request(point=point))

    bad = drivers(path)
    assert bad.init(timeout=30).success
    bad.send(udf_pb2.Request(point=make_point(2, 0)))
    bad.send_raw(GARBAGE[garbage])
    # The server ends the bad connection by itself (no half-close from us).
    if not bad.responses.closed.wait(30):
        raise AssertionError(f"the server did not close the garbage connection\n{server.log()}")
    errors = bad.responses.of("error")
    assert len(errors) == 1 and errors[0].error, bad.responses.kinds()
    assert bad.responses.kinds()[-1] == "error", "the ErrorResponse must be the last frame"
    assert not any(p.tags.get("conn") != "c2" for p in bad.responses.of("point"))

    # The other connection is unaffected and keeps going.
    second = [make_point(1, j) for j in range(50, 100)]
    for point in second:
        good.send(udf_pb2.Request(point=point))
    good.close(timeout=30)
    assert_no_error(good, "good connection")
    assert_same_points(good.responses.of("point"), first + second, "good connection")

    # And new connections are still served.
    assert_echo_task(drivers(path), 5, 10, "later connection")
    assert server.process.poll() is None, server.log()


# ---------------------------------------------------------------- running out of file descriptors


FD_LIMIT = 48


def _low_fd_limit() -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def test_running_out_of_file_descriptors_does_not_end_the_server(servers, drivers, sock_dir):
    path = os.path.join(sock_dir, "fds.sock")
    server = servers.start(path, preexec_fn=_low_fd_limit)
    held = drivers(path)
    assert held.init(timeout=30).success
    before = [make_point(1, j) for j in range(20)]
    for point in before:
        held.send(udf_pb2.Request(point=point))
    held.responses.wait_for("point", len(before), timeout=30)

    # More connections than the server has file descriptors (many tasks at once).
    flood: list[socket.socket] = []
    try:
        for _ in range(FD_LIMIT + 12):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(2)
            flood.append(sock)
            try:
                sock.connect(path)
            except OSError:
                break  # the backlog is full: enough
        # The server really ran out of descriptors, and kept going.
        deadline = time.monotonic() + 30
        while "cannot accept a connection yet" not in server.log():
            assert time.monotonic() < deadline, f"the server never ran out of file descriptors\n{server.log()}"
            assert server.process.poll() is None, f"the server ended when it ran out of file descriptors\n{server.log()}"
            time.sleep(0.05)
        assert server.process.poll() is None, f"the server ended when it ran out of file descriptors\n{server.log()}"
        assert stat.S_ISSOCK(os.lstat(path).st_mode)

        # The open task goes on.
        after = [make_point(1, j) for j in range(20, 40)]
        for point in after:
            held.send(udf_pb2.Request(point=point))
        held.responses.wait_for("point", len(before) + len(after), timeout=30)
    finally:
        for sock in flood:
            sock.close()
    held.close(timeout=30)
    assert_no_error(held, "held connection")
    assert_same_points(held.responses.of("point"), before + after, "held connection")

    # Once descriptors are free again, new connections are served.
    later = drivers(path, timeout=20)
    assert later.info(timeout=20).wants == udf_pb2.STREAM
    later.close(timeout=20)
    assert server.process.poll() is None, server.log()


# ---------------------------------------------------------------- a Spark built-in over the socket


def moving_averages(values: list[float], size: int) -> list[float]:
    return [sum(values[max(0, k - size + 1) : k + 1]) / len(values[max(0, k - size + 1) : k + 1]) for k in range(len(values))]


@pytest.mark.spark
def test_moving_avg_over_socket_two_concurrent_connections(servers, drivers, sock_dir):
    path = os.path.join(sock_dir, "mavg.sock")
    server = servers.start(path, "moving_avg", "--master", "local[2]")
    size = 10
    # Connection 0: Kapacitor's own reference data (a -> 0.9, b -> 1.9 at t=10 s).
    # Connection 1: the same group ids with other values: state must not leak between tasks.
    series = {
        0: {
            "a": [1.0] * 10 + [0.0, 0.0],
            "b": [2.0] * 10 + [1.0, 0.0],
        },
        1: {
            "a": [100.0 + 3 * t for t in range(12)],
            "c": [-5.0 * t for t in range(12)],
        },
    }
    conns = {i: drivers(path) for i in series}
    for conn in conns.values():
        assert conn.init(option("field", "value"), option("size", size), option("as", "mean"), timeout=60).success

    def send(i: int, times: range) -> None:
        for t in times:
            for group, values in series[i].items():
                point = grouped_point(t * SECOND, group, values[t], database="telegraf", retentionPolicy="autogen", tags={"conn": f"c{i}"})
                conns[i].send(udf_pb2.Request(point=point))

    failures: list[BaseException] = []

    def run(i: int) -> None:
        try:
            groups = len(series[i])
            send(i, range(0, 10))
            # The first wave is computed (Spark starts here), then history carries over.
            conns[i].responses.wait_for("point", 10 * groups, timeout=180)
            send(i, range(10, 12))
            conns[i].close(timeout=180)
        except BaseException as exc:
            failures.append(AssertionError(f"connection {i}: {exc!r}"))

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in series]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(240)
    assert not any(t.is_alive() for t in threads), f"moving_avg connections did not finish\n{server.log()}"
    assert not failures, f"{failures}\n{server.log()}"

    for i, conn in conns.items():
        assert_no_error(conn, f"connection {i}")
        got: dict[str, list[udf_pb2.Point]] = {}
        for point in conn.responses.of("point"):
            assert point.tags["conn"] == f"c{i}", f"connection {i} received {point}"
            got.setdefault(point.tags["group"], []).append(point)
        assert set(got) == set(series[i]), f"connection {i}: groups {sorted(got)}"
        for group, values in series[i].items():
            points = sorted(got[group], key=lambda p: p.time)
            assert [p.time for p in points] == [t * SECOND for t in range(12)], f"connection {i} group {group}"
            for p in points:
                assert p.group == f"group={group}" and list(p.dimensions) == ["group"] and p.name == "cpu"
                assert set(p.fieldsDouble) == {"mean"} and not p.fieldsInt and not p.fieldsString
            means = [p.fieldsDouble["mean"] for p in points]
            assert means == pytest.approx(moving_averages(values, size), rel=1e-9), f"connection {i} group {group}"
    # Kapacitor's end-to-end reference: last('mean') over an 11 s window (t = 0..10 s).
    assert mean_at(conns[0], "a", 10 * SECOND) == pytest.approx(0.9, rel=1e-9)
    assert mean_at(conns[0], "b", 10 * SECOND) == pytest.approx(1.9, rel=1e-9)

    server.process.send_signal(signal.SIGTERM)
    assert server.wait(60) == 0, server.log()
    assert not os.path.lexists(path)


def mean_at(driver: SocketDriver, group: str, when: int) -> float:
    (point,) = [p for p in driver.responses.of("point") if p.tags["group"] == group and p.time == when]
    return point.fieldsDouble["mean"]


def _served(path: str, timeout: float = 10) -> SocketDriver:
    """A connection that got its InfoResponse; retried while the server is still full
    (the readiness probe's own session takes a moment to end)."""
    deadline = time.monotonic() + timeout
    while True:
        driver = SocketDriver.connect(path)
        try:
            assert driver.info(timeout=2).wants == udf_pb2.STREAM
            return driver
        except (AssertionError, OSError):
            driver.sock.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_connections_beyond_the_limit_are_told_why_and_closed(servers, sock_dir):
    path = os.path.join(sock_dir, "limited.sock")
    server = servers.start(path, "mirror", "--max-connections", "2")
    first, second = _served(path), _served(path)
    assert second.responses.of("info")
    third = SocketDriver.connect(path)
    (error,) = third.responses.wait_for("error", timeout=10)
    assert "too many connections (2 open, --max-connections 2)" in error.error
    assert third.responses.closed.wait(10)
    # Once a session ends, a new connection is served again.
    first.close(timeout=30)
    _served(path)
    assert "refused a connection" in server.log()


def test_a_connection_that_never_sends_init_is_closed_at_the_init_timeout(servers, sock_dir):
    path = os.path.join(sock_dir, "idle.sock")
    server = servers.start(path, "mirror", "--init-timeout", "1s")
    idle = SocketDriver.connect(path)
    started = time.monotonic()
    assert idle.info().wants == udf_pb2.STREAM  # Info alone does not count
    (error,) = idle.responses.wait_for("error", timeout=10)
    assert "no Init within 1 s of connecting (--init-timeout)" in error.error
    assert idle.responses.closed.wait(10) and time.monotonic() - started < 5
    # A session that did send Init is not touched by the timeout.
    busy = SocketDriver.connect(path)
    assert busy.init().success
    time.sleep(1.5)
    busy.point(time=T0, name="m", fieldsDouble={"x": 1.0})
    assert busy.responses.wait_for("point", 1, timeout=10)[0].time == T0
    assert not busy.responses.of("error")
    assert "sent no Init within 1 s" in server.log()


def _moving_avg_session(path: str, first_time: int) -> tuple[SocketDriver, list]:
    driver = SocketDriver.connect(path)
    assert driver.init(option("field", "value"), option("size", 2)).success
    for i in range(4):
        driver.send(udf_pb2.Request(point=grouped_point(T0 + (first_time + i) * SECOND, "a", float(i))))
    return driver, driver.responses.wait_for("point", 4, timeout=120)


@pytest.mark.spark
def test_serve_starts_spark_as_it_listens_and_shares_it_so_init_to_first_output_is_fast(servers, sock_dir):
    path = os.path.join(sock_dir, "warm.sock")
    server = servers.start(path, "moving_avg")
    # While Spark starts, Info and keepalives are answered at once.
    early = SocketDriver.connect(path)
    started = time.monotonic()
    assert early.info().wants == udf_pb2.STREAM
    early.keepalive(7)
    early.responses.wait_for("keepalive", timeout=5)
    assert time.monotonic() - started < 2, server.log()
    early.close()
    # Spark comes up without any Init.
    deadline = time.monotonic() + 120
    while "compute engine ready" not in server.log():
        assert time.monotonic() < deadline and server.process.poll() is None, server.log()
        time.sleep(0.1)
    for first_time in (0, 100):  # two sessions, one Spark
        started = time.monotonic()
        driver, points = _moving_avg_session(path, first_time)
        elapsed = time.monotonic() - started
        assert [p.fieldsDouble["avg"] for p in points] == [0.0, 0.5, 1.5, 2.5]
        driver.close()
        assert elapsed <= 3, f"Init -> 4th output took {elapsed:.2f} s on a warm server\n{server.log()}"
    assert server.log().count("starting Spark") == 1, server.log()


@pytest.mark.spark
def test_sigterm_while_spark_starts_ends_the_server_and_its_jvm_at_once(servers, sock_dir):
    path = os.path.join(sock_dir, "starting.sock")
    server = servers.start(path, "moving_avg")
    deadline = time.monotonic() + 60
    while not java_descendants(server.pid):  # Spark's start-up is under way
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(10) == 0
    while True:  # the JVM follows (its process group is the server's)
        try:
            os.killpg(server.pid, 0)
        except ProcessLookupError:
            break
        assert time.monotonic() - started < 10, f"the JVM outlived the server\n{server.log()}"
        time.sleep(0.05)
    assert not os.path.exists(path)


@pytest.mark.spark
def test_serve_replaces_a_dead_jvm_for_the_next_connection(servers, sock_dir):
    path = os.path.join(sock_dir, "jvm.sock")
    server = servers.start(path, "moving_avg", "--no-local-while-starting", "--flush-interval", "50ms")
    first, points = _moving_avg_session(path, 0)
    assert [p.fieldsDouble["avg"] for p in points] == [0.0, 0.5, 1.5, 2.5]
    (jvm,) = java_descendants(server.pid)
    os.kill(jvm, signal.SIGKILL)
    time.sleep(0.5)
    # The next micro-batch finds the JVM dead and waits for a new Spark ...
    first.send(udf_pb2.Request(point=grouped_point(T0 + 10 * SECOND, "a", 1.0)))
    assert first.responses.wait_for("point", 5, timeout=120)[-1].fieldsDouble["avg"] == 2.0
    assert "Spark's JVM exited (code -9)" in server.log()
    (new_jvm,) = java_descendants(server.pid)
    assert new_jvm != jvm
    # ... which serves the next connections too.
    _, points = _moving_avg_session(path, 20)
    assert [p.fieldsDouble["avg"] for p in points] == [0.0, 0.5, 1.5, 2.5]
    assert not first.responses.of("error")
    server.process.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert "Traceback" not in server.log()


def test_check_says_ok_for_a_live_socket_udf_and_one_line_why_not_otherwise(servers, sock_dir):
    path = os.path.join(sock_dir, "probed.sock")
    servers.start(path, "mirror")
    check = [sys.executable, "-m", "udf_agent", "check", "--socket"]
    healthy = subprocess.run([*check, path], capture_output=True, text=True, timeout=60)
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.startswith(f"OK {path}: stream -> stream; Info answered in ")
    # No server at all: one line, exit 1.
    missing = subprocess.run([*check, os.path.join(sock_dir, "none.sock")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and "no socket at this path" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    # Something listens but never answers: the timeout, then one line.
    silent_path = os.path.join(sock_dir, "silent.sock")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.bind(silent_path)
        silent.listen()
        started = time.monotonic()
        stuck = subprocess.run([*check, silent_path, "--timeout", "1s"], capture_output=True, text=True, timeout=60)
        assert time.monotonic() - started < 5
    assert stuck.returncode == 1 and "no info answer within the timeout" in stuck.stderr, stuck.stderr


@pytest.mark.spark
def test_a_task_outlives_150_others_coming_and_going_and_keeps_its_history(servers, sock_dir):
    # Each passing task has its own options, so its own job on the resident workers: far
    # more than a worker keeps, so the long-lived task's job is let go and must be sent again.
    path = os.path.join(sock_dir, "long.sock")
    server = servers.start(path, "moving_avg", "--master", "local[2]", "--no-local-while-starting")
    long_lived = SocketDriver.connect(path)
    assert long_lived.init(option("field", "value"), option("size", 3), timeout=120).success
    for t in range(2):
        long_lived.send(udf_pb2.Request(point=grouped_point(T0 + t * SECOND, "a", float(t))))
    long_lived.responses.wait_for("point", 2, timeout=120)
    for n in range(150):
        passing = SocketDriver.connect(path)
        assert passing.init(option("field", "value"), option("size", 2), option("as", f"avg{n}"), timeout=30).success
        passing.send(udf_pb2.Request(point=grouped_point(T0, "b", 1.0)))
        (point,) = passing.responses.wait_for("point", 1, timeout=30)
        assert point.fieldsDouble[f"avg{n}"] == 1.0
        passing.close(timeout=30)
        assert_no_error(passing, f"passing task {n}")
    long_lived.send(udf_pb2.Request(point=grouped_point(T0 + 2 * SECOND, "a", 5.0)))
    points = long_lived.responses.wait_for("point", 3, timeout=60)
    assert_no_error(long_lived, "the long-lived task")
    assert [p.fieldsDouble["avg"] for p in points] == [0.0, 0.5, 2.0], server.log()  # (0 + 1 + 5) / 3: history kept
    long_lived.close(timeout=30)


def test_an_idle_server_waits_in_accept_until_its_idle_exit_could_be_due_and_shutdown_wakes_it(sock_dir):
    """An idle server with --idle-exit does not wake every second to look (CPU an idle task
    would pay); a stop must not wait for the idle exit."""
    from udf_agent.serve.socket_server import UnixSocketServer

    server = UnixSocketServer(os.path.join(sock_dir, "wake.sock"), make_agent=lambda connection: None, idle_exit=600)  # type: ignore[arg-type, return-value]
    looks = []
    until_idle_exit = server._until_idle_exit
    server._until_idle_exit = lambda: looks.append(until_idle_exit()) or looks[-1]  # type: ignore[method-assign]
    server.bind()
    serving = threading.Thread(target=server.serve_forever)
    serving.start()
    time.sleep(2.5)
    assert len(looks) == 1 and 599 < looks[0] <= 600, looks
    asked = time.monotonic()
    server.shutdown()
    serving.join(5)
    assert not serving.is_alive()
    assert time.monotonic() - asked < 0.5
    assert not os.path.exists(os.path.join(sock_dir, "wake.sock"))


def test_a_server_exits_once_idle_for_its_idle_exit_counted_from_its_last_task(sock_dir):
    import socket as sockets
    import threading

    from udf_agent.serve.socket_server import SessionRefused, UnixSocketServer

    ended: list[float] = []

    def one_task(connection):
        ended.append(time.monotonic())  # the task ends here: the server's idle time starts after
        raise SessionRefused("the test's task ends at once")

    path = os.path.join(sock_dir, "idle.sock")
    server = UnixSocketServer(path, make_agent=one_task, idle_exit=4.0)  # type: ignore[arg-type]
    server.bind()
    exited: list[float] = []
    serving = threading.Thread(target=lambda: (server.serve_forever(), exited.append(time.monotonic())))
    started = time.monotonic()
    serving.start()
    time.sleep(1.0)  # well inside the idle exit counted from the start
    task = sockets.socket(sockets.AF_UNIX)
    task.connect(path)
    task.close()
    serving.join(60)
    assert exited and ended, "the server never exited, or its task never ran"
    assert exited[0] - ended[0] >= 4.0 and exited[0] - started >= 5.0  # counted from the task's end, not the start
    assert not os.path.exists(path)


# ---------------------------------------------------------------- udf-agent status


def test_status_lists_each_live_task_with_what_went_through_and_disturbs_none(servers, drivers, sock_dir):
    from click.testing import CliRunner

    from udf_agent.cli import main

    path = os.path.join(sock_dir, "mirror.sock")
    server = servers.start(path)
    first, second = drivers(path), drivers(path)
    assert first.init(task_id="cpu_alert", node_id="udf2").success
    assert second.init(task_id="disk_alert", node_id="udf5").success
    for j in range(30):
        first.send(udf_pb2.Request(point=make_point(1, j)))
    for j in range(5):
        second.send(udf_pb2.Request(point=make_point(2, j)))
    first.responses.wait_for("point", 30, timeout=30)
    second.responses.wait_for("point", 5, timeout=30)

    answer = CliRunner().invoke(main, ["status", "--socket", path, "--json"])
    assert answer.exit_code == 0, answer.output
    (status,) = json.loads(answer.output)
    assert (status["kind"], status["target"], status["pid"], status["spark"]) == ("serve", "mirror", server.process.pid, "not started")
    tasks = {task["taskID"]: task for task in status["tasks"]}
    assert set(tasks) == {"cpu_alert", "disk_alert"}
    assert (tasks["cpu_alert"]["nodeID"], tasks["cpu_alert"]["udf"], tasks["cpu_alert"]["points_in"], tasks["cpu_alert"]["points_out"]) == ("udf2", "mirror", 30, 30)
    assert (tasks["disk_alert"]["points_in"], tasks["disk_alert"]["points_out"], tasks["disk_alert"]["last_error"]) == (5, 5, None)

    shown = CliRunner().invoke(main, ["status", "--socket", path])
    assert shown.exit_code == 0, shown.output
    header, *rows = shown.output.splitlines()
    assert header.startswith(f"serve pid {server.process.pid} on {path}") and header.endswith("2 task(s)")
    assert rows[0].split()[:4] == ["TASK", "NODE", "UDF", "UPTIME"]
    assert sorted(row.split()[0] for row in rows[1:]) == ["cpu_alert", "disk_alert"]

    # The sessions never saw the status requests: they go on as before.
    first.send(udf_pb2.Request(point=make_point(1, 30)))
    first.responses.wait_for("point", 31, timeout=30)
    first.close(timeout=30)
    second.close(timeout=30)
    assert_no_error(first, "first")
    # The server drops a session a moment after its output closed: wait for that, not a fixed time.
    deadline = time.monotonic() + 30
    while json.loads(CliRunner().invoke(main, ["status", "--socket", path, "--json"]).output)[0]["tasks"]:
        assert time.monotonic() < deadline, "ended tasks are still listed"
        time.sleep(0.05)


def test_status_of_nothing_listening_says_so_in_one_line(sock_dir, monkeypatch):
    from click.testing import CliRunner

    from udf_agent.cli import main

    missing = CliRunner().invoke(main, ["status", "--socket", os.path.join(sock_dir, "none.sock")])
    assert missing.exit_code == 1 and missing.output.strip() == f"Error: no socket at {os.path.join(sock_dir, 'none.sock')}"
    monkeypatch.setenv("UDF_AGENT_SHARED_DIR", os.path.join(sock_dir, "shared"))
    none_shared = CliRunner().invoke(main, ["status"])
    assert none_shared.exit_code == 1 and "no shared Spark server is running" in none_shared.output


# ---------------------------------------------------------------- --metrics-address


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text exposition, by name and labels."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_count_what_goes_through_each_task_while_it_runs(servers, drivers, sock_dir):
    import re

    path = os.path.join(sock_dir, "mirror.sock")
    server = servers.start(path, "mirror", "--metrics-address", "127.0.0.1:0")
    found = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", server.log())
    assert found, server.log()
    url = found.group(1)
    task = drivers(path)
    assert task.init(task_id="cpu_alert", node_id="udf2").success
    labels = (("node", "udf2"), ("task", "cpu_alert"), ("udf", "mirror"))

    def sample(name: str, extra: tuple[tuple[str, str], ...] = ()) -> float:
        return scrape(url)[(name, tuple(sorted(labels + extra)))]

    for j in range(20):
        task.send(udf_pb2.Request(point=make_point(1, j)))
    task.responses.wait_for("point", 20, timeout=30)
    assert (sample("udf_agent_points_received_total"), sample("udf_agent_points_sent_total")) == (20, 20)
    task.keepalive(time.time_ns())  # stamped with the wall clock, as Kapacitor stamps it
    for j in range(20, 30):
        task.send(udf_pb2.Request(point=make_point(1, j)))
    task.responses.wait_for("point", 30, timeout=30)
    task.responses.wait_for("keepalive", 1, timeout=30)
    assert (sample("udf_agent_points_received_total"), sample("udf_agent_points_sent_total")) == (30, 30)
    assert sample("udf_agent_keepalive_answer_seconds_count") == 1 and sample("udf_agent_keepalive_answer_seconds_bucket", (("le", "1.0"),)) == 1
    assert sample("udf_agent_output_queued_bytes") == 0 and sample("udf_agent_points_dropped_at_stop_total") == 0  # every output was read
    assert sample("udf_agent_points_skipped_total") == 0 and sample("udf_agent_points_dead_lettered_total") == 0
    everything = scrape(url)
    assert everything[("udf_agent_spark_workers_connected", ())] == 0 and ("process_cpu_seconds_total", ()) in everything
    task.close(timeout=30)
    # The task's output ends before the server lets its session go: wait for that, not a race.
    deadline = time.monotonic() + 30
    while any(name.startswith("udf_agent_points") for name, _ in scrape(url)):
        assert time.monotonic() < deadline, "an ended task is still scraped 30 s after its end"
        time.sleep(0.05)


def test_metrics_address_that_cannot_be_served_stops_the_server_with_one_line(servers, sock_dir):
    import socket as sockets

    taken = sockets.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken:
        port = taken.getsockname()[1]
        refused = serve_once(os.path.join(sock_dir, "m.sock"), "mirror", "--metrics-address", f"127.0.0.1:{port}")
    assert refused.returncode == 1 and f"Error: cannot serve metrics on 127.0.0.1:{port}: Address already in use" in refused.stderr.decode()
    assert not os.path.exists(os.path.join(sock_dir, "m.sock"))
    wrong = serve_once(os.path.join(sock_dir, "m.sock"), "mirror", "--metrics-address", "9100")
    assert wrong.returncode == 2 and "'9100' is not HOST:PORT" in wrong.stderr.decode()


# ---------------------------------------------------------------- stream_fn / batch_fn


FRESH_FUNCTIONS = """
import pandas as pd

from udf_agent import Option, batch_udf, stream_udf


@stream_udf(options=[Option("factor", float), Option("offset", int, default=0)], compute=False)
def scaled(df, ctx):
    return pd.DataFrame({"value": df["value"] * ctx.options["factor"] + ctx.options["offset"] + BUMP}, index=df.index)


@batch_udf(compute=False)
def per_batch(df, ctx):
    return df
"""


def test_stream_fn_runs_a_function_written_after_the_server_started_and_edited_since(servers, drivers, sock_dir, tmp_path):
    path = os.path.join(sock_dir, "fn.sock")
    servers.start(path, "stream_fn", env={"PYTHONPATH": str(tmp_path)})
    module = tmp_path / "fresh_fns.py"
    module.write_text("BUMP = 0\n" + FRESH_FUNCTIONS)  # after the server is up

    def task(*opts):
        driver = drivers(path)
        return driver, driver.init(option("fn", "fresh_fns:scaled"), *(option("opt", *pair) for pair in opts))

    def scaled(driver, t, value):
        driver.send(udf_pb2.Request(point=grouped_point(t, "a", value)))
        return driver.responses.wait_for("point", t, timeout=30)[-1].fieldsDouble["value"]

    first, init = task(("factor", "3"), ("offset", "1"))
    assert init.success, init.error
    assert scaled(first, 1, 2.0) == 7.0
    # The module edited on disk: a new task runs the new code, the running one keeps its own.
    module.write_text("BUMP = 100\n" + FRESH_FUNCTIONS)
    os.utime(module, (time.time() + 5, time.time() + 5))
    second, init = task(("factor", "3"))
    assert init.success, init.error
    assert scaled(second, 1, 2.0) == 106.0
    assert scaled(first, 2, 2.0) == 7.0

    # The function's own declarations type and check its options; Kapacitor gets why in the InitResponse.
    for opts, fn, message in (
        ([("factor", "x")], "fresh_fns:scaled", "opt 'factor': 'x' is not DOUBLE"),
        ([("factor", "2"), ("bogus", "1")], "fresh_fns:scaled", "unknown option 'bogus'"),
        ([], "fresh_fns:scaled", "missing required option 'factor'"),
        ([], "fresh_fns:nothing", "module 'fresh_fns' has no attribute 'nothing'"),
        ([], "fresh_fns:per_batch", "fn 'fresh_fns:per_batch' is a batch -> batch UDF; stream_fn runs stream -> stream UDFs"),
    ):
        driver = drivers(path)
        refused = driver.init(option("fn", fn), *(option("opt", *pair) for pair in opts))
        assert not refused.success and message in refused.error, refused.error


def test_info_kapacitor_conf_shows_how_to_call_stream_fn():
    from click.testing import CliRunner

    from udf_agent.cli import main

    shown = CliRunner().invoke(main, ["info", "stream_fn", "--kapacitor-conf", "pyStream"])
    assert shown.exit_code == 0, shown.output
    assert 'args = ["run", "stream_fn"]' in shown.output
    assert "@pyStream().fn('mypkg.mymod:rolling_sum').opt('window', '10s')" in shown.output


def test_batch_fn_runs_a_batch_function_batch_by_batch(servers, drivers, sock_dir, tmp_path):
    path = os.path.join(sock_dir, "bfn.sock")
    servers.start(path, "batch_fn", env={"PYTHONPATH": str(tmp_path)})
    (tmp_path / "batch_fns.py").write_text("BUMP = 0\n" + FRESH_FUNCTIONS)
    task = drivers(path)
    assert task.init(option("fn", "batch_fns:per_batch")).success
    for tmax, values in ((10, (1.0, 2.0)), (20, (3.0,))):
        task.begin(name="cpu", group="host=a", tags={"host": "a"}, size=len(values))
        for i, value in enumerate(values):
            task.point(time=tmax - 5 + i, name="cpu", group="host=a", tags={"host": "a"}, fieldsDouble={"value": value})
        task.end(name="cpu", group="host=a", tags={"host": "a"}, tmax=tmax)
    ends = task.responses.wait_for("end", 2, timeout=30)
    assert [end.tmax for end in ends] == [10, 20]
    assert [p.fieldsDouble["value"] for p in task.responses.of("point")] == [1.0, 2.0, 3.0]
    refused = drivers(path)
    init = refused.init(option("fn", "batch_fns:scaled"), option("opt", "factor", "2"))
    assert not init.success and "batch_fn runs batch -> batch UDFs" in init.error
