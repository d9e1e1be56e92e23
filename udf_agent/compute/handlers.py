"""Kapacitor's own Python UDF scripts (``kapacitor.udf.agent``'s ``Handler``), hosted.

A script written for Kapacitor's Python agent ends in a ``__main__`` block that builds an
``Agent`` and a ``Handler`` and starts the agent (directly, or in a ``Server``'s accepter).
Here that block runs in *capture* mode: ``Agent.start()`` hands over the agent, whose
``handler`` the block has set, and ends the block. Each task's handler is built so, by the
script's own code, in a namespace of its own, where the task computes (a resident Spark
worker). A ``HandlerHost`` then feeds it Kapacitor's requests in order, as Kapacitor's agent
does, and gathers what it writes, refusing the responses that would crash kapacitord.

What rebuilds a task's handler elsewhere (a worker lost, a new shared server) is its Init,
its own last ``snapshot()`` and the requests since (``HandlerLog``).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib.util
import io
import json
import logging
import os
import sys
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from udf_agent import udf_pb2
from udf_agent.api import HandlerScript
from udf_agent.wire.frames import POINT_KEY, encode_varint, frame_spans, read_varint

log = logging.getLogger(__name__)

# The first bytes of a relayed task's checkpoint that carries a handler's rebuild, not a
# snapshot the handler made: nothing a Kapacitor snapshot starts with.
CHECKPOINT_MAGIC = b"\x00udf-agent handler checkpoint v1\x00"
# The handler's own snapshot() is asked for (and the requests kept since dropped) this often,
# or once this many bytes of requests are kept, whichever comes first.
SNAPSHOT_EVERY = 5.0
SNAPSHOT_AFTER_BYTES = 4 * 1024 * 1024
# A handler without a usable snapshot() is rebuilt by replaying every request; past this
# many bytes kept, a lost worker fails the task instead.
MAX_REPLAY_BYTES = 256 * 1024 * 1024

_MANAGEMENT = frozenset({"info", "init", "snapshot", "restore"})
# A frame's length prefix when the body is shorter than 128 bytes (a point's usually is not).
_ONE_BYTE_LENGTHS = [bytes([size]) for size in range(0x80)]


class ScriptError(Exception):
    """A script gives no handler, or one that cannot be rebuilt: the message says why."""


class HandlerCaptured(BaseException):
    """Raised by ``Agent.start()`` in capture mode to end the script's ``__main__`` block;
    a BaseException, so a script's ``except Exception`` does not swallow it."""

    def __init__(self, agent: Any):
        super().__init__("captured")
        self.agent = agent


_capture = threading.local()
_capture_lock = threading.Lock()  # sys.argv is the process's: one capture at a time


def capturing() -> bool:
    """Whether a script's ``__main__`` block is running to hand over its handler."""
    return getattr(_capture, "on", False)


def load_script(path: str, args: tuple[str, ...] = ()) -> HandlerScript:
    """The script at ``path`` with its Info (its ``__main__`` block runs here once, as
    every task's will where it computes)."""
    path = os.path.abspath(path)
    try:
        with open(path, encoding="utf-8") as source_file:
            source = source_file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScriptError(f"cannot read the script {path}: {exc}") from None
    script = HandlerScript(path, source, tuple(args))
    host = HandlerHost(script)
    try:
        info = host.handler.info()
    except Exception as exc:
        raise ScriptError(f"{script.name}: its handler's info() failed: {describe_exception(exc)}") from None
    if not isinstance(info, udf_pb2.Response) or info.WhichOneof("message") != "info":
        raise ScriptError(f"{script.name}: its handler's info() must return a Response with info set, got {_what(info)}")
    return HandlerScript(path, source, tuple(args), info.info.SerializeToString())


def kapacitor_agent_origin() -> tuple[str | None, str]:
    """The ``kapacitor.udf.agent`` a script would import here (None: none), and udf-agent's."""
    ours = os.path.realpath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "kapacitor", "udf", "agent.py"))
    try:
        found = importlib.util.find_spec("kapacitor.udf.agent")
    except (ImportError, ValueError):
        return None, ours
    return (os.path.realpath(found.origin) if found is not None and found.origin else None), ours


def capture(script: HandlerScript) -> Any:
    """Runs the script's ``__main__`` block until it starts its Agent; that agent, whose
    ``handler`` is set."""
    origin, ours = kapacitor_agent_origin()
    if origin != ours:
        # Kapacitor's own agent would read this process's stdin and never hand the handler over.
        raise ScriptError(f"{script.name} would import kapacitor.udf.agent from {origin}, not udf-agent's ({ours}): take Kapacitor's agent directory off PYTHONPATH ('udf-agent doctor' checks it)")
    code = compile(script.source, script.path, "exec")
    namespace: dict[str, Any] = {"__name__": "__main__", "__file__": script.path, "__builtins__": builtins, "__package__": None}
    directory = os.path.dirname(script.path)
    with _capture_lock:
        if directory not in sys.path:  # as `python script.py` puts it first
            sys.path.insert(0, directory)
        saved_argv = sys.argv
        sys.argv = [script.path, *script.args]
        _capture.on = True
        try:
            exec(code, namespace)
        except HandlerCaptured as captured:
            agent = captured.agent
        except SystemExit as exc:
            raise ScriptError(f"{script.name} exited ({exc.code}) before starting its Agent") from None
        except Exception as exc:
            raise ScriptError(f"{script.name}'s __main__ block failed before starting its Agent: {describe_exception(exc)}") from None
        else:
            raise ScriptError(f"{script.name} ran to its end without starting an Agent: its __main__ block must call Agent.start() (or serve a Server)")
        finally:
            _capture.on = False
            sys.argv = saved_argv
    if agent.handler is None:
        raise ScriptError(f"{script.name} started an Agent with no handler set")
    return agent


# Frames of udf-agent's own code (this module, kapacitor.udf.agent): never where a script raised.
_OUR_CODE = (os.path.dirname(__file__), os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "kapacitor"))


def _raised_in(exc: BaseException) -> str:
    """'point (moving_avg.py:97)': the innermost frame of the script's own code in ``exc``'s
    traceback ('' if none)."""
    own = [frame for frame in traceback.extract_tb(exc.__traceback__) if not frame.filename.startswith(_OUR_CODE)]
    return f"{own[-1].name} ({os.path.basename(own[-1].filename)}:{own[-1].lineno})" if own else ""


def describe_exception(exc: BaseException) -> str:
    """'ZeroDivisionError: division by zero (in point (moving_avg.py:97))'."""
    where = _raised_in(exc)
    return f"{type(exc).__name__}: {exc}" + (f" (in {where})" if where else "")


def handler_error(kind: str, exc: BaseException) -> str:
    """The ErrorResponse an exception in a handler becomes: Kapacitor's agent's text, then
    the exception's type and where the script raised it."""
    where = _raised_in(exc)
    return f"error processing request of type {kind}: {exc} [{type(exc).__name__}" + (f" in {where}]" if where else "]")


def _what(value: object) -> str:
    if isinstance(value, udf_pb2.Response):
        return f"a Response holding {value.WhichOneof('message') or 'nothing'}"
    return "None" if value is None else type(value).__name__


class ResponseSink:
    """What a hosted handler writes, as frames; refuses what would harm Kapacitor: an empty
    Response, an EndBatch with no open BeginBatch, a negative BeginBatch.size (each crashes
    kapacitord) and a management reply nobody asked for (taken as the next one's answer)."""

    def __init__(self) -> None:
        self._frames: list[bytes] = []  # written by the thread feeding the handler: no lock
        self.feeding_thread: int | None = None
        self._lock = threading.Lock()
        self._from_other_threads: list[bytes] = []  # Kapacitor's agent lets a handler's own threads write too
        self._batch_open = False

    def write(self, response: Any, flush: bool = False) -> None:
        """``Agent.write_response`` itself (``flush`` means nothing here: a micro-batch's
        output goes out whole): a handler's data (points, batches) or an error."""
        if response is None:
            raise Exception("cannot write None response")  # Kapacitor's agent's words
        body = response.SerializeToString()
        # A Response is one oneof: its bytes start with the key of the field set, so a point
        # (nearly every write) is known without asking upb.
        if body.startswith(POINT_KEY):
            self._append(body)
            return
        kind = response.WhichOneof("message")
        if kind is None:
            raise ValueError("the handler wrote an empty Response (kapacitord crashes on one): refused")
        if kind in _MANAGEMENT:
            raise ValueError(f"the handler wrote a {kind} response itself: Kapacitor would take it as the answer to its next {kind} request (return it from {kind}() instead)")
        if kind == "begin":
            if response.begin.size < 0:
                raise ValueError(f"the handler wrote a BeginBatch of size {response.begin.size} (kapacitord crashes on a negative size): refused")
            self._batch_open = True
        elif kind == "end":
            if not self._batch_open:
                raise ValueError("the handler wrote an EndBatch with no open BeginBatch (kapacitord crashes on one): refused")
            self._batch_open = False
        self._append(body)

    def reply(self, kind: str, response: Any) -> None:
        """What a handler's ``info()``, ``init()``, ``snapshot()`` or ``restore()`` returned."""
        if response is None:
            raise Exception("cannot write None response")
        if not isinstance(response, udf_pb2.Response) or response.WhichOneof("message") != kind:
            raise ValueError(f"{kind}() must return a Response with {kind} set, got {_what(response)}")
        self._append(response.SerializeToString())

    def _append(self, body: bytes) -> None:
        size = len(body)
        frame = _ONE_BYTE_LENGTHS[size] + body if size < 0x80 else encode_varint(size) + body
        if threading.get_ident() == self.feeding_thread:
            self._frames.append(frame)
        else:
            with self._lock:
                self._from_other_threads.append(frame)

    def take(self) -> tuple[bytes, int]:
        """The frames written since the last take (those of the handler's own threads after
        the ones written while it was fed), and how many."""
        frames, self._frames = self._frames, []
        with self._lock:
            frames += self._from_other_threads
            self._from_other_threads = []
        return b"".join(frames), len(frames)


class HandlerHost:
    """One task's handler, fed as Kapacitor's agent feeds it: a request at a time, in order,
    one Request object reused (a handler that keeps a point it was given sees what it would
    see there). Reused for one micro-batch only: upb never frees what a reused message
    parsed (about 600 bytes a point), so Kapacitor's agent, reusing one for the task's life,
    grows without end (600 MB a million points)."""

    def __init__(self, script: HandlerScript):
        self.script = script
        self.agent = capture(script)
        self.handler = self.agent.handler
        self.sink = ResponseSink()
        self.agent._hosted_by(self.sink)

    def feed(self, frames: bytes) -> str | None:
        """Acts on each request in ``frames``; the error that ends the task, if one does."""
        request, handler, sink = udf_pb2.Request(), self.handler, self.sink
        sink.feeding_thread = threading.get_ident()
        for _, start, end in frame_spans(frames):
            body = frames[start:end]
            kind = "unknown"
            try:
                request.ParseFromString(body)
                kind = request.WhichOneof("message") or "unknown"
                if kind == "point":
                    handler.point(request.point)
                elif kind == "begin":
                    handler.begin_batch(request.begin)
                elif kind == "end":
                    handler.end_batch(request.end)
                elif kind == "init":
                    sink.reply(kind, handler.init(request.init))
                elif kind == "snapshot":
                    sink.reply(kind, handler.snapshot())
                elif kind == "restore":
                    sink.reply(kind, handler.restore(request.restore))
                elif kind == "info":
                    sink.reply(kind, handler.info())
                else:
                    log.error("received unhandled request %s", kind)
            except Exception as exc:
                return handler_error(kind, exc)
        return None

    def own_snapshot(self) -> tuple[bytes | None, str | None]:
        """The handler's snapshot, taken for a rebuild (never sent to Kapacitor); else None
        and why."""
        try:
            response = self.handler.snapshot()
        except Exception as exc:
            return None, f"its snapshot() failed: {describe_exception(exc)}"
        if not isinstance(response, udf_pb2.Response) or response.WhichOneof("message") != "snapshot":
            return None, f"its snapshot() returned {_what(response)}"
        return response.snapshot.snapshot, None

    def restore_own(self, snapshot: bytes) -> None:
        response = self.handler.restore(udf_pb2.RestoreRequest(snapshot=snapshot))
        if not isinstance(response, udf_pb2.Response) or response.WhichOneof("message") != "restore" or not response.restore.success:
            problem = response.restore.error if isinstance(response, udf_pb2.Response) and response.HasField("restore") else _what(response)
            raise ScriptError(f"{self.script.name}'s handler refused its own snapshot: {problem}")


@dataclass(frozen=True)
class Rebuild:
    """How to make a task's handler anew: its Init, its last own snapshot (then the Init and
    a restore of it come first) and the requests since, whose output was sent already."""

    init: bytes | None = None
    snapshot: bytes | None = None
    replay: tuple[bytes, ...] = ()
    lost: str | None = None  # why the handler, once it has state, cannot be rebuilt


@dataclass(frozen=True)
class HandlerCall:
    """One micro-batch of a task's requests for its handler."""

    task: str
    script: HandlerScript
    frames: bytes
    rebuild: Rebuild
    take_snapshot: bool = False
    forget: tuple[str, ...] = ()  # tasks that ended: their handlers are let go


@dataclass
class HandlerOutcome:
    output: bytes
    error: str | None = None
    printed: str = ""
    snapshot: bytes | None = None
    snapshot_problem: str | None = None
    written: int = 0  # responses in ``output``
    where: str = ""


class HandlerHosts:
    """The handlers of the tasks that compute in this process (a resident worker's, or an
    agent's for in-process tests)."""

    def __init__(self) -> None:
        self._hosts: dict[str, HandlerHost] = {}

    def __contains__(self, task: str) -> bool:
        return task in self._hosts

    def call(self, call: HandlerCall, rebuild: bool) -> HandlerOutcome:
        for task in call.forget:
            self._hosts.pop(task, None)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):  # print() in a handler is a log line, never output
            if rebuild:
                self._hosts[call.task] = self._rebuilt(call.script, call.rebuild)
            host = self._hosts.get(call.task)
            if host is None:
                raise ScriptError(f"internal error: no handler for task {call.task} here, and no rebuild was sent")
            error = host.feed(call.frames)
            snapshot, problem = host.own_snapshot() if call.take_snapshot and error is None else (None, None)
        if error is not None:
            del self._hosts[call.task]
        output, written = host.sink.take()
        return HandlerOutcome(output, error, printed.getvalue(), snapshot, problem, written=written)

    def forget(self, task: str) -> None:
        self._hosts.pop(task, None)

    @staticmethod
    def _rebuilt(script: HandlerScript, rebuild: Rebuild) -> HandlerHost:
        host = HandlerHost(script)
        steps = [rebuild.init] if rebuild.snapshot is not None and rebuild.init is not None else []
        for frames in steps:
            if host.feed(frames) is not None:
                raise ScriptError(f"{script.name}: rebuilding its handler, Init failed again")
        if rebuild.snapshot is not None:
            host.restore_own(rebuild.snapshot)
        for frames in rebuild.replay:
            error = host.feed(frames)
            if error is not None:
                raise ScriptError(f"{script.name}: rebuilding its handler, the requests it had taken failed again: {error}")
        host.sink.take()  # their output was sent the first time
        return host


@dataclass
class HandlerLog:
    """A task's side of its handler (sans-IO): the task's key where handlers live, and what
    rebuilds the handler, kept small by asking for its own snapshot now and then."""

    task: str = field(default_factory=lambda: uuid.uuid4().hex)
    init: bytes | None = None
    snapshot: bytes | None = None
    replay: list[bytes] = field(default_factory=list)
    replay_bytes: int = 0
    snapshot_at: float = field(default_factory=time.monotonic)
    snapshots_work: bool = True
    rebuildable: bool = True
    forget: list[str] = field(default_factory=list)

    def call(self, script: HandlerScript, frames: bytes, now: float, init: bytes | None = None, force_snapshot: bool = False) -> HandlerCall:
        if init is not None and self.init is None:
            self.init = init
        due = now - self.snapshot_at >= SNAPSHOT_EVERY or self.replay_bytes + len(frames) >= SNAPSHOT_AFTER_BYTES
        forget, self.forget = tuple(self.forget), []
        return HandlerCall(self.task, script, frames, self.rebuild(), take_snapshot=self.snapshots_work and (due or force_snapshot), forget=forget)

    def rebuild(self) -> Rebuild:
        if not self.rebuildable:
            return Rebuild(init=self.init, lost=f"over {MAX_REPLAY_BYTES >> 20} MiB of requests since its last snapshot (it has no usable snapshot())")
        return Rebuild(self.init, self.snapshot, tuple(self.replay))

    def ran(self, call: HandlerCall, outcome: HandlerOutcome, now: float) -> None:
        """After ``call`` ran to ``outcome`` (without an error)."""
        if call.take_snapshot:
            if outcome.snapshot is not None:
                self.snapshot, self.replay, self.replay_bytes, self.snapshot_at = outcome.snapshot, [], 0, now
                return
            self.snapshots_work = False
            log.warning("the handler cannot be snapshotted (%s): a lost worker rebuilds it by replaying every request (up to %d MiB)", outcome.snapshot_problem, MAX_REPLAY_BYTES >> 20)
        if call.frames and self.rebuildable:
            self.replay.append(call.frames)
            self.replay_bytes += len(call.frames)
            if self.replay_bytes > MAX_REPLAY_BYTES:
                self.rebuildable, self.replay, self.replay_bytes = False, [], 0
                log.warning("over %d MiB of requests since the handler's last snapshot: from now on a lost worker fails the task", MAX_REPLAY_BYTES >> 20)

    def checkpoint(self) -> bytes:
        """The rebuild, for a relayed task's checkpoint (``CHECKPOINT_MAGIC`` first)."""
        rebuild = self.rebuild()
        parts = [rebuild.init or b"", rebuild.snapshot or b"", b"".join(rebuild.replay)]
        header = json.dumps({"sizes": [len(part) for part in parts], "snapshot": rebuild.snapshot is not None, "init": rebuild.init is not None}).encode()
        return b"".join([CHECKPOINT_MAGIC, encode_varint(len(header)), header, *parts])

    def adopt(self, checkpoint: bytes) -> None:
        """Takes over a checkpoint (a carried-over task): the handler is rebuilt from it at
        the next call, under a new key; the one built so far is let go."""
        data = memoryview(checkpoint)[len(CHECKPOINT_MAGIC) :]
        length, pos = read_varint(bytes(data[:10]), 0)
        header = json.loads(bytes(data[pos : pos + length]))
        pos += length
        parts = []
        for size in header["sizes"]:
            parts.append(bytes(data[pos : pos + size]))
            pos += size
        self.forget.append(self.task)
        self.task = uuid.uuid4().hex
        self.init = parts[0] if header["init"] else None
        self.snapshot = parts[1] if header["snapshot"] else None
        self.replay = [parts[2]] if parts[2] else []
        self.replay_bytes = len(parts[2])
        self.snapshot_at = time.monotonic()
