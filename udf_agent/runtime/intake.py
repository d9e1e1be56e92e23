"""How a session takes a UDF's data, chosen once the UDF is known (``intake_for``), sans-IO.

One kind per edge: a stream UDF's points are grouped into the open micro-batch by their group
bytes; a batch UDF's points are gathered between BeginBatch and EndBatch, and whole Kapacitor
batches make the micro-batch; a passthrough UDF's points go back as received; a Kapacitor
Handler script's requests go to its handler as the frames they came in. The session checks
what every kind shares (a failed session, a successful Init) and asks its intake for the rest.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from google.protobuf.message import DecodeError

from udf_agent import udf_pb2
from udf_agent.api import UDFSpec
from udf_agent.runtime.binding import Binding
from udf_agent.runtime.events import Compute, Emit, Event, Restore, Started
from udf_agent.wire.batches import BatchMicroBatch, HandlerMicroBatch, KapacitorBatch, StreamMicroBatch
from udf_agent.wire.frames import PointRun, ProtocolError, encode_frame, point_frame, point_group
from udf_agent.wire.guard import OutputGuard

log = logging.getLogger(__name__)

Fail = Callable[[str], list[Event]]


class Intake:
    """What every kind shares: the open micro-batch, closed at ``max_batch_points``. Before
    the UDF is known it is this, and holds nothing."""

    needs_init = True  # data before a successful Init fails the session

    def __init__(self, name: str, max_batch_points: int, fail: Fail):
        self.name = name
        self.max_batch_points = max_batch_points
        self._fail = fail
        self.pending: StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch | None = None

    def point(self, point: bytes, now: float, frame_number: int) -> list[Event]:
        """A Point, as the bytes Kapacitor sent (numbered ``frame_number`` if not 0)."""
        raise NotImplementedError

    def point_run(self, run: PointRun, now: float, frames_before: int) -> list[Event]:
        """Consecutive points as the compiled scanner found them."""
        raise NotImplementedError

    def begin(self, begin: udf_pb2.BeginBatch) -> list[Event]:
        return self._fail(f"UDF {self.name!r} wants a stream, but a BeginBatch arrived")

    def end(self, end: udf_pb2.EndBatch, now: float) -> list[Event]:
        return self._fail("EndBatch arrived with no open BeginBatch")

    def pending_points(self) -> int:
        """Points accepted and not yet handed to compute."""
        return self.pending.count if self.pending is not None else 0

    def open_micro_batch(self) -> tuple[float, int] | None:
        return None if self.pending is None else (self.pending.opened_at, self.pending.count)

    @property
    def between_batches(self) -> bool:
        """Whether no Kapacitor batch is open (a checkpoint is taken only then)."""
        return True

    def close_pending(self) -> list[Event]:
        pending, self.pending = self.pending, None
        return [Compute(pending)] if pending is not None else []

    def finish(self) -> list[Event]:
        """End of input: everything accepted goes to compute."""
        return self.close_pending()

    def _close_if_full(self) -> list[Event]:
        assert self.pending is not None
        return self.close_pending() if self.pending.count >= self.max_batch_points else []


class StreamIntake(Intake):
    """Points grouped by their group bytes, read straight off the wire: nothing else is parsed."""

    def point(self, point: bytes, now: float, frame_number: int) -> list[Event]:
        try:
            group = point_group(point)
        except ProtocolError as exc:
            return self._fail(f"frame {frame_number}: {exc}" if frame_number else str(exc))
        pending = self._open(now)
        pending.append(group, point)
        return self._close_if_full()

    def point_run(self, run: PointRun, now: float, frames_before: int) -> list[Event]:
        from udf_agent.wire.scanner import first_invalid_group

        bad = first_invalid_group(run.frames, run.groups)
        accepted = run.count if bad < 0 else bad
        events: list[Event] = []
        first = 0
        while first < accepted:
            pending = self._open(now)
            stop = min(accepted, first + self.max_batch_points - pending.count)
            pending.append_run(run.frames, run.points[first:stop], run.groups[first:stop])
            events += self._close_if_full()
            first = stop
        if bad >= 0:
            return [*events, *self._fail(f"frame {frames_before + bad + 1}: Point.group is not valid UTF-8")]
        return events

    def _open(self, now: float) -> StreamMicroBatch:
        if self.pending is None:
            self.pending = StreamMicroBatch(opened_at=now)
        assert isinstance(self.pending, StreamMicroBatch)
        return self.pending


class PassthroughIntake(Intake):
    """Points back as received, behind the output still being computed; never one Kapacitor
    could not parse."""

    def point(self, point: bytes, now: float, frame_number: int) -> list[Event]:
        try:
            udf_pb2.Point.FromString(point)
        except DecodeError as exc:
            return self._fail(f"frame {frame_number}: the Point does not parse: {exc}" if frame_number else f"the Point does not parse: {exc}")
        return [Emit(point_frame(point))]

    def point_run(self, run: PointRun, now: float, frames_before: int) -> list[Event]:
        return [Emit(run.frames, run.count)]


class BatchIntake(Intake):
    """Points between a BeginBatch and its EndBatch; whole Kapacitor batches make the
    micro-batch."""

    def __init__(self, name: str, max_batch_points: int, fail: Fail):
        super().__init__(name, max_batch_points, fail)
        self._open_batch: KapacitorBatch | None = None

    def point(self, point: bytes, now: float, frame_number: int) -> list[Event]:
        if self._open_batch is None:
            return self._outside_a_batch()
        self._open_batch.rows.append(point)
        return []

    def point_run(self, run: PointRun, now: float, frames_before: int) -> list[Event]:
        if self._open_batch is None:
            return self._outside_a_batch()
        data, rows = run.frames, self._open_batch.rows
        for start, end in run.points.tolist():
            rows.append_prefixed(data[start:end])
        return []

    def begin(self, begin: udf_pb2.BeginBatch) -> list[Event]:
        if self._open_batch is not None:
            return self._fail(f"BeginBatch for group {begin.group!r} arrived while batch {self._open_batch.group!r} was still open")
        self._open_batch = KapacitorBatch(begin)
        return []

    def end(self, end: udf_pb2.EndBatch, now: float) -> list[Event]:
        batch, self._open_batch = self._open_batch, None
        if batch is None:
            return self._fail("EndBatch arrived with no open BeginBatch")
        batch.close(end)
        if self.pending is None:
            self.pending = BatchMicroBatch(opened_at=now)
        assert isinstance(self.pending, BatchMicroBatch)
        self.pending.add(batch)
        return self._close_if_full()

    def pending_points(self) -> int:
        return super().pending_points() + (self._open_batch.rows.count if self._open_batch is not None else 0)

    @property
    def between_batches(self) -> bool:
        return self._open_batch is None

    def finish(self) -> list[Event]:
        if self._open_batch is not None:
            batch = self._open_batch
            log.warning("input ended inside batch %r of group %r: its %d point(s) were never closed by an EndBatch and are not computed", batch.name, batch.group, batch.rows.count)
            self._open_batch = None
        return self.close_pending()

    def _outside_a_batch(self) -> list[Event]:
        return self._fail(f"UDF {self.name!r} wants batches, but a Point arrived outside BeginBatch/EndBatch")


class HandlerIntake(Intake):
    """A Kapacitor Handler script's requests, to its handler as the frames they came in (its
    own Init decides what is valid)."""

    needs_init = False

    def point(self, point: bytes, now: float, frame_number: int) -> list[Event]:
        return self.forward(point_frame(point), 1, now)

    def point_run(self, run: PointRun, now: float, frames_before: int) -> list[Event]:
        return self.forward(run.frames, run.count, now)

    def request(self, request: udf_pb2.Request, kind: str, now: float, binding: Binding, guard: OutputGuard) -> list[Event]:
        """A request other than a keepalive or Info, to the handler as the frame it came in."""
        from udf_agent.compute.handlers import CHECKPOINT_MAGIC

        if kind == "restore" and request.restore.snapshot.startswith(CHECKPOINT_MAGIC):
            # A relay carrying its task over: the handler is rebuilt from the checkpoint.
            guard.expect(kind)
            return [*self.close_pending(), Restore(request.restore.snapshot)]
        frame = encode_frame(request)
        events: list[Event] = []
        if kind == "init" and binding.init_frame is None:
            events.append(Started(binding.bind_handler(frame), None, request.init.taskID, request.init.nodeID))
            self._open(now).init_frame = frame  # what a handler rebuilt elsewhere is started with
        events += self.forward(frame, 1, now)
        if kind in ("init", "snapshot", "restore"):
            events += self.close_pending()  # a reply Kapacitor waits for: no gathering
        return events

    def forward(self, frames: bytes, count: int, now: float) -> list[Event]:
        """``count`` requests' ``frames`` join the open micro-batch."""
        self._open(now).append(frames, count)
        return self._close_if_full()

    def _open(self, now: float) -> HandlerMicroBatch:
        if self.pending is None:
            self.pending = HandlerMicroBatch(opened_at=now)
        assert isinstance(self.pending, HandlerMicroBatch)
        return self.pending


def intake_for(spec: UDFSpec, max_batch_points: int, fail: Fail) -> Intake:
    """The kind of intake ``spec``'s UDF takes its data with."""
    if spec.handler is not None:
        return HandlerIntake(spec.name, max_batch_points, fail)
    if spec.passthrough:
        return PassthroughIntake(spec.name, max_batch_points, fail)
    if spec.wants == "batch":
        return BatchIntake(spec.name, max_batch_points, fail)
    return StreamIntake(spec.name, max_batch_points, fail)
