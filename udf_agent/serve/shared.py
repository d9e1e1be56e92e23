"""One Spark per host: process UDFs share a server, started by the first task that needs it.

Kapacitor starts a process per task. Unless told ``--own-spark``, ``udf-agent run`` does not
compute: it finds the shared server for its install and Spark settings, starting it if none
is up, and relays Kapacitor's bytes to it (``relay.py``). The server is ``udf-agent
shared-server`` (``shared_server.py``): ``serve`` for any target, with the target and the
task's own options named per connection in a handshake line, so every task shares its one
Spark and resident workers.

Where servers live: a directory only this user may enter (``$UDF_AGENT_SHARED_DIR``, else
``$XDG_RUNTIME_DIR/udf-agent``, else ``/tmp/udf-agent-UID``), one socket per key. The key
digests all that must match for a task to run there as it would in its own process: the
install (package directory, version, Python), the Spark settings, the working directory and
the environment variables Spark and imports read. Anything else gets its own server.

Handshake (one JSON line each way, before any of Kapacitor's bytes): the relay sends
``{"target", "agent"}``; the server answers ``{"pid", "log", "metrics_address", "metrics_url",
"idle_exit"}`` (its metrics endpoint and idle exit, those of the task that started it, which the
relay compares with what its own task asked for), or ``{"error"}`` and closes.

Remembered launches: a task that joined a server leaves ``<launch key>.launch`` next to its
socket (the server's key and the handshake its command line came to). The launch key digests
what the server key does, with the raw command line and the environment the command line
reads in place of the parsed settings, so the next task started with the same command line
joins that server without parsing it (``entry.py``): Kapacitor's Info is answered sooner.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from udf_agent import __version__
from udf_agent.redaction import is_secret

log = logging.getLogger(__name__)

SHARED_DIR_ENV = "UDF_AGENT_SHARED_DIR"
# Environment variables that change what a task computes or how Spark starts.
KEYED_ENVIRONMENT = ("PYTHONPATH", "JAVA_HOME", "SPARK_HOME", "SPARK_CONF_DIR", "PYSPARK_PYTHON", "SPARK_LOCAL_IP")
# Environment variables the command line reads options from (--remote, --own-spark).
OPTION_ENVIRONMENT = ("SPARK_REMOTE", "UDF_AGENT_OWN_SPARK")
# How long a task waits for a server it started to listen (its imports, not Spark).
START_TIMEOUT = 60.0
# A handshake line is a few hundred bytes; anything past this is not one.
MAX_HANDSHAKE = 64 * 1024
# A server's log is kept across restarts (the last one's crash is in it) up to this size.
MAX_LOG_BYTES = 10 * 1024 * 1024


class SharedServerError(Exception):
    """No shared server can be reached or started; the message says why."""


class SharedServer(NamedTuple):  # not a dataclass: a relay starts ~6 ms sooner without
    """Where the shared server for one key lives."""

    directory: str
    key: str

    @property
    def socket_path(self) -> str:
        return os.path.join(self.directory, f"{self.key}.sock")

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, f"{self.key}.log")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.directory, f"{self.key}.lock")


def shared_directory() -> str:
    """The private directory of this user's shared servers, created if needed (mode 0700);
    SharedServerError if it exists but others may enter it or it is not this user's."""
    configured = os.environ.get(SHARED_DIR_ENV)
    if configured:
        directory = configured
    elif os.environ.get("XDG_RUNTIME_DIR"):
        directory = os.path.join(os.environ["XDG_RUNTIME_DIR"], "udf-agent")
    else:
        directory = os.path.join("/tmp", f"udf-agent-{os.getuid()}")
    directory = os.path.abspath(directory)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        raise SharedServerError(f"cannot create the shared servers' directory {directory}: {exc.strerror}") from None
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise SharedServerError(f"{directory} is not a directory (a symlink?); refusing to keep shared servers' sockets there")
    if info.st_uid != os.getuid():
        raise SharedServerError(f"{directory} belongs to uid {info.st_uid}, not to this user ({os.getuid()}); set {SHARED_DIR_ENV} or use --own-spark")
    if info.st_mode & 0o077:
        raise SharedServerError(
            f"{directory} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); run 'chmod 700 {directory}', set {SHARED_DIR_ENV}, or use --own-spark"
        )
    return directory


def server_key(settings: dict[str, Any]) -> str:
    """What a task must share with a server to run there: install, Spark settings, and
    the working directory and environment its imports and Spark see."""
    return _digest(settings=settings)


def launch_key(argv: list[str]) -> str:
    """The server key's counterpart for a raw command line (see "Remembered launches")."""
    return _digest(argv=argv, options_environment={name: os.environ.get(name) for name in OPTION_ENVIRONMENT})


def _digest(**what: Any) -> str:
    identity = {
        "version": __version__,
        "package": os.path.dirname(os.path.realpath(__file__)),
        "python": os.path.realpath(sys.executable),
        "cwd": os.getcwd(),
        "environment": {name: os.environ.get(name) for name in KEYED_ENVIRONMENT},
        **what,
    }
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:20]


def locate(settings: dict[str, Any]) -> SharedServer:
    return SharedServer(shared_directory(), server_key(settings))


class ServerOptions(NamedTuple):
    """The options a shared server takes from the task that starts it; None where not given.
    A server already up keeps its own: a task that asked otherwise is told (``options_not_used``)."""

    metrics_address: str | None = None  # --metrics-address
    idle_exit: float | None = None  # --shared-idle-exit, in seconds


class Launch(NamedTuple):
    """What a command line came to when a task started with it joined its server."""

    server: SharedServer
    hello: dict[str, Any]  # the handshake: target and the task's own options
    log_level: str
    log_format: str
    asked_of_server: ServerOptions
    # How to start the server again, for a task carried over after it died (None: a record of
    # an earlier version, whose tasks fail with their server as before).
    start: ServerStart | None = None


class ServerStart(NamedTuple):
    """What starting a shared server takes, besides where it lives."""

    settings: dict[str, Any]
    idle_exit: float
    server_args: list[str]

    def join(self, server: SharedServer, hello: dict[str, Any]) -> Welcome:
        return join(server, self.settings, self.idle_exit, hello, self.server_args)


def remember_launch(argv: list[str], launch: Launch) -> None:
    """Records ``launch`` for the next task started with ``argv`` (written whole or not at all)."""
    path = os.path.join(launch.server.directory, f"{launch_key(argv)}.launch")
    if launch.start is not None and any(is_secret(name) for name, _ in launch.start.settings.get("confs", ())):
        # Secrets are never written: the next task parses its command line, as the first did.
        log.info("this launch is not remembered: a --conf of it holds a secret (%s)", ", ".join(name for name, _ in launch.start.settings["confs"] if is_secret(name)))
        return
    record = {"server": launch.server.key, "hello": launch.hello, "log_level": launch.log_level, "log_format": launch.log_format, "asked_of_server": launch.asked_of_server._asdict()}
    if launch.start is not None:
        record["start"] = launch.start._asdict()
    temporary = f"{path}.{os.getpid()}"
    try:
        with open(temporary, "w", encoding="utf-8") as out:
            json.dump(record, out)
        os.replace(temporary, path)
    except OSError as exc:  # the task runs all the same; the next one parses its command line
        log.warning("could not remember this launch in %s: %s", path, exc.strerror)


def recall_launch(argv: list[str]) -> Launch | None:
    """What ``argv`` came to last time, if a task started with it has joined a server."""
    directory = shared_directory()
    try:
        with open(os.path.join(directory, f"{launch_key(argv)}.launch"), encoding="utf-8") as f:
            record = json.load(f)
        return Launch(
            SharedServer(directory, str(record["server"])),
            dict(record["hello"]),
            str(record["log_level"]),
            str(record.get("log_format", "text")),
            ServerOptions(**record.get("asked_of_server", {})),  # none in a record of an earlier version
            ServerStart(**record["start"]) if "start" in record else None,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged record: the command line is parsed afresh
        log.warning("ignoring the remembered launch for this command line: %s", exc)
        return None


def rejoin(launch: Launch) -> Welcome | None:
    """A connection to the server a remembered launch joined, past the handshake; None if it
    no longer listens or closes first (the command line is then parsed and the server found
    or started as on a first launch)."""
    sock = _connect(launch.server.socket_path)
    if sock is None:
        return None
    return _greet(sock, answer_line(launch.hello), started=None)


class Welcome(NamedTuple):
    """The server's answer to a relay's handshake."""

    sock: socket.socket
    pid: int
    log: str
    started: subprocess.Popen[bytes] | None  # when this task started the server
    started_with: ServerOptions | None  # as the task that started it asked
    metrics_url: str | None  # where it serves its metrics


def options_not_used(welcome: Welcome, asked: ServerOptions) -> list[str]:
    """A notice for each thing the task asked of its server that the server, started by an
    earlier task with other options, does otherwise."""
    from udf_agent.serve.metrics import parse_address

    served = welcome.started_with
    if served is None:
        return []
    notices = []
    if asked.metrics_address is not None:
        ignored = f"(this task's --metrics-address {asked.metrics_address} is not used)"
        if served.metrics_address is None:
            notices.append(f"the shared server serves no metrics: the task that started it gave no --metrics-address {ignored}")
        elif parse_address(served.metrics_address) != parse_address(asked.metrics_address):
            notices.append(f"metrics are served by the shared server at {welcome.metrics_url} {ignored}")
    if asked.idle_exit is not None and asked.idle_exit != served.idle_exit:
        notices.append(f"the shared server exits after {served.idle_exit:g} s without tasks (this task's --shared-idle-exit {asked.idle_exit:g} s is not used)")
    return notices


def join(server: SharedServer, settings: dict[str, Any], idle_exit: float, hello: dict[str, Any], server_args: Sequence[str] = ()) -> Welcome:
    """A connection to the shared server, started first if none listens (with ``server_args``
    on its command line: how it logs, its metrics), past the handshake.

    SharedServerError when it cannot be started, or refuses the task (its answer says why)."""
    started: subprocess.Popen[bytes] | None = None
    for _ in range(3):  # a server that exits (idle) as we connect is started afresh
        sock = _connect(server.socket_path)
        if sock is None:
            with _locked(server.lock_path):
                sock = _connect(server.socket_path)
                if sock is None:
                    started = _start(server, settings, idle_exit, server_args)
                    sock = _wait_listening(server, started)
        welcome = _greet(sock, answer_line(hello), started)
        if welcome is not None:
            return welcome
    raise SharedServerError(f"the shared server at {server.socket_path} closed every connection before answering; its log: {server.log_path}")


def _greet(sock: socket.socket, hello: bytes, started: subprocess.Popen[bytes] | None) -> Welcome | None:
    """The handshake on a fresh connection: None if the server closed it first (it was
    exiting, idle), SharedServerError if it refused the task."""
    try:
        sock.sendall(hello)
        answer = read_line(sock.recv)
    except OSError:
        answer = None
    if answer is None:
        sock.close()
        return None
    reply = json.loads(answer)
    if "error" in reply:
        sock.close()
        raise SharedServerError(str(reply["error"]))
    # A server of an earlier install of this version does not say how it was started.
    started_with = ServerOptions(reply["metrics_address"], float(reply["idle_exit"])) if "idle_exit" in reply else None
    return Welcome(sock, int(reply["pid"]), str(reply["log"]), started, started_with, reply.get("metrics_url"))


def read_line(receive: Callable[[int], bytes]) -> bytes | None:
    """One handshake line (without its newline), None if the peer closed first. The peer
    sends nothing after it until answered, so this never reads past it."""
    line = bytearray()
    while not line.endswith(b"\n"):
        chunk = receive(MAX_HANDSHAKE)
        if not chunk:
            return None
        line += chunk
        if len(line) > MAX_HANDSHAKE:
            raise ValueError(f"handshake line longer than {MAX_HANDSHAKE} bytes")
    return bytes(line[:-1])


def answer_line(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer).encode() + b"\n"


def server_alive(welcome: Welcome) -> bool:
    """Whether the server process still runs (a zombie does not)."""
    if welcome.started is not None:
        return welcome.started.poll() is None
    try:
        with open(f"/proc/{welcome.pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def shared_server_pids(directory: str) -> list[int]:
    """The live shared servers whose sockets are in ``directory``: found by command line, and
    each leads its own session (``_start``). A child the server forks (to start Spark's JVM)
    has the same command line until it execs, and is no second server."""
    prefix = os.fsencode(os.path.join(directory, ""))
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
            if b"shared-server" not in argv or not any(arg.startswith(prefix) for arg in argv):
                continue
            with open(f"/proc/{entry}/stat", "rb") as f:
                session = int(f.read().rsplit(b")", 1)[1].split()[3])  # after state, ppid, pgrp
        except (OSError, IndexError, ValueError):
            continue
        if session == int(entry):
            pids.append(int(entry))
    return pids


def _connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
            return None
        raise SharedServerError(f"cannot connect to the shared server at {path}: {exc.strerror}") from None
    return sock


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    """One task at a time starts a server for a key; the others then find it listening."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _start(server: SharedServer, settings: dict[str, Any], idle_exit: float, server_args: Sequence[str]) -> subprocess.Popen[bytes]:
    if os.path.exists(server.log_path) and os.path.getsize(server.log_path) > MAX_LOG_BYTES:
        os.replace(server.log_path, server.log_path + ".1")
    argv = [
        sys.executable,
        "-m",
        "udf_agent",
        "shared-server",
        "--socket",
        server.socket_path,
        "--idle-exit",
        f"{idle_exit}s",
        # On its stdin, not its command line, which anyone on the host can read (ps): a --conf
        # may hold a secret (spark.authenticate.secret).
        "--settings",
        "-",
        *server_args,
    ]
    with open(server.log_path, "ab") as log:
        # Its own session: Kapacitor stopping or killing this task's process leaves it be.
        # No descriptor of ours is inherited: Kapacitor must see our stdout close with us.
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, close_fds=True)
    assert process.stdin is not None
    try:
        with process.stdin:
            process.stdin.write(json.dumps(settings, sort_keys=True).encode())
    except BrokenPipeError:
        pass  # it exited at once: _wait_listening reports it, with its log
    return process


def _wait_listening(server: SharedServer, process: subprocess.Popen[bytes]) -> socket.socket:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        sock = _connect(server.socket_path)
        if sock is not None:
            return sock
        code = process.poll()
        if code is not None:
            raise SharedServerError(f"the shared server exited with code {code} before listening; {_log_tail(server.log_path)}")
        if time.monotonic() > deadline:
            raise SharedServerError(f"the shared server did not listen on {server.socket_path} within {START_TIMEOUT:g} s; its log: {server.log_path}")
        time.sleep(0.02)


def _log_tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 2000))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return f"its log: {path}"
    return f"the end of its log ({path}): {lines[-1] if lines else '(empty)'}"
