"""Testing UDFs without Kapacitor.

``run_udf`` runs a UDF over a DataFrame (or line protocol) through the real agent
and returns its output as a DataFrame, for a UDF author's own pytest:

    from udf_agent.testing import run_udf

    def test_moving_average():
        data = pandas.DataFrame({"time": pandas.to_datetime([1, 2, 3], unit="s"),
                                 "host": ["a", "a", "a"], "usage": [1.0, 2.0, 3.0]})
        out = run_udf("moving_avg", data, {"field": "usage", "size": 2}, group_by=["host"])
        assert out["avg"].tolist() == [1.0, 1.5, 2.5]

The rest is Kapacitor's side of the protocol.
``KapacitorDriver`` starts ``udf-agent`` as a process and talks to it over
real pipes; ``SocketDriver`` talks to a ``udf-agent serve`` socket;
``InProcessAgent`` runs an agent in this process on a socketpair. All write
frames the way Kapacitor does (the length and the body as two separate
writes), decode Response frames on a thread of their own, and time how long
each KeepaliveRequest takes to be answered.

    from udf_agent.testing import KapacitorDriver, option

    driver = KapacitorDriver("run", "moving_avg")
    assert driver.init(option("field", "value"), option("size", 3)).success
    driver.point(time=1, name="cpu", fieldsDouble={"value": 1.0})
    driver.close()
    points = driver.responses.of("point")
"""

from __future__ import annotations

import datetime
import io
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any, TypeVar

from google.protobuf.message import Message

from udf_agent import udf_pb2
from udf_agent.api import UDF, UDFSpec, as_spec
from udf_agent.options import Duration, timedelta_ns
from udf_agent.tools.harness import ResponseReader, ServedAgent
from udf_agent.tools.lineproto import LinePoint
from udf_agent.wire.frames import encode_frame, read_varint

if TYPE_CHECKING:
    import pandas as pd

    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines

__all__ = ["Duration", "InProcessAgent", "KapacitorDriver", "SocketDriver", "option", "run_udf"]

AGENT = [sys.executable, "-m", "udf_agent"]

# A Python value of a TICKscript literal, as ``option`` takes it.
OptionArgument = bool | int | float | str | Duration | datetime.timedelta
# The values of one call of an option: one value, or a tuple of them.
OptionCall = OptionArgument | tuple[OptionArgument, ...]
# The answer a driver waits for.
Answer = TypeVar("Answer", bound=Message)


def option(name: str, *values: OptionArgument) -> udf_pb2.Option:
    """The InitRequest option of the TICKscript call ``.name(values...)``, each Python value
    typed as TICKscript types its literal: bool BOOL, int INT, float DOUBLE, str STRING,
    ``Duration("10s")`` or a timedelta DURATION."""
    wire = []
    for value in values:
        if isinstance(value, bool):
            wire.append(udf_pb2.OptionValue(type=udf_pb2.BOOL, boolValue=value))
        elif isinstance(value, int):
            wire.append(udf_pb2.OptionValue(type=udf_pb2.INT, intValue=value))
        elif isinstance(value, float):
            wire.append(udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=value))
        elif isinstance(value, str):
            wire.append(udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=value))
        elif isinstance(value, (Duration, datetime.timedelta)):
            ns = value.ns if isinstance(value, Duration) else timedelta_ns(value)
            wire.append(udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=ns))
        else:
            raise TypeError(f"option {name!r}: {value!r} is none of bool, int, float, str, Duration or timedelta")
    return udf_pb2.Option(name=name, values=wire)


def request_frame(request: udf_pb2.Request) -> tuple[bytes, bytes]:
    """A Request's frame cut as Kapacitor writes it: the length, then the body."""
    frame = encode_frame(request)
    _, body_start = read_varint(frame, 0)
    return frame[:body_start], frame[body_start:]


class Responses:
    """Decodes the agent's output as it arrives and keeps every Response."""

    def __init__(self, stream: socket.socket | IO[bytes]):
        self.items: list[udf_pb2.Response] = []
        self.raw = bytearray()
        self.keepalive_seen: dict[int, float] = {}
        self._by_kind: dict[str | None, list[Message]] = {}  # each kind's messages, so waits do not rescan
        self._reader = ResponseReader(stream, self._keep)
        self.closed = self._reader.closed

    @property
    def error(self) -> BaseException | None:
        """What ended reading, when it was not the end of the agent's output."""
        return self._reader.error

    def stop_reading(self) -> None:
        """Leaves the agent's output unread from now on, as Kapacitor does when it aborts a task."""
        self._reader.stop()

    def _keep(self, data: bytes, messages: list[udf_pb2.Response]) -> None:
        now = time.monotonic()
        self.raw += data
        for message in messages:
            kind = message.WhichOneof("message")
            if kind == "keepalive":
                self.keepalive_seen.setdefault(message.keepalive.time, now)
            self.items.append(message)
            self._by_kind.setdefault(kind, []).append(getattr(message, kind) if kind else message)

    def of(self, kind: str) -> list[Message]:
        with self._reader.arrived:
            return list(self._by_kind.get(kind, ()))

    def wait_for(self, kind: str, count: int = 1, timeout: float = 120) -> list[Message]:
        deadline = time.monotonic() + timeout
        with self._reader.arrived:
            while True:
                found = self._by_kind.get(kind, [])
                if len(found) >= count:
                    return list(found)
                if self.closed.is_set():
                    errors = [getattr(message, "error", "") for message in self._by_kind.get("error", [])]
                    raise AssertionError(f"agent closed its output after {len(found)} {kind} response(s); got {self.kinds()}" + (f": {errors}" if errors else ""))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"timed out waiting for {count} {kind} response(s), got {len(found)}")
                self._reader.arrived.wait(remaining)

    def kinds(self) -> list[str | None]:
        return [r.WhichOneof("message") for r in self.items]


class _Driver:
    """What Kapacitor does to an agent, whatever carries the bytes."""

    responses: Responses

    def __init__(self) -> None:
        self._write_lock = threading.Lock()
        self.keepalive_sent: dict[int, float] = {}

    def _write(self, data: bytes) -> None:
        raise NotImplementedError

    def send(self, request: udf_pb2.Request) -> None:
        length, body = request_frame(request)
        with self._write_lock:
            self._write(length)
            self._write(body)

    def send_raw(self, data: bytes) -> None:
        with self._write_lock:
            self._write(data)

    def _ask(self, request: udf_pb2.Request, kind: str, answer: type[Answer], timeout: float) -> Answer:
        """Sends REQUEST and waits for the next Response of KIND."""
        before = len(self.responses.of(kind))
        self.send(request)
        found = self.responses.wait_for(kind, before + 1, timeout=timeout)[-1]
        assert isinstance(found, answer)
        return found

    def info(self, timeout: float = 30) -> udf_pb2.InfoResponse:
        return self._ask(udf_pb2.Request(info=udf_pb2.InfoRequest()), "info", udf_pb2.InfoResponse, timeout)

    def init(self, *options: udf_pb2.Option, timeout: float = 30, task_id: str = "test", node_id: str = "udf1") -> udf_pb2.InitResponse:
        request = udf_pb2.Request(init=udf_pb2.InitRequest(options=options, taskID=task_id, nodeID=node_id))
        return self._ask(request, "init", udf_pb2.InitResponse, timeout)

    def snapshot(self, timeout: float = 180) -> bytes:
        return self._ask(udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()), "snapshot", udf_pb2.SnapshotResponse, timeout).snapshot

    def restore(self, data: bytes, timeout: float = 180) -> udf_pb2.RestoreResponse:
        return self._ask(udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=data)), "restore", udf_pb2.RestoreResponse, timeout)

    def keepalive(self, stamp: int) -> None:
        self.keepalive_sent[stamp] = time.monotonic()
        self.send(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=stamp)))

    def keepalive_latencies(self) -> list[float]:
        """Seconds from each KeepaliveRequest to its answer (inf when never answered)."""
        seen = self.responses.keepalive_seen
        return [seen.get(stamp, float("inf")) - sent for stamp, sent in self.keepalive_sent.items()]

    # The keyword arguments are the protobuf message's own fields, passed through.
    def point(self, **fields: Any) -> None:
        self.send(udf_pb2.Request(point=udf_pb2.Point(**fields)))

    def begin(self, **fields: Any) -> None:
        self.send(udf_pb2.Request(begin=udf_pb2.BeginBatch(**fields)))

    def end(self, **fields: Any) -> None:
        self.send(udf_pb2.Request(end=udf_pb2.EndBatch(**fields)))


class KapacitorDriver(_Driver):
    """Starts ``udf-agent ARGS`` as a process, as Kapacitor would, and talks to it over pipes."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, cwd: str | None = None):
        self._start([*AGENT, *args], env, cwd)

    @classmethod
    def command(cls, argv: list[str], env: dict[str, str] | None = None, cwd: str | None = None) -> KapacitorDriver:
        """Starts the agent with an explicit command line (say the ``udf-agent`` console script)."""
        driver = cls.__new__(cls)
        driver._start(argv, env, cwd)
        return driver

    def _start(self, argv: list[str], env: dict[str, str] | None, cwd: str | None) -> None:
        super().__init__()
        full_env = {**os.environ, **(env or {})}
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=full_env,
            cwd=cwd,
            bufsize=0,
        )
        assert self.process.stdin is not None and self.process.stdout is not None and self.process.stderr is not None
        self._stdin, self._stderr_pipe = self.process.stdin, self.process.stderr
        self.responses = Responses(self.process.stdout)
        self.stderr = bytearray()
        self._stderr_reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._stderr_reader.start()

    def _drain_stderr(self) -> None:
        for line in self._stderr_pipe:
            self.stderr += line

    def _write(self, data: bytes) -> None:
        self._stdin.write(data)

    def close(self, timeout: float = 180) -> int:
        """Closes the agent's stdin as Kapacitor does on stop, and waits for it to exit."""
        self._stdin.close()
        self.responses.closed.wait(timeout)
        return self.process.wait(timeout)

    def abort(self, timeout: float = 180) -> int:
        """A task stop: Kapacitor stops reading the agent's output, closes its stdin and
        waits for it to exit (without limit; here ``timeout``)."""
        self.responses.stop_reading()
        self._stdin.close()
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def log(self) -> str:
        """The agent's stderr so far; all of it once the process has exited."""
        if self.process.poll() is not None:
            self._stderr_reader.join(5)
        return self.stderr.decode(errors="replace")


class SocketDriver(_Driver):
    """Kapacitor's side of one unix socket connection (to a server, or to an in-process agent)."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.responses = Responses(sock)

    @classmethod
    def connect(cls, path: str, timeout: float = 10) -> SocketDriver:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(path)
                return cls(sock)
            except OSError:
                sock.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _write(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self, timeout: float = 180) -> None:
        """Half-closes the connection as Kapacitor does on stop and waits for the agent's end."""
        self.sock.shutdown(socket.SHUT_WR)
        if not self.responses.closed.wait(timeout):
            raise AssertionError("the agent did not close its side")
        self.sock.close()


class InProcessAgent(ServedAgent):
    """An ``Agent`` served on one end of a socketpair, in this process; ``driver`` holds the other end."""

    def __init__(self, spec: UDFSpec, engines: Engines, config: AgentConfig | None = None):
        super().__init__(spec, engines, config)
        self.driver = SocketDriver(self.sock)

    def finish(self, timeout: float = 180) -> int | None:
        self.driver.close(timeout)
        self.join(timeout)
        return self.exit_code


def grouped_point(time: int, group: str, value: float, **extra: Any) -> udf_pb2.Point:
    """A stream point of measurement ``cpu`` grouped by its tag ``group``, with one double field ``value``.

    ``extra`` sets more Point fields (``tags`` are merged).
    """
    tags = {"group": group, **extra.pop("tags", {})}
    return udf_pb2.Point(
        time=time,
        name="cpu",
        group=f"group={group}",
        dimensions=["group"],
        tags=tags,
        fieldsDouble={"value": value},
        **extra,
    )


def reference_stream(**extra: Any) -> list[udf_pb2.Point]:
    """Kapacitor's own moving-average test stream, grouped by tag ``group``.

    Groups a and b carry 1 and 2 at t = 0..9 s, then a=0, b=1 at 10 s and
    0, 0 at 11 s. A 10-point moving average gives a -> 0.9, b -> 1.9 at 10 s.
    ``extra`` sets more Point fields (``tags`` are merged).
    """
    points = []
    for t in range(12):
        for group, value in (("a", 1.0), ("b", 2.0)):
            if t == 10:
                value = 0.0 if group == "a" else 1.0
            elif t == 11:
                value = 0.0
            points.append(grouped_point(t * 1_000_000_000, group, value, **extra))
    return points


def run_udf(
    udf: str | UDFSpec | type[UDF],
    data: pd.DataFrame | str | Iterable[str],
    options: Mapping[str, OptionCall | list[OptionCall]] | None = None,
    *,
    group_by: Sequence[str] = (),
    tags: Sequence[str] = (),
    name: str = "data",
    batch_every: Duration | datetime.timedelta | str | None = None,
    engines: Engines | None = None,
) -> pd.DataFrame:
    """Runs UDF over DATA as Kapacitor would and returns its output points as a DataFrame.

    ``udf`` is a built-in's name, a ``module:attribute`` TARGET, a decorated function or a
    ``udf_agent.UDF`` subclass. ``data`` is a DataFrame with a ``time`` column (datetime64,
    naive meaning UTC, or integer nanoseconds), tag columns (``group_by`` and ``tags``) and
    field columns (everything else; a NaN is a missing field); or line protocol (a string
    or lines). ``options`` map an option's name to its value as TICKscript would pass it:
    a tuple for several values in one call, a list for an option called several times.
    Stream UDFs get the points in time order grouped by ``group_by``; batch UDFs get each
    group's points cut into windows of ``batch_every`` (a Duration, timedelta or "10s").

    The output has ``time`` (datetime64[ns, UTC]), ``name``, the tags, then the fields, one
    row per point in the order the agent sent them. By default micro-batches are computed
    in this process, by the same code Spark's workers run; pass ``engines`` (say
    ``udf_agent.testing.spark_engines()``) to compute on Spark.
    """
    import pandas as pd

    from udf_agent.targets import resolve_target
    from udf_agent.tools.lineproto import read_points
    from udf_agent.tools.replay import in_process_engines, replay_points

    spec = resolve_target(udf) if isinstance(udf, str) else as_spec(udf)
    if isinstance(data, pd.DataFrame):
        points = _points_of_frame(data, name, {*group_by, *tags})
    else:
        lines = [data] if isinstance(data, str) else list(data)
        points = list(read_points(_lines_as_bytes(lines), "data"))
    calls = []
    for option_name, value in (options or {}).items():
        for call in value if isinstance(value, list) else [value]:
            calls.append(option(option_name, *(call if isinstance(call, tuple) else (call,))))
    every_ns = None if batch_every is None else (batch_every if isinstance(batch_every, Duration) else Duration(batch_every)).ns
    outputs = list(replay_points(spec, engines or in_process_engines(), calls, points, group_by=group_by, batch_every_ns=every_ns))
    tag_names = sorted({tag for point in outputs for tag in point.tags})
    field_names = sorted({field for point in outputs for field in point.fields})
    frame = pd.DataFrame(
        {
            "time": pd.to_datetime([point.time for point in outputs], unit="ns", utc=True),
            "name": [point.name for point in outputs],
            **{tag: [point.tags.get(tag) for point in outputs] for tag in tag_names},
            **{field: [point.fields.get(field) for point in outputs] for field in field_names},
        }
    )
    return frame


def _points_of_frame(data: pd.DataFrame, name: str, tag_columns: set[str]) -> list[LinePoint]:
    import math

    import pandas as pd

    if "time" not in data.columns:
        raise ValueError("the DataFrame needs a 'time' column (datetime64 or integer nanoseconds)")
    times = data["time"]
    if pd.api.types.is_datetime64_any_dtype(times):
        stamps = (times.dt.tz_localize("UTC") if times.dt.tz is None else times).astype("int64").tolist()
    else:
        stamps = [int(t) for t in times]
    missing = sorted(tag_columns - set(data.columns))
    if missing:
        raise ValueError(f"no column for the tag(s) {', '.join(missing)}")
    field_columns = [c for c in data.columns if c != "time" and c not in tag_columns]
    points = []
    for row, stamp in zip(data.itertuples(index=False), stamps):
        values = row._asdict() if hasattr(row, "_asdict") else dict(zip(data.columns, row))
        fields = {}
        for column in field_columns:
            value = values[column]
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            fields[column] = value.item() if hasattr(value, "item") else value
        points.append(LinePoint(name, {tag: str(values[tag]) for tag in tag_columns}, fields, stamp))
    return points


def _lines_as_bytes(lines: Sequence[str]) -> io.BytesIO:
    return io.BytesIO("\n".join(lines).encode())


_shared_spark: Engines | None = None


def spark_engines() -> Engines:
    """Engines computing on one embedded Spark shared by every ``run_udf`` call of this
    process (started on first use, ~10 s; stopped when the process exits)."""
    global _shared_spark
    if _shared_spark is None:
        import atexit

        from udf_agent.cli.engines import spark_engines as engines_on

        _shared_spark = engines_on("local[2]", (), local_while_starting=False)
        atexit.register(_shared_spark.stop)
    return _shared_spark
