#!/usr/bin/env python3
"""Kapacitor's own example UDF scripts, unmodified, on udf-agent and on Kapacitor's official
Python agent, side by side: the same requests to both, every response compared.

    .venv/bin/python benchmarks/kapacitor_scripts.py [--kapacitor-git-dir KAPACITOR.git] \
        [--official-python /tmp/offvenv/bin/python] [--only moving_avg,outliers,mirror] \
        [--harness KAPACITOR-HARNESS [--scenarios moving_avg,...,throughput]]

The three examples of Kapacitor's ``udf/agent/examples`` (``moving_avg.py``, a stream UDF;
``outliers.py``, a batch UDF; ``mirror.py``, a socket ``Server``) are extracted with
``git archive`` (ref ``--kapacitor-ref``, default v1.8.3) into a temporary directory, never into
the repository. Each runs twice per scenario:

- **official**: ``--official-python -u SCRIPT`` with ``PYTHONPATH`` = the extracted
  ``udf/agent/py`` (Kapacitor's own agent library);
- **ours**: this venv's ``python -u SCRIPT``, no ``PYTHONPATH``: the ``kapacitor.udf.agent``
  installed with udf-agent, so the script becomes ``udf-agent run SCRIPT`` relayed to a shared
  server (one for the whole run, in a private directory, started by the first task and killed
  at the end).

A process script is driven over pipes (``udf_agent.testing.KapacitorDriver``), ``mirror.py``
over its socket (``SocketDriver``; the script is started as ``python mirror.py SOCKET`` and each
session is a new connection). Info, Init, Snapshot and Restore wait for their answer as Kapacitor
does; points and batches are written without waiting. A session ends with the end of input (the
agent must answer what it has and close), or, after a request that makes the handler raise,
with the agent closing its output by itself (Kapacitor's agent stops reading and closes).

Responses are compared in order, keepalives aside (our agent answers them ahead of compute):
byte for byte on the serialized Response, except that an ErrorResponse of ours may append
" [ExcType in method (file:line)]" to the official text (the official text must be a prefix).
When the bytes differ but both parse to the same message with map entries (tags, fields) in
another order, the pair is reported as "map order": protobuf's upb serializes maps in its hash
tables' order, which protobuf 7 seeds per process (5.29 does not; Kapacitor's Go side reads
maps, so the order is not observable); ``--strict-bytes`` counts these as differences too. How
each session ended (by whom the output was closed, the exit status, what a write after the end
met) is compared as well (``--ignore-exit-status``: not the exit status).

With ``--harness`` (or ``$HARNESS_BIN``), the shared scenarios of ``../shared/kapacitor-scenarios``
are then run under Kapacitor's own client code (``../shared/kapacitor-harness``), each with the
example it fits, official and ours: moving_avg, kapacitor_server_test_replica, udf_error,
abort_with_backlog (and throughput, when named) with ``moving_avg.py``; outliers_batch with
``outliers.py``; mirror_socket with ``mirror.py`` as the socket server (``-socket``). Each
side's verdict is printed, and the outputs Kapacitor received (``-dump``, first 10,000) are
compared. keepalive_timeout is left out: it drives a process that never answers, no agent.

Exit status 1 on any difference, or a scenario that the official agent passes and ours fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.shared_deployment import shared_directory, shared_env  # noqa: E402
from udf_agent import udf_pb2  # noqa: E402
from udf_agent.testing import KapacitorDriver, SocketDriver, option  # noqa: E402
from udf_agent.wire.frames import read_varint  # noqa: E402

DEFAULT_OFFICIAL_PYTHON = "/tmp/offvenv/bin/python"
EXAMPLES = {"moving_avg": "moving_avg/moving_avg.py", "outliers": "outliers/outliers.py", "mirror": "mirror/mirror.py"}
# What our agent appends to Kapacitor's agent's error text: " [ValueError in point (x.py:12)]".
OUR_ERROR_SUFFIX = re.compile(r" \[\w+( in \S+ \([^()]*:\d+\))?\]$")
T0 = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z in ns
EXIT_STATUS = re.compile(r"exited -?\d+")
ANSWER_TIMEOUT = 240.0  # the first task of ours starts the shared server and Spark
END_TIMEOUT = 120.0


# ---------------------------------------------------------------------------------------------
# Requests


@dataclass
class Op:
    """One step of a session: a request to send (and whether to wait for its answer), or a
    check of how the agent ends."""

    kind: str  # info init snapshot restore point begin end keepalive await_end write_after_end
    request: udf_pb2.Request | None = None
    label: str = ""  # snapshot: where to keep it; restore: which one to send


def info() -> Op:
    return Op("info", udf_pb2.Request(info=udf_pb2.InfoRequest()))


def init(*options: udf_pb2.Option) -> Op:
    return Op("init", udf_pb2.Request(init=udf_pb2.InitRequest(options=options, taskID="scripts", nodeID="udf1")))


def snapshot(label: str) -> Op:
    return Op("snapshot", udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()), label=label)


def restore(label: str = "", text: bytes = b"") -> Op:
    return Op("restore", udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=text)), label=label)


def keepalive(stamp: int) -> Op:
    return Op("keepalive", udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=stamp)))


def point(**fields: Any) -> Op:
    return Op("point", udf_pb2.Request(point=udf_pb2.Point(**fields)))


def sends(points: list[udf_pb2.Point]) -> list[Op]:
    return [Op("point", udf_pb2.Request(point=p)) for p in points]


def batch(name: str, group: str, tags: dict[str, str], points: list[udf_pb2.Point], tmax: int | None = None) -> list[Op]:
    """A batch as Kapacitor writes one: BeginBatch (with its size), the points, EndBatch."""
    tmax = max(p.time for p in points) if tmax is None else tmax
    return [
        Op("begin", udf_pb2.Request(begin=udf_pb2.BeginBatch(name=name, group=group, tags=tags, size=len(points), byName=False))),
        *sends(points),
        Op("end", udf_pb2.Request(end=udf_pb2.EndBatch(name=name, group=group, tmax=tmax, tags=tags, byName=False))),
    ]


def await_end() -> Op:
    """The agent closes its output by itself (after an ErrorResponse) and exits, its input left open."""
    return Op("await_end")


def write_after_end() -> Op:
    """One more point after the agent ended: what does the write meet?"""
    return Op("write_after_end", udf_pb2.Request(point=udf_pb2.Point(name="cpu", time=T0, fieldsDouble={"value": 1.0})))


def stream_point(i: int, group: str, value: float, tags: dict[str, str] | None = None, **extra: Any) -> udf_pb2.Point:
    """A point of measurement ``cpu`` in group ``host=GROUP``, as Kapacitor sends a grouped stream point."""
    tags = {"host": group} if tags is None else tags
    return udf_pb2.Point(
        time=T0 + i * 1_000_000_000,
        name="cpu",
        database="telegraf",
        retentionPolicy="autogen",
        group=",".join(f"{k}={tags[k]}" for k in sorted(tags)),
        dimensions=sorted(tags),
        tags=tags,
        fieldsDouble={"value": value},
        **extra,
    )


@dataclass
class Scenario:
    script: str  # moving_avg, outliers, mirror
    name: str
    sessions: list[list[Op]]  # each session: a new process (a new connection for mirror)
    note: str = ""


def moving_avg_scenarios() -> list[Scenario]:
    rng = random.Random(7)
    groups = ["a", "b", "c", "d"]
    stream = [stream_point(i, groups[i % 4], round(rng.uniform(0, 100), 3)) for i in range(60)]
    # Fields the handler clears (int, string) and one it keeps (bool: moving_avg.py leaves fieldsBool).
    mixed = [stream_point(i, groups[i % 3], float(i % 7), fieldsInt={"n": i}, fieldsString={"s": "x"}, fieldsBool={"ok": True}) for i in range(12)]
    many_tags = [stream_point(i, "h", float(i), tags={"host": f"h{i % 2}", "cpu": f"cpu{i % 3}", "region": "eu", "dc": "x"}) for i in range(12)]
    good = init(option("field", "value"), option("size", 3), option("as", "mean"))
    first, more = stream[:40], stream[40:]
    return [
        Scenario("moving_avg", "Info", [[info()]]),
        Scenario("moving_avg", "Init without size", [[init(option("field", "value"))]]),
        Scenario("moving_avg", "Init size 0, as ''", [[init(option("field", "value"), option("size", 0), option("as", ""))]]),
        Scenario("moving_avg", "Init without options", [[init()]]),
        Scenario("moving_avg", "Init size as DOUBLE", [[init(option("field", "value"), option("size", 3.0))]], "beyond Kapacitor: TICKscript refuses an option of a type Info did not declare"),
        Scenario(
            "moving_avg",
            "points, 4 groups (+ int/string/bool fields, keepalive)",
            [[good, *sends(stream[:30]), keepalive(111), *sends(stream[30:] + mixed)]],
        ),
        Scenario("moving_avg", "points with 4 tags", [[good, *sends(many_tags)]]),
        Scenario(
            "moving_avg",
            "Snapshot, then Restore in a new process",
            [
                [good, *sends(first), snapshot("s1"), *sends(more)],
                [good, restore("s1"), *sends(more), snapshot("s2")],
            ],
        ),
        Scenario("moving_avg", "Restore of a bad snapshot", [[good, restore(text=b"not json"), *sends(stream[:5])]]),
        Scenario(
            "moving_avg",
            "BeginBatch raises",
            [[good, *sends(stream[:5]), *batch("cpu", "host=a", {"host": "a"}, stream[5:6])[:1], await_end(), write_after_end()]],
        ),
        Scenario(
            "moving_avg",
            "EndBatch raises (no BeginBatch)",
            [[good, *sends(stream[:3]), Op("end", udf_pb2.Request(end=udf_pb2.EndBatch(name="cpu", tmax=T0))), await_end(), write_after_end()]],
        ),
    ]


def batch_points(values: list[float], tags: dict[str, str], start: int = 0) -> list[udf_pb2.Point]:
    return [
        udf_pb2.Point(time=T0 + (start + i) * 1_000_000_000, name="cpu", tags=tags, fieldsDouble={"value": v}, group="host=" + tags.get("host", ""), dimensions=["host"])
        for i, v in enumerate(values)
    ]


def outliers_scenarios() -> list[Scenario]:
    rng = random.Random(11)
    a, b = {"host": "a"}, {"host": "b"}
    good = init(option("field", "value"), option("scale", 1.5))
    odd = [1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 100.0]  # the shared scenario's batch: 100 is an outlier
    even = [-50.0, 4.0, 5.0, 5.0, 6.0, 6.0, 7.0, 90.0]
    none = [10.0, 11.0, 12.0, 13.0, 14.0, 15.0]
    ties = [5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 5.0, 40.0]  # iqr 0
    big = [round(rng.gauss(50, 10), 2) for _ in range(101)] + [500.0, -300.0]
    big_even = [round(rng.gauss(0, 1), 3) for _ in range(64)] + [9.0, -9.0]
    small = [3.0, 1.0, 2.0]
    many_tags = {"host": "c", "cpu": "cpu0", "region": "eu", "dc": "x"}
    batches = [
        *batch("cpu", "host=a", a, batch_points(odd, a)),
        *batch("cpu", "host=a", a, batch_points(even, a, 10)),
        *batch("cpu", "host=b", b, batch_points(none, b)),
        *batch("cpu", "host=b", b, batch_points(ties, b, 10)),
        *batch("cpu", "host=a", a, batch_points(big, a, 100)),
        keepalive(222),
        *batch("cpu", "host=b", b, batch_points(big_even, b, 300)),
        *batch("cpu", "host=a", a, batch_points(small, a, 500)),
    ]
    return [
        Scenario("outliers", "Info", [[info()]]),
        Scenario("outliers", "Init without field", [[init(option("scale", 1.5))]]),
        Scenario("outliers", "Init scale 0.5", [[init(option("field", "value"), option("scale", 0.5))]]),
        Scenario("outliers", "Init without options", [[init()]]),
        Scenario("outliers", "batches: odd, even, none, ties, 103, 66, 3 points", [[good, *batches]]),
        Scenario("outliers", "batch with 4 tags", [[good, *batch("cpu", "cpu=cpu0,dc=x,host=c,region=eu", many_tags, batch_points(odd + [-40.0], many_tags))]]),
        Scenario("outliers", "Restore (not implemented)", [[good, restore(text=b"{}"), *batch("cpu", "host=a", a, batch_points(odd, a))]]),
        Scenario("outliers", "Snapshot raises (str into bytes)", [[good, *batch("cpu", "host=a", a, batch_points(odd, a)), snapshot("s"), await_end(), write_after_end()]]),
        Scenario("outliers", "batch of 2 points raises", [[good, *batch("cpu", "host=a", a, batch_points(odd, a)), *batch("cpu", "host=a", a, batch_points([1.0, 2.0], a, 20)), await_end(), write_after_end()]]),
    ]


def mirror_scenarios() -> list[Scenario]:
    def p(i: int, **extra: Any) -> Op:
        return point(time=T0 + i, name="m", **extra)

    points = [
        p(1, fieldsInt={"i": 7}, tags={"t": "1"}),
        p(2, fieldsDouble={"f": 1.5}),
        p(3, fieldsString={"s": "x"}),
        p(4, fieldsBool={"b": True}),
        p(5, fieldsInt={"i": -1}, fieldsDouble={"f": 2.5}, fieldsString={"s": "é"}, fieldsBool={"b": False}, tags={"t": "2"}, group="t=2", dimensions=["t"], database="db", retentionPolicy="rp"),
        p(6, byName=True, fieldsDouble={"f": 0.0}),
        *(p(10 + i, fieldsDouble={"f": float(i)}, tags={"t": str(i % 3)}, group=f"t={i % 3}", dimensions=["t"]) for i in range(30)),
    ]
    many = [p(100 + i, fieldsDouble={"a": 1.0, "b": 2.0, "c": float(i)}, fieldsInt={"x": 1, "y": 2}, tags={"t": "1", "u": "2", "v": "3"}) for i in range(10)]
    return [
        Scenario("mirror", "Info", [[info()]]),
        Scenario("mirror", "Init, points of every field type, 2 connections", [[init(), *points[:20]], [init(), keepalive(333), *points[20:]]]),
        Scenario("mirror", "points with 3 tags, 5 fields", [[init(), *many]]),
        Scenario("mirror", "Restore (not implemented)", [[init(), restore(text=b"x"), *points[:3]]]),
        Scenario("mirror", "Snapshot raises (str into bytes)", [[init(), *points[:3], snapshot("s"), await_end()]]),
        Scenario("mirror", "BeginBatch raises", [[init(), *points[:3], Op("begin", udf_pb2.Request(begin=udf_pb2.BeginBatch(name="m", size=1))), await_end()]]),
    ]


# ---------------------------------------------------------------------------------------------
# Running a side


@dataclass
class SessionResult:
    bodies: list[bytes] = field(default_factory=list)  # every Response frame's body, in order
    end: str = ""
    snapshots: dict[str, bytes] = field(default_factory=dict)
    failure: str = ""  # the side could not be driven (timeout, crash before an answer)
    log: str = ""


@dataclass
class Side:
    name: str  # official / ours
    python: str
    env: dict[str, str]

    def start(self, script: str, socket_path: str | None) -> Any:
        if socket_path is None:
            return KapacitorDriver.command([self.python, "-u", script], env=self.env, cwd=os.path.dirname(script))
        return SocketDriver.connect(socket_path, timeout=60)


def split_frames(data: bytes) -> list[bytes]:
    bodies, pos = [], 0
    while pos < len(data):
        length, pos = read_varint(data, pos)
        bodies.append(data[pos : pos + length])
        pos += length
    return bodies


def kind_of(body: bytes) -> str:
    return udf_pb2.Response.FromString(body).WhichOneof("message") or "none"


def wait_answer(driver: Any, before: int, kind: str, timeout: float) -> str:
    """Waits for the first Response after the first ``before`` that is ``kind`` or an error;
    its kind, or why none came."""
    responses = driver.responses
    deadline = time.monotonic() + timeout
    with responses._reader.arrived:
        while True:
            for message in responses.items[before:]:
                found = message.WhichOneof("message")
                if found in (kind, "error"):
                    return found
            if responses.closed.is_set():
                return "closed"
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "timeout"
            responses._reader.arrived.wait(remaining)


def run_session(side: Side, script: str, ops: list[Op], socket_path: str | None, snapshots: dict[str, bytes], restore_from: dict[str, bytes]) -> SessionResult:
    result = SessionResult()
    driver = side.start(script, socket_path)
    ended = False
    try:
        for op in ops:
            if op.kind == "await_end":
                closed = driver.responses.closed.wait(END_TIMEOUT)
                if not closed:
                    result.end = f"did not close its output within {END_TIMEOUT:.0f} s of the error"
                    break
                if isinstance(driver, KapacitorDriver):
                    try:
                        code = driver.process.wait(END_TIMEOUT)
                        result.end = f"closed its output itself, exited {code}"
                    except subprocess.TimeoutExpired:
                        result.end = "closed its output itself, but did not exit"
                else:
                    result.end = "closed the connection itself"
                ended = True
                continue
            if op.kind == "write_after_end":
                assert op.request is not None
                try:
                    driver.send(op.request)
                    result.end += "; a later write: accepted"
                except (BrokenPipeError, ConnectionError) as exc:
                    result.end += f"; a later write: {type(exc).__name__}"
                continue
            request = op.request
            assert request is not None
            if op.kind == "restore" and op.label:
                request = udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=restore_from[op.label]))
            before = len(driver.responses.items)
            try:
                driver.send(request)
            except (BrokenPipeError, ConnectionError) as exc:
                result.failure = f"writing {op.kind}: {type(exc).__name__}"
                break
            if op.kind in ("info", "init", "snapshot", "restore"):
                got = wait_answer(driver, before, op.kind, ANSWER_TIMEOUT)
                if got == op.kind and op.kind == "snapshot":
                    snapshots[op.label] = driver.responses.of("snapshot")[-1].snapshot
                elif got in ("timeout", "closed"):
                    result.failure = f"no answer to {op.kind} ({got})"
                    break
        if not ended and not result.failure:
            if isinstance(driver, KapacitorDriver):
                try:
                    code = driver.close(END_TIMEOUT)
                    result.end = f"closed its output at the end of input, exited {code}"
                except subprocess.TimeoutExpired:
                    result.failure = "did not exit after the end of input"
            else:
                try:
                    driver.close(END_TIMEOUT)
                    result.end = "closed the connection at the end of input"
                except AssertionError as exc:
                    result.failure = str(exc)
    finally:
        if isinstance(driver, KapacitorDriver):
            driver.kill()
            result.log = driver.log()
        else:
            with contextlib.suppress(OSError):
                driver.sock.close()
        driver.responses.closed.wait(10)
    result.bodies = split_frames(bytes(driver.responses.raw))
    return result


@contextlib.contextmanager
def socket_server(side: Side, script: str, directory: str) -> Iterator[tuple[str, Callable[[], str]]]:
    """``python mirror.py SOCKET`` of a side; its socket path, and its log so far."""
    path = os.path.join(directory, f"{side.name}.sock")
    log_path = os.path.join(directory, f"{side.name}-server.log")
    with open(log_path, "wb") as log:
        process = subprocess.Popen([side.python, "-u", script, path], env={**os.environ, **side.env}, cwd=os.path.dirname(script), stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{side.name}: {os.path.basename(script)} did not listen on {path}: {open(log_path, errors='replace').read()[-2000:]}")
            time.sleep(0.05)
        yield path, lambda: open(log_path, errors="replace").read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


# ---------------------------------------------------------------------------------------------
# Comparing


@dataclass
class Verdict:
    script: str
    scenario: str
    compared: int = 0
    identical: int = 0
    map_order: int = 0
    differences: list[str] = field(default_factory=list)
    exit_status: list[str] = field(default_factory=list)  # differences in the exit status alone, with --ignore-exit-status
    note: str = ""

    def ok(self, strict: bool) -> bool:
        return not self.differences and not (strict and self.map_order)

    def word(self) -> str:
        if self.differences:
            return "NO"
        return "yes" if not self.map_order else "same messages (map order differs)"


def show(body: bytes) -> str:
    message = udf_pb2.Response.FromString(body)
    text = str(message).replace("\n", " ").strip()
    return f"{text[:400]}  [{body.hex()[:120]}{'...' if len(body) > 60 else ''}]"


def compare_bodies(verdict: Verdict, session: int, official: list[bytes], ours: list[bytes]) -> None:
    theirs = [b for b in official if kind_of(b) != "keepalive"]
    mine = [b for b in ours if kind_of(b) != "keepalive"]
    for number, (a, b) in enumerate(zip(theirs, mine), 1):
        verdict.compared += 1
        if a == b:
            verdict.identical += 1
            continue
        ra, rb = udf_pb2.Response.FromString(a), udf_pb2.Response.FromString(b)
        if ra.WhichOneof("message") == rb.WhichOneof("message") == "error":
            if rb.error.error.startswith(ra.error.error) and OUR_ERROR_SUFFIX.fullmatch(rb.error.error[len(ra.error.error) :]):
                verdict.identical += 1
                continue
        elif ra == rb:
            verdict.map_order += 1
            continue
        verdict.differences.append(f"session {session} response {number}: official {show(a)} / ours {show(b)}")
    if len(theirs) != len(mine):
        longer, who = (theirs, "official") if len(theirs) > len(mine) else (mine, "ours")
        extra = longer[min(len(theirs), len(mine)) :]
        verdict.differences.append(f"session {session}: {len(theirs)} responses official, {len(mine)} ours; only {who} sent: " + "; ".join(show(b) for b in extra[:3]) + (" ..." if len(extra) > 3 else ""))


def keepalives_answered(bodies: list[bytes]) -> int:
    return sum(1 for b in bodies if kind_of(b) == "keepalive")


def run_scenario(scenario: Scenario, script: str, sides: dict[str, Side], servers: dict[str, str] | None, ignore_exit_status: bool = False) -> tuple[Verdict, dict[str, list[SessionResult]]]:
    verdict = Verdict(scenario.script, scenario.name, note=scenario.note)
    results: dict[str, list[SessionResult]] = {}
    official_snapshots: dict[str, bytes] = {}
    for name in ("official", "ours"):  # the official side first: its snapshots are what both restore
        side = sides[name]
        snapshots: dict[str, bytes] = {}
        results[name] = []
        for ops in scenario.sessions:
            socket_path = servers[name] if servers else None
            # The official side restores what it snapshotted; ours gets the very same bytes.
            restore_from = snapshots if name == "official" else official_snapshots
            results[name].append(run_session(side, script, ops, socket_path, snapshots, restore_from))
        if name == "official":
            official_snapshots = snapshots
    for number, (a, b) in enumerate(zip(results["official"], results["ours"]), 1):
        for who, result in (("official", a), ("ours", b)):
            if result.failure:
                verdict.differences.append(f"session {number}: {who} failed: {result.failure}" + (f"; its log: {result.log[-1500:]}" if result.log else ""))
        compare_bodies(verdict, number, a.bodies, b.bodies)
        if a.end != b.end:
            if ignore_exit_status and EXIT_STATUS.sub("", a.end) == EXIT_STATUS.sub("", b.end):
                verdict.exit_status.append(f"session {number}: official {a.end!r} / ours {b.end!r}")
            else:
                verdict.differences.append(f"session {number}: official {a.end!r} / ours {b.end!r}")
        sent = sum(1 for op in scenario.sessions[number - 1] if op.kind == "keepalive")
        for who, result in (("official", a), ("ours", b)):
            if sent and keepalives_answered(result.bodies) != sent and not result.failure:
                verdict.differences.append(f"session {number}: {who} answered {keepalives_answered(result.bodies)} of {sent} keepalives")
    return verdict, results


# ---------------------------------------------------------------------------------------------
# The shared harness scenarios (Kapacitor's own client code) with the example scripts

SCENARIO_DIR = os.path.join(os.path.dirname(REPO), "shared", "kapacitor-scenarios")
# Which example each scenario drives (run-all.sh drives the built-ins instead); keepalive_timeout
# is left out: it drives `sleep 3600`, a UDF that never answers, not an agent.
SCENARIO_SCRIPTS = {
    "moving_avg": "moving_avg",
    "kapacitor_server_test_replica": "moving_avg",
    "udf_error": "moving_avg",
    "abort_with_backlog": "moving_avg",
    "throughput": "moving_avg",
    "outliers_batch": "outliers",
    "mirror_socket": "mirror",
}
DEFAULT_SCENARIOS = "moving_avg,kapacitor_server_test_replica,udf_error,abort_with_backlog,outliers_batch,mirror_socket"
VERDICT = re.compile(r"^(PASS|FAIL) ")


@dataclass
class ScenarioRun:
    verdict: str = ""
    code: int | None = None
    seconds: float = 0.0
    outputs: list[dict[str, Any]] = field(default_factory=list)
    log_tail: str = ""

    @property
    def passed(self) -> bool:
        return self.code == 0 and self.verdict.startswith("PASS ")


def run_harness_scenario(harness: str, scenario: str, side: Side, script: str, directory: str, deadline_s: int) -> ScenarioRun:
    """One scenario under Kapacitor's client, the UDF being ``side``'s python running ``script``
    (a socket server for mirror_socket), as run-all.sh runs it (keepalive 10 s)."""
    name = os.path.splitext(os.path.basename(scenario))[0]
    dump = os.path.join(directory, f"{name}-{side.name}.outputs.jsonl")
    argv = [harness, "-name", name, "-keepalive", "10s", "-deadline", f"{deadline_s}s", "-dump", dump]
    program = [side.python, "-u", script]
    if SCENARIO_SCRIPTS[name] == "mirror":
        argv += ["-socket", os.path.join(directory, f"{name}-{side.name}.sock")]
        program.append("{socket}")
    started = time.monotonic()
    run = ScenarioRun()
    try:
        done = subprocess.run([*argv, scenario, "--", *program], env={**os.environ, **side.env}, cwd=os.path.dirname(script), capture_output=True, text=True, timeout=deadline_s + 60)
        run.code = done.returncode
        lines = done.stdout.strip().splitlines()
        run.verdict = lines[-1] if lines and VERDICT.match(lines[-1]) else f"no verdict (exit {done.returncode})"
        run.log_tail = done.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        run.verdict = f"harness did not end within {deadline_s + 60} s"
        run.log_tail = (exc.stderr or b"")[-3000:].decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")[-3000:]
    run.seconds = time.monotonic() - started
    if os.path.exists(dump):
        with open(dump) as lines_in:
            run.outputs = [{k: v for k, v in json.loads(line).items() if k != "at_s"} for line in lines_in if line.strip()]
    return run


def scenario_verdicts(harness: str, scenarios: list[str], sides: dict[str, Side], agent_dir: str, directory: str, deadline_s: int) -> list[tuple[str, str, ScenarioRun, ScenarioRun, str]]:
    rows = []
    for name in scenarios:
        scenario = os.path.join(SCENARIO_DIR, f"{name}.jsonl")
        script = os.path.join(agent_dir, "examples", EXAMPLES[SCENARIO_SCRIPTS[name]])
        runs = {who: run_harness_scenario(harness, scenario, side, script, directory, deadline_s) for who, side in sides.items()}
        official, ours = runs["official"], runs["ours"]
        if official.outputs == ours.outputs:
            same = f"yes ({len(ours.outputs)} outputs)"
        else:
            first = next((i for i, (a, b) in enumerate(zip(official.outputs, ours.outputs)) if a != b), min(len(official.outputs), len(ours.outputs)))
            same = f"NO: {len(official.outputs)} official, {len(ours.outputs)} ours; first difference at output {first + 1}"
            print(f"    official output {first + 1}: {official.outputs[first] if first < len(official.outputs) else '-'}", flush=True)
            print(f"    ours output {first + 1}: {ours.outputs[first] if first < len(ours.outputs) else '-'}", flush=True)
        print(f"  {name} ({os.path.basename(script)}): official {official.verdict[:300]} ({official.seconds:.0f} s) | ours {ours.verdict[:300]} ({ours.seconds:.0f} s) | outputs identical: {same}", flush=True)
        for who, run in runs.items():
            if not run.passed:
                print(f"    {who}'s harness log, last lines:\n      " + "\n      ".join(run.log_tail.strip().splitlines()[-12:]), flush=True)
        rows.append((name, os.path.basename(script), official, ours, same))
    return rows


def extract(git_dir: str, ref: str, directory: str) -> str:
    archive = subprocess.run(["git", f"--git-dir={git_dir}", "archive", ref, "udf/agent"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    return os.path.join(directory, "udf", "agent")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kapacitor-git-dir", default=os.environ.get("KAPACITOR_GIT_DIR"), help="git dir of influxdata/kapacitor (or $KAPACITOR_GIT_DIR)")
    parser.add_argument("--kapacitor-ref", default="v1.8.3", help="the ref whose udf/agent is extracted (default: %(default)s)")
    parser.add_argument("--official-python", default=DEFAULT_OFFICIAL_PYTHON, help="the Python that runs the official agent, with its protobuf (default: %(default)s)")
    parser.add_argument("--only", default="moving_avg,outliers,mirror", help="scripts to compare request by request (default: %(default)s; '' for none)")
    parser.add_argument("--strict-bytes", action="store_true", help="count responses that differ only in the order of map entries as differences")
    parser.add_argument("--ignore-exit-status", action="store_true", help="a session that ends alike but with another exit status is not a difference (Kapacitor 1.8.3 keeps the ErrorResponse as the task's error and ignores a non-zero exit after it)")
    parser.add_argument("--ours-env", action="append", default=[], metavar="NAME=VALUE", help="extra environment for our side (e.g. PYTHONPATH=DIR to try a patched udf-agent), repeatable")
    parser.add_argument("--harness", default=os.environ.get("HARNESS_BIN"), help="the kapacitor-harness binary (or $HARNESS_BIN): also run the shared harness scenarios with the example scripts, official and ours")
    parser.add_argument("--scenarios", default=DEFAULT_SCENARIOS, help="with --harness: these scenarios (default: %(default)s; also: throughput); '' for none")
    parser.add_argument("--scenario-deadline", type=int, default=900, help="with --harness: seconds one scenario may take (default: %(default)s)")
    parser.add_argument("--verbose", action="store_true", help="print every difference in full and the logs of failed sessions")
    args = parser.parse_args()
    if not args.kapacitor_git_dir:
        parser.error("--kapacitor-git-dir (or $KAPACITOR_GIT_DIR): a git dir of influxdata/kapacitor")
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - EXAMPLES.keys())
    if unknown:
        parser.error(f"--only: unknown {', '.join(unknown)}")
    scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()] if args.harness else []
    unknown = sorted(set(scenarios) - SCENARIO_SCRIPTS.keys())
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)}; known: {', '.join(SCENARIO_SCRIPTS)}")
    if args.harness and not os.access(args.harness, os.X_OK):
        parser.error(f"--harness: {args.harness} is not executable (build it with ../shared/kapacitor-harness/build.sh)")

    work = tempfile.mkdtemp(prefix="kapacitor-scripts-")
    verdicts: list[Verdict] = []
    scenario_rows: list[tuple[str, str, ScenarioRun, ScenarioRun, str]] = []
    try:
        agent_dir = extract(args.kapacitor_git_dir, args.kapacitor_ref, work)
        official_env = {"PYTHONPATH": os.path.join(agent_dir, "py")}
        # cwd: not the repository, whose own kapacitor package `python -c` would import first.
        check = subprocess.run([args.official_python, "-c", "import kapacitor.udf.agent as a, kapacitor.udf.udf_pb2, google.protobuf as p; print(p.__version__, a.__file__)"], env={**os.environ, **official_env}, cwd=work, capture_output=True, text=True)
        found = check.stdout.split()
        if check.returncode != 0 or len(found) != 2 or not found[1].startswith(agent_dir):
            print(f"the official agent does not import with {args.official_python}: {(check.stderr.strip() or check.stdout)[-300:]}", file=sys.stderr)
            return 2
        extra_env = dict(item.split("=", 1) for item in args.ours_env)
        ours_check = subprocess.run([sys.executable, "-c", "import kapacitor.udf.agent as a, google.protobuf as p; print(p.__version__, a.__file__)"], env={**os.environ, "PYTHONPATH": "", **extra_env}, cwd=work, capture_output=True, text=True)
        print(f"Kapacitor {args.kapacitor_ref} examples; official agent on {args.official_python} (protobuf {found[0]}, {found[1]}); ours on {sys.executable} (protobuf {ours_check.stdout.split()[0]}, {ours_check.stdout.split()[1]})", flush=True)
        with shared_directory("kapacitor-scripts-shared-") as shared:
            ours_env = {**shared_env(shared), "PYTHONPATH": "", **extra_env}
            sides = {"official": Side("official", args.official_python, official_env), "ours": Side("ours", sys.executable, ours_env)}
            builders = {"moving_avg": moving_avg_scenarios, "outliers": outliers_scenarios, "mirror": mirror_scenarios}
            for script_name in chosen:
                script = os.path.join(agent_dir, "examples", EXAMPLES[script_name])
                with contextlib.ExitStack() as stack:
                    servers = None
                    if script_name == "mirror":
                        servers = {name: stack.enter_context(socket_server(side, script, work))[0] for name, side in sides.items()}
                    for scenario in builders[script_name]():
                        started = time.monotonic()
                        verdict, results = run_scenario(scenario, script, sides, servers, args.ignore_exit_status)
                        verdicts.append(verdict)
                        ends = " | ".join(f"{who}: {', '.join(r.end for r in rs)}" for who, rs in results.items())
                        print(f"  {script_name} / {scenario.name}: {verdict.word()} ({verdict.compared} compared, {time.monotonic() - started:.1f} s) -- {ends}", flush=True)
                        for difference in verdict.differences:
                            print(f"    DIFFERENCE {difference if args.verbose else difference[:1500]}", flush=True)
            if scenarios:
                print(f"Kapacitor's client ({args.harness}) through the shared scenarios:", flush=True)
                scenario_rows = scenario_verdicts(args.harness, scenarios, sides, agent_dir, work, args.scenario_deadline)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if verdicts:
        print()
        print("| script | scenario | responses compared | identical | note |")
        print("| --- | --- | --- | --- | --- |")
    for v in verdicts:
        detail = v.note
        if v.map_order:
            detail = "; ".join(filter(None, [detail, f"{v.map_order} of {v.compared} equal as messages, map entries in another order"]))
        if v.exit_status:
            detail = "; ".join(filter(None, [detail, "exit status differs (ignored): " + ", ".join(e.split(": ", 1)[1] for e in v.exit_status)]))
        if v.differences:
            detail = "; ".join(filter(None, [detail, f"{len(v.differences)} difference(s), see above"]))
        print(f"| {v.script}.py | {v.scenario} | {v.compared} | {v.word()} | {detail} |")
    failed = [v for v in verdicts if not v.ok(args.strict_bytes)]
    if verdicts:
        print(f"\n{len(verdicts) - len(failed)} of {len(verdicts)} scenarios identical" + (" (map order counted as a difference)" if args.strict_bytes else ""))
    if scenario_rows:
        print("\n| harness scenario | script | official | ours | outputs identical |")
        print("| --- | --- | --- | --- | --- |")
        for name, script_name, official, ours, same in scenario_rows:
            print(f"| {name} | {script_name} | {official.verdict.split(' |')[0]} | {ours.verdict.split(' |')[0]} | {same} |")
    # A scenario counts against us when ours fails where the official agent passes, or when the
    # outputs differ; the official agent failing where ours passes (it can hang in a task stop
    # with output unread: abort_with_backlog) is printed, not counted.
    scenario_failed = [row for row in scenario_rows if (row[2].passed and not row[3].passed) or not row[4].startswith("yes")]
    return 1 if failed or scenario_failed else 0


if __name__ == "__main__":
    sys.exit(main())
