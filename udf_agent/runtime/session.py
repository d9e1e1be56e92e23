"""Kapacitor's UDF protocol state, sans-IO.

Bytes in, events out, as h11 does it: ``receive_data(bytes)`` cuts what was read into
frames, and ``next_events(now)`` acts on them and returns events for the runtime: frames
to send at once, work for the compute side (in order), or a protocol failure.
``receive_eof`` ends the input. One Request can also be given whole (``receive``).
Time is passed in, never read, so tests drive it.

A session may start before its UDF is known (the UDF's module can take seconds to
import): until ``adopt(spec)`` it answers keepalives and keeps everything else, a
framing error included, for when it is.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from udf_agent import udf_pb2
from udf_agent.api import BindError, UDFSpec
from udf_agent.options import OptionValues, option_info, parse_options
from udf_agent.wire.batches import BatchMicroBatch, HandlerMicroBatch, KapacitorBatch, StreamMicroBatch
from udf_agent.wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameSplitter,
    Piece,
    PointRun,
    ProtocolError,
    RequestRun,
    encode_frame,
    encode_varint,
    parse_message,
    point_frame,
    point_group,
    request_point,
    varint_size,
)
from udf_agent.wire.guard import OutputGuard, keepalive_frame

log = logging.getLogger(__name__)

_EDGE = {"stream": udf_pb2.STREAM, "batch": udf_pb2.BATCH}


@dataclass(frozen=True)
class Send:
    """A frame to write now; urgent frames (keepalives) jump ahead of data."""

    frame: bytes
    urgent: bool = False
    asked_at: int | None = None  # a keepalive answer: the time Kapacitor stamped it with (ns)


@dataclass(frozen=True)
class Emit:
    """Output data, in order with the output of the micro-batches before it."""

    frames: bytes
    points: int = 1  # how many points it carries (they count against the pending budget)


@dataclass(frozen=True)
class Started:
    """Init succeeded: the runtime warms up, then sends ``reply`` (the InitResponse).

    Kapacitor sends no point before the InitResponse, so answering once the hot
    path is loaded costs one wait at task start instead of slow first points.
    """

    options: OptionValues
    reply: bytes | None  # None: a Handler script's handler makes it
    task_id: str = ""
    node_id: str = ""


@dataclass(frozen=True)
class Compute:
    """A closed micro-batch, to be computed in arrival order."""

    batch: StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch


@dataclass(frozen=True)
class TakeSnapshot:
    """Reply to a SnapshotRequest once everything before it is computed."""


@dataclass(frozen=True)
class Restore:
    snapshot: bytes


@dataclass(frozen=True)
class TakeCheckpoint:
    """A relayed task's state once everything before it is computed, for its relay to carry
    the task over to a new server: as of ``input_bytes`` bytes of input, each frame acted on."""

    input_bytes: int
    init_frame: bytes  # the task's InitRequest, to start it afresh


@dataclass(frozen=True)
class Fail:
    """The peer broke the protocol: the task must end with this error."""

    message: str


Event = Send | Emit | Started | Compute | TakeSnapshot | Restore | TakeCheckpoint | Fail


# Frames acted on per ``next_events`` call: the runtime holds its lock for one call, and
# its compute thread must never wait for the lock long.
FRAMES_PER_CALL = 1024

# A request that arrived before the UDF was known, kept for ``adopt``; a run of points
# with the number of the frames before it.
Early = udf_pb2.Request | ProtocolError | tuple[PointRun, int]


class Session:
    def __init__(
        self,
        spec: UDFSpec | None,
        *,
        max_batch_points: int,
        max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
        allow_modules: tuple[str, ...] = (),
    ):
        self._spec = spec
        self.allow_modules = allow_modules
        self.guard = OutputGuard()
        self.options: OptionValues | None = None
        self.max_batch_points = max_batch_points
        self.failed = False
        self._pending: StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch | None = None
        self._open_batch: KapacitorBatch | None = None
        self._splitter = FrameSplitter(max_frame_size)
        self._compiled_splitter: Callable[[FrameSplitter], FrameSplitter] | None = None
        self._pieces: deque[Piece] = deque()
        self._frames_acted_on = 0
        self._bytes_acted_on = 0  # of whole frames, length prefixes included
        self._init_frame: bytes | None = None  # the successful InitRequest's frame
        self._framing_error: ProtocolError | None = None
        self._framing_error_acted_on = False
        self._early: list[Early] = []

    @property
    def spec(self) -> UDFSpec:
        """The UDF; known before any request but a keepalive is acted on."""
        if self._spec is None:
            raise RuntimeError("the session's UDF is not known yet")
        return self._spec

    @property
    def adopted(self) -> bool:
        return self._spec is not None

    def adopt(self, spec: UDFSpec, now: float) -> list[Event]:
        """The UDF is known: the requests kept until now are acted on, in order."""
        self._spec = spec
        early, self._early = self._early, []
        events: list[Event] = []
        for request in early:
            if isinstance(request, ProtocolError):
                events += self.fail(str(request))
            elif isinstance(request, tuple):
                run, frames_before = request
                events += self.receive_point_run(run, now, frames_before)
            else:
                events += self.receive(request, now)
            if self.failed:
                break
        return events

    # ---- bytes ----

    def use_compiled_splitter(self, continuing: Callable[[FrameSplitter], FrameSplitter]) -> None:
        """Cuts frames with the compiled scanner from the next ``receive_data`` on (it takes
        over mid-frame). Safe to call from another thread, which is where it loads."""
        self._compiled_splitter = continuing

    def receive_data(self, data: bytes | memoryview) -> None:
        """Bytes as read, cut anywhere. Frames are cut now and acted on by ``next_events``;
        bytes that break the framing fail the session after the frames before them."""
        if self._framing_error is not None:
            return
        if self._compiled_splitter is not None:
            self._splitter = self._compiled_splitter(self._splitter)
            self._compiled_splitter = None
        try:
            pieces = self._splitter.feed(data)
        except ProtocolError as exc:
            pieces, self._framing_error = exc.decoded, exc
        self._pieces.extend(pieces)

    @property
    def frames_waiting(self) -> bool:
        """Whether frames were cut that ``next_events`` has not acted on."""
        return bool(self._pieces)

    @property
    def input_broken(self) -> bool:
        """Whether the bytes broke the framing: ``next_events`` reports it once the frames
        before the fault are acted on, and nothing after it is read."""
        return self._framing_error is not None

    def next_events(self, now: float, max_frames: int = FRAMES_PER_CALL) -> list[Event]:
        """Acts on up to ``max_frames`` of the frames cut so far; once they are all acted on,
        a framing error. ``frames_waiting`` tells whether to call again."""
        events: list[Event] = []
        for _ in range(min(max_frames, len(self._pieces))):
            events += self._act_on(self._pieces.popleft(), now)
            if self.failed:
                self._pieces.clear()
                return events
        error = self._framing_error
        if not self._pieces and error is not None and not self._framing_error_acted_on and not self.failed:
            self._framing_error_acted_on = True
            events += self.fail(str(error)) if self.adopted else self._keep(error)
        return events

    def receive_eof(self, now: float, *, truncated_ok: bool = False) -> list[Event]:
        """End of input: everything accepted goes to compute. A frame left unfinished fails
        the session, unless the runtime cut the input short itself (``truncated_ok``).
        Called once the UDF is known: what was kept before must be acted on first."""
        if not self.adopted:
            raise RuntimeError("end of input before the session's UDF is known")
        events = self.next_events(now, len(self._pieces))
        if self.failed:
            return events
        try:
            if not truncated_ok:
                self._splitter.close()
        except ProtocolError as exc:
            return [*events, *self.fail(str(exc))]
        return [*events, *self.finish()]

    def _act_on(self, piece: Piece, now: float) -> list[Event]:
        if isinstance(piece, RequestRun):  # cut so only once a Handler script's session is adopted
            self._bytes_acted_on += len(piece.frames)
            self._frames_acted_on += piece.count
            return self._for_handler(piece.frames, piece.count, now) if not self.failed else []
        if isinstance(piece, PointRun):
            self._bytes_acted_on += len(piece.frames)
            first = self._frames_acted_on
            self._frames_acted_on += piece.count
            return self.receive_point_run(piece, now, first) if self.adopted else self._keep((piece, first))
        if self._spec is not None and self._spec.handler is not None and request_point(piece) is not None:
            # A Handler script's point goes to its handler as the frame it came in.
            self._frames_acted_on += 1
            self._bytes_acted_on += len(piece) + varint_size(len(piece))
            return self._for_handler(encode_varint(len(piece)) + piece, 1, now) if not self.failed else []
        self._frames_acted_on += 1
        self._bytes_acted_on += len(piece) + varint_size(len(piece))
        number = self._frames_acted_on
        try:
            point = request_point(piece)
            if point is not None and self.adopted:
                return self.receive_point(point, now, number)
            request = parse_message(udf_pb2.Request, piece, number)
        except ProtocolError as exc:
            return self.fail(str(exc)) if self.adopted else self._keep(exc)
        if self.adopted:
            return self.receive(request, now)
        if request.WhichOneof("message") == "keepalive":
            return [Send(keepalive_frame(request.keepalive.time), urgent=True, asked_at=request.keepalive.time)]
        return self._keep(request)

    def _keep(self, request: Early) -> list[Event]:
        """Before the UDF is known, a request waits for ``adopt``."""
        self._early.append(request)
        return []

    # ---- requests ----

    def receive(self, request: udf_pb2.Request, now: float) -> list[Event]:
        if self.failed:
            return []
        kind = request.WhichOneof("message")
        if kind == "keepalive":
            return [Send(keepalive_frame(request.keepalive.time), urgent=True, asked_at=request.keepalive.time)]
        if self.spec.handler is not None and kind not in ("info", None):
            return self._handler_request(request, kind, now)
        if kind == "point":
            return self.receive_point(request.point.SerializeToString(), now)
        if kind == "begin":
            return self._begin(request.begin)
        if kind == "end":
            return self._end(request.end, now)
        if kind == "info":
            return self._reply(udf_pb2.Response(info=self.info()), kind)
        if kind == "init":
            return self._init(request.init)
        if kind == "snapshot":
            self.guard.expect(kind)
            return [*self._close_pending(), TakeSnapshot()]
        if kind == "restore":
            self.guard.expect(kind)
            return [*self._close_pending(), Restore(request.restore.snapshot)]
        return self.fail("received an empty Request (no message set)")

    def info(self) -> udf_pb2.InfoResponse:
        if self.spec.handler is not None:
            return udf_pb2.InfoResponse.FromString(self.spec.handler.info)
        return udf_pb2.InfoResponse(
            wants=_EDGE[self.spec.wants],
            provides=_EDGE[self.spec.provides],
            options=option_info(self.spec.options),
        )

    def pending_points(self) -> int:
        """Points accepted into the open micro-batch or the open Kapacitor batch."""
        pending = self._pending.count if self._pending is not None else 0
        return pending + (self._open_batch.rows.count if self._open_batch is not None else 0)

    @property
    def bytes_acted_on(self) -> int:
        return self._bytes_acted_on

    def checkpoint(self) -> list[Event]:
        """A checkpoint of everything acted on so far (the open micro-batch closed for it), or
        nothing where none can be taken: before a successful Init, inside a Kapacitor batch,
        after a failure, with requests kept for ``adopt``."""
        if self.failed or self._init_frame is None or self._open_batch is not None or self._early or not self.adopted:
            return []
        return [*self._close_pending(), TakeCheckpoint(self._bytes_acted_on, self._init_frame)]

    def open_micro_batch(self) -> tuple[float, int] | None:
        """When the open micro-batch got its first point, and its points (None: none is open);
        when it goes to compute is ``flushing.FlushPolicy``'s to say."""
        return None if self._pending is None else (self._pending.opened_at, self._pending.count)

    def flush(self) -> list[Event]:
        """The open micro-batch goes to compute now."""
        return self._close_pending()

    def snapshot_taken(self, snapshot: bytes) -> list[Event]:
        """The compute side took the state a ``TakeSnapshot`` asked for: the SnapshotResponse
        to send (none if no SnapshotRequest awaits one)."""
        return self._answer(udf_pb2.Response(snapshot=udf_pb2.SnapshotResponse(snapshot=snapshot)))

    def restored(self, error: str | None) -> list[Event]:
        """The compute side acted on a ``Restore``: the RestoreResponse to send, its failure
        ``error`` if it refused the snapshot (none if no RestoreRequest awaits one)."""
        return self._answer(udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=error is None, error=error or "")))

    def finish(self) -> list[Event]:
        """End of input: everything accepted goes to compute."""
        if self._open_batch is not None:
            log.warning(
                "input ended inside batch %r of group %r: its %d point(s) were never closed by an "
                "EndBatch and are not computed",
                self._open_batch.name,
                self._open_batch.group,
                self._open_batch.rows.count,
            )
            self._open_batch = None
        return self._close_pending()

    # ---- handlers ----

    def _reply(self, response: udf_pb2.Response, kind: str) -> list[Event]:
        self.guard.expect(kind)
        return self._answer(response)

    def _answer(self, response: udf_pb2.Response) -> list[Event]:
        """The reply to a request that awaits it (the guard refuses any other)."""
        frame = self.guard.reply(response)
        return [Send(frame)] if frame is not None else []

    def _init(self, init: udf_pb2.InitRequest) -> list[Event]:
        if self.options is not None:
            return self.fail("received a second InitRequest after a successful one")
        try:
            spec, options = self.spec.bind(list(init.options), self.allow_modules)
        except BindError as exc:
            return self._init_failed(str(exc))
        self._spec = spec
        self.options = options
        self._init_frame = encode_frame(udf_pb2.Request(init=init))
        self.guard.expect("init")
        reply = self.guard.reply(udf_pb2.Response(init=udf_pb2.InitResponse(success=True)))
        return [Started(options, reply, init.taskID, init.nodeID)] if reply is not None else []

    def _init_failed(self, message: str) -> list[Event]:
        log.error("%s", message)
        return self._reply(udf_pb2.Response(init=udf_pb2.InitResponse(success=False, error=message)), "init")

    def _require_init(self, what: str) -> list[Event] | None:
        if self.options is None:
            return self.fail(f"received {what} before a successful Init")
        return None

    def receive_point(self, point: bytes, now: float, frame_number: int = 0) -> list[Event]:
        """A Point, as the bytes Kapacitor sent (see ``frames.request_point``).

        Only the group is read here; the rest is decoded where the group is
        computed, so a point malformed inside fails its micro-batch there.
        """
        if self.failed:
            return []
        if self.spec.handler is not None:
            return self._for_handler(point_frame(point), 1, now)
        refused = self._require_init("a Point")
        if refused is not None:
            return refused
        if self._open_batch is not None:
            self._open_batch.rows.append(point)
            return []
        if self.spec.wants != "stream":
            return self.fail(f"UDF {self.spec.name!r} wants batches, but a Point arrived outside BeginBatch/EndBatch")
        if self.spec.passthrough:
            # Never hand Kapacitor back a point it could not parse.
            try:
                udf_pb2.Point.FromString(point)
            except DecodeError as exc:
                return self.fail(f"frame {frame_number}: the Point does not parse: {exc}" if frame_number else f"the Point does not parse: {exc}")
            return [*self._close_pending(), Emit(point_frame(point))]
        try:
            group = point_group(point)
        except ProtocolError as exc:
            return self.fail(f"frame {frame_number}: {exc}" if frame_number else str(exc))
        pending = self._stream_batch(now)
        pending.append(group, point)
        if pending.count >= self.max_batch_points:
            return self._close_pending()
        return []

    def receive_point_run(self, run: PointRun, now: float, frames_before: int = 0) -> list[Event]:
        """Consecutive points as the compiled scanner found them (``frames.PointRun``).

        A passthrough UDF's points go back as received; any other UDF's are
        grouped by the group spans the scanner found, without parsing a point.
        """
        if self.failed:
            return []
        if self.spec.handler is not None:
            return self._for_handler(run.frames, run.count, now)
        refused = self._require_init("a Point")
        if refused is not None:
            return refused
        if self.spec.passthrough:
            return [*self._close_pending(), Emit(run.frames, run.count)]
        if self._open_batch is not None:
            data = run.frames
            rows = self._open_batch.rows
            for start, end in run.points.tolist():
                rows.append_prefixed(data[start:end])
            return []
        if self.spec.wants != "stream":
            return self.fail(f"UDF {self.spec.name!r} wants batches, but a Point arrived outside BeginBatch/EndBatch")
        from udf_agent.wire.scanner import first_invalid_group

        bad = first_invalid_group(run.frames, run.groups)
        accepted = run.count if bad < 0 else bad
        events: list[Event] = []
        first = 0
        while first < accepted:
            pending = self._stream_batch(now)
            stop = min(accepted, first + self.max_batch_points - pending.count)
            pending.append_run(run.frames, run.points[first:stop], run.groups[first:stop])
            if pending.count >= self.max_batch_points:
                events.extend(self._close_pending())
            first = stop
        if bad >= 0:
            return [*events, *self.fail(f"frame {frames_before + bad + 1}: Point.group is not valid UTF-8")]
        return events

    def _begin(self, begin: udf_pb2.BeginBatch) -> list[Event]:
        refused = self._require_init("a BeginBatch")
        if refused is not None:
            return refused
        if self.spec.wants != "batch":
            return self.fail(f"UDF {self.spec.name!r} wants a stream, but a BeginBatch arrived")
        if self._open_batch is not None:
            return self.fail(f"BeginBatch for group {begin.group!r} arrived while batch {self._open_batch.group!r} was still open")
        self._open_batch = KapacitorBatch(begin)
        return []

    def _end(self, end: udf_pb2.EndBatch, now: float) -> list[Event]:
        refused = self._require_init("an EndBatch")
        if refused is not None:
            return refused
        batch = self._open_batch
        if batch is None:
            return self.fail("EndBatch arrived with no open BeginBatch")
        self._open_batch = None
        batch.close(end)
        pending = self._pending
        if pending is None:
            pending = self._pending = BatchMicroBatch(opened_at=now)
        assert isinstance(pending, BatchMicroBatch)  # a batch UDF's session holds batches only
        pending.add(batch)
        if pending.count >= self.max_batch_points:
            return self._close_pending()
        return []

    # ---- a Kapacitor Handler script: every request but keepalives and Info goes to its handler ----

    def _handler_request(self, request: udf_pb2.Request, kind: str, now: float) -> list[Event]:
        from udf_agent.compute.handlers import CHECKPOINT_MAGIC

        if kind == "restore" and request.restore.snapshot.startswith(CHECKPOINT_MAGIC):
            # A relay carrying its task over: the handler is rebuilt from the checkpoint.
            self.guard.expect(kind)
            return [*self._close_pending(), Restore(request.restore.snapshot)]
        frame = encode_frame(request)
        events: list[Event] = []
        if kind == "init" and self._init_frame is None:
            self._init_frame = frame
            self.options = parse_options((), [])
            events.append(Started(self.options, None, request.init.taskID, request.init.nodeID))
            if self._pending is None:
                self._pending = HandlerMicroBatch(opened_at=now)
            assert isinstance(self._pending, HandlerMicroBatch)
            self._pending.init_frame = frame  # what a rebuilt handler is started with
        events += self._for_handler(frame, 1, now)
        if kind in ("init", "snapshot", "restore"):
            events += self._close_pending()  # a reply Kapacitor waits for: no gathering
        return events

    def _for_handler(self, frames: bytes, count: int, now: float) -> list[Event]:
        if self._pending is None:
            self._pending = HandlerMicroBatch(opened_at=now)
        assert isinstance(self._pending, HandlerMicroBatch)  # a Handler script's session holds requests only
        self._pending.append(frames, count)
        if self._pending.count >= self.max_batch_points:
            return self._close_pending()
        return []

    def _stream_batch(self, now: float) -> StreamMicroBatch:
        """The open micro-batch of a stream UDF's session, opened now if there is none."""
        if self._pending is None:
            self._pending = StreamMicroBatch(opened_at=now)
        assert isinstance(self._pending, StreamMicroBatch)  # a stream UDF's session holds points only
        return self._pending

    def _close_pending(self) -> list[Event]:
        pending, self._pending = self._pending, None
        return [Compute(pending)] if pending is not None else []

    def fail(self, message: str) -> list[Event]:
        # What was accepted before the violation is still computed and sent.
        self.failed = True
        return [*self._close_pending(), Fail(message)]
