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
from collections.abc import Callable

from udf_agent import udf_pb2
from udf_agent.api import BindError, UDFSpec
from udf_agent.options import OptionValues
from udf_agent.runtime.binding import Binding
from udf_agent.runtime.events import Event, Fail, Restore, Send, Started, TakeCheckpoint, TakeSnapshot
from udf_agent.runtime.framing import FramedInput
from udf_agent.runtime.intake import HandlerIntake, Intake, intake_for
from udf_agent.wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameSplitter,
    Piece,
    PointRun,
    ProtocolError,
    RequestRun,
    encode_varint,
    parse_message,
    request_point,
)
from udf_agent.wire.guard import OutputGuard
from udf_agent.wire.keepalives import keepalive_frame

log = logging.getLogger(__name__)

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
        self.binding = Binding(spec, allow_modules)
        self.guard = OutputGuard()
        self.max_batch_points = max_batch_points
        self.failed = False
        # How the UDF's data is taken: chosen once the UDF is known (and again at a stream_fn
        # or batch_fn target's Init, which names it).
        self._intake = Intake("", max_batch_points, self.fail) if spec is None else intake_for(spec, max_batch_points, self.fail)
        self._input = FramedInput(max_frame_size)
        self._early: list[Early] = []

    @property
    def spec(self) -> UDFSpec:
        return self.binding.spec

    @property
    def adopted(self) -> bool:
        return self.binding.known

    @property
    def options(self) -> OptionValues | None:
        """Kapacitor's options, once an Init succeeded."""
        return self.binding.options

    def adopt(self, spec: UDFSpec, now: float) -> list[Event]:
        """The UDF is known: the requests kept until now are acted on, in order."""
        self.binding.adopt(spec)
        self._intake = intake_for(spec, self.max_batch_points, self.fail)
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
        self._input.use_compiled_splitter(continuing)

    def receive_data(self, data: bytes | memoryview) -> None:
        """Bytes as read, cut anywhere. Frames are cut now and acted on by ``next_events``;
        bytes that break the framing fail the session after the frames before them."""
        self._input.feed(data)

    @property
    def frames_waiting(self) -> bool:
        """Whether frames were cut that ``next_events`` has not acted on."""
        return len(self._input) > 0

    @property
    def input_broken(self) -> bool:
        """Whether the bytes broke the framing: ``next_events`` reports it once the frames
        before the fault are acted on, and nothing after it is read."""
        return self._input.broken

    def next_events(self, now: float, max_frames: int = FRAMES_PER_CALL) -> list[Event]:
        """Acts on up to ``max_frames`` of the frames cut so far; once they are all acted on,
        a framing error. ``frames_waiting`` tells whether to call again."""
        events: list[Event] = []
        for _ in range(min(max_frames, len(self._input))):
            events += self._act_on(self._input.frames_taken, self._input.take(), now)
            if self.failed:
                self._input.drop()
                return events
        error = None if self.failed else self._input.fault()
        if error is not None:
            events += self.fail(str(error)) if self.adopted else self._keep(error)
        return events

    def receive_eof(self, now: float, *, truncated_ok: bool = False) -> list[Event]:
        """End of input: everything accepted goes to compute. A frame left unfinished fails
        the session, unless the runtime cut the input short itself (``truncated_ok``).
        Called once the UDF is known: what was kept before must be acted on first."""
        if not self.adopted:
            raise RuntimeError("end of input before the session's UDF is known")
        events = self.next_events(now, len(self._input))
        if self.failed:
            return events
        try:
            if not truncated_ok:
                self._input.close()
        except ProtocolError as exc:
            return [*events, *self.fail(str(exc))]
        return [*events, *self.finish()]

    def _act_on(self, frames_before: int, piece: Piece, now: float) -> list[Event]:
        if isinstance(piece, RequestRun):  # cut so only once a Handler script's session is adopted
            return self._handler().forward(piece.frames, piece.count, now) if not self.failed else []
        if isinstance(piece, PointRun):
            return self.receive_point_run(piece, now, frames_before) if self.adopted else self._keep((piece, frames_before))
        if self.adopted and self.spec.handler is not None and request_point(piece) is not None:
            # A Handler script's point goes to its handler as the frame it came in.
            return self._handler().forward(encode_varint(len(piece)) + piece, 1, now) if not self.failed else []
        number = frames_before + 1
        try:
            point = request_point(piece)
            if point is not None and self.adopted:
                return self._point(point, now, number)
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
            return self._handler().request(request, kind, now, self.binding, self.guard)
        if kind == "point":
            return self._point(request.point.SerializeToString(), now)
        if kind == "begin":
            return self._require_init("a BeginBatch") or self._intake.begin(request.begin)
        if kind == "end":
            return self._require_init("an EndBatch") or self._intake.end(request.end, now)
        if kind == "info":
            return self._reply(udf_pb2.Response(info=self.binding.info()), kind)
        if kind == "init":
            return self._init(request.init)
        if kind == "snapshot":
            self.guard.expect(kind)
            return [*self._intake.close_pending(), TakeSnapshot()]
        if kind == "restore":
            self.guard.expect(kind)
            return [*self._intake.close_pending(), Restore(request.restore.snapshot)]
        return self.fail("received an empty Request (no message set)")

    def pending_points(self) -> int:
        """Points accepted into the open micro-batch or the open Kapacitor batch."""
        return self._intake.pending_points()

    @property
    def bytes_acted_on(self) -> int:
        """Bytes of the whole frames acted on so far, length prefixes included."""
        return self._input.bytes_taken

    def checkpoint(self) -> list[Event]:
        """A checkpoint of everything acted on so far (the open micro-batch closed for it), or
        nothing where none can be taken: before a successful Init, inside a Kapacitor batch,
        after a failure, with requests kept for ``adopt``."""
        init_frame = self.binding.init_frame
        if self.failed or init_frame is None or not self._intake.between_batches or self._early or not self.adopted:
            return []
        return [*self._intake.close_pending(), TakeCheckpoint(self.bytes_acted_on, init_frame)]

    def open_micro_batch(self) -> tuple[float, int] | None:
        """When the open micro-batch got its first point, and its points (None: none is open);
        when it goes to compute is ``flushing.FlushPolicy``'s to say."""
        return self._intake.open_micro_batch()

    def flush(self) -> list[Event]:
        """The open micro-batch goes to compute now."""
        return self._intake.close_pending()

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
        return self._intake.finish()

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
            spec, options = self.binding.bind(init)
        except BindError as exc:
            log.error("%s", exc)
            return self._reply(udf_pb2.Response(init=udf_pb2.InitResponse(success=False, error=str(exc))), "init")
        self._intake = intake_for(spec, self.max_batch_points, self.fail)  # nothing was accepted before
        self.guard.expect("init")
        reply = self.guard.reply(udf_pb2.Response(init=udf_pb2.InitResponse(success=True)))
        return [Started(options, reply, init.taskID, init.nodeID)] if reply is not None else []

    def _require_init(self, what: str) -> list[Event] | None:
        if self.options is None:
            return self.fail(f"received {what} before a successful Init")
        return None

    def _point(self, point: bytes, now: float, frame_number: int = 0) -> list[Event]:
        """A Point, as the bytes Kapacitor sent (``frames.request_point``): only its group is read
        here, the rest where the group is computed (a point malformed inside fails it there)."""
        return [] if self.failed else self._require_data_init() or self._intake.point(point, now, frame_number)

    def receive_point_run(self, run: PointRun, now: float, frames_before: int = 0) -> list[Event]:
        """Consecutive points as the compiled scanner found them (``frames.PointRun``): a
        passthrough UDF's go back as received, any other's are grouped by the group spans the
        scanner found, without parsing a point."""
        return [] if self.failed else self._require_data_init() or self._intake.point_run(run, now, frames_before)

    def _require_data_init(self) -> list[Event] | None:
        """A point before a successful Init fails the session (a Handler script's handler decides itself)."""
        return self._require_init("a Point") if self._intake.needs_init else None

    # ---- a Kapacitor Handler script: every request but keepalives and Info goes to its handler ----

    def _handler(self) -> HandlerIntake:
        assert isinstance(self._intake, HandlerIntake)  # cut as requests only once a Handler script's session is adopted
        return self._intake

    def fail(self, message: str) -> list[Event]:
        # What was accepted before the violation is still computed and sent.
        self.failed = True
        return [*self._intake.close_pending(), Fail(message)]
