"""Running a UDF over recorded points, without Kapacitor.

The points go through everything Kapacitor's would: they are framed as
Kapacitor frames them and fed to a real ``Agent`` (session, codec, micro-batches,
the Spark backend) over a socketpair in this process; its Response frames are
decoded as Kapacitor decodes them. Stream UDFs get the points in time order,
grouped as ``groupBy`` would group them; batch UDFs get, per group, one batch
per window of ``batch_every``, as ``window().period(d).every(d).align()`` cuts them.
"""

from __future__ import annotations

import socket
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING

from udf_agent import udf_pb2
from udf_agent.api import UDFSpec
from udf_agent.tools.harness import ResponseReader, ServedAgent
from udf_agent.tools.lineproto import FieldValue, LinePoint, fields_of, open_input, read_points, set_fields
from udf_agent.tools.recordings import BATCH_EXTENSION, STREAM_EXTENSION, RecordedBatch, read_batch_recording, read_stream_recording
from udf_agent.tools.tickscript import check_call
from udf_agent.wire.frames import encode_frame

if TYPE_CHECKING:
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines

# What a replay hands the agent: the user waits for every result, however long Spark takes.
REPLAY_DRAIN_TIMEOUT = 7 * 24 * 3600.0
_SEND_CHUNK = 256 * 1024
PROGRESS_INTERVAL = 0.2  # seconds between progress reports while no output comes


class ReplayError(Exception):
    """The UDF refused its options or failed; the message is the agent's or Kapacitor's."""


@dataclass(frozen=True)
class OutputPoint:
    name: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    time: int
    group: str


def group_id(tags: dict[str, str], dimensions: Sequence[str]) -> str:
    """Kapacitor's group ID for ``groupBy(dimensions...)``: ``tag=value`` pairs joined by commas."""
    return ",".join(f"{name}={tags.get(name, '')}" for name in dimensions)


def stream_requests(points: Iterable[LinePoint], group_by: Sequence[str]) -> Iterator[udf_pb2.Request]:
    """One Point request per point, in time order (stable for equal times)."""
    dimensions = sorted(set(group_by))
    for line in sorted(points, key=lambda p: p.time):
        yield udf_pb2.Request(point=_point(line, dimensions))


def batch_requests(points: Iterable[LinePoint], group_by: Sequence[str], every_ns: int) -> Iterator[udf_pb2.Request]:
    """Per measurement and group, a batch per aligned window of ``every_ns``, windows in time order."""
    dimensions = sorted(set(group_by))
    windows: dict[tuple[int, str, str], list[LinePoint]] = {}
    for line in points:
        key = (line.time // every_ns, line.name, group_id(line.tags, dimensions))
        windows.setdefault(key, []).append(line)
    for (window, name, group), members in sorted(windows.items()):
        members.sort(key=lambda p: p.time)
        tags = {d: members[0].tags.get(d, "") for d in dimensions}
        tmax = (window + 1) * every_ns
        yield udf_pb2.Request(begin=udf_pb2.BeginBatch(name=name, group=group, tags=tags, size=len(members)))
        for line in members:
            yield udf_pb2.Request(point=_point(line, dimensions))
        yield udf_pb2.Request(end=udf_pb2.EndBatch(name=name, group=group, tmax=tmax, tags=tags))


def recorded_batch_requests(batches: Iterable[RecordedBatch]) -> Iterator[udf_pb2.Request]:
    """Each batch of a batch recording as one batch, as recorded (its group and tags)."""
    for batch in batches:
        dimensions = sorted(batch.tags)
        yield udf_pb2.Request(begin=udf_pb2.BeginBatch(name=batch.name, group=batch.group, tags=batch.tags, size=len(batch.points), byName=batch.by_name))
        for line in batch.points:
            point = _point(line, dimensions)
            point.group, point.byName = batch.group, batch.by_name
            yield udf_pb2.Request(point=point)
        yield udf_pb2.Request(end=udf_pb2.EndBatch(name=batch.name, group=batch.group, tmax=batch.tmax, tags=batch.tags, byName=batch.by_name))


def _point(line: LinePoint, dimensions: list[str]) -> udf_pb2.Point:
    point = udf_pb2.Point(
        time=line.time, name=line.name, database=line.database, retentionPolicy=line.retention_policy,
        group=group_id(line.tags, dimensions), dimensions=dimensions, tags=line.tags,
    )
    set_fields(point, line.fields)
    return point


class InProcessKapacitor:
    """Kapacitor's side of one agent run in this process: real frames over a socketpair.

    Output is taken off the socket as fast as the agent writes it (``ResponseReader``):
    writing line protocol or plotting may well take longer than the second the agent
    waits for an unread peer once input ends.
    """

    def __init__(self, spec: UDFSpec, engines: Engines, config: AgentConfig):
        self._served = ServedAgent(spec, engines, config, name="replay-agent")
        self._sock = self._served.sock
        self._received: deque[udf_pb2.Response] = deque()
        self.points_sent = 0
        self._send_error: BaseException | None = None
        self._output = ResponseReader(self._sock, self._keep, name="replay-output")

    def _keep(self, data: bytes, responses: list[udf_pb2.Response]) -> None:
        self._received.extend(responses)

    def ask(self, request: udf_pb2.Request, kind: str) -> udf_pb2.Response:
        """Sends one request and returns the Response of KIND (an ErrorResponse raises)."""
        self._sock.sendall(encode_frame(request))
        while True:
            responses = self._next_responses()
            if responses is None:
                raise ReplayError(f"the agent ended the session instead of answering {kind}")
            for response in responses:
                found = response.WhichOneof("message")
                if found == "error":
                    raise ReplayError(response.error.error)
                if found == kind:
                    return response

    def stream(self, requests: Iterable[udf_pb2.Request], on_progress: Callable[[int], None] | None = None) -> Iterator[udf_pb2.Response]:
        """Sends REQUESTS then ends the input as Kapacitor does on stop, yielding every
        Response meanwhile; an ErrorResponse ends the replay with ReplayError.
        ``on_progress`` gets the number of points sent so far, a few times a second."""
        sender = threading.Thread(target=self._send_all, args=(requests,), name="replay-input", daemon=True)
        sender.start()
        while True:
            responses = self._next_responses()
            if on_progress is not None:
                on_progress(self.points_sent)
            if responses is None:
                break
            for response in responses:
                if response.WhichOneof("message") == "error":
                    raise ReplayError(response.error.error)
                yield response
        sender.join()
        self._served.join()
        self._output.join()
        if self._send_error is not None:
            raise self._send_error
        if self._output.error is not None and not isinstance(self._output.error, OSError):
            raise self._output.error  # not the socket closed under us: a bug to show

    def _send_all(self, requests: Iterable[udf_pb2.Request]) -> None:
        pending = bytearray()
        try:
            for request in requests:
                pending += encode_frame(request)
                if request.WhichOneof("message") == "point":
                    self.points_sent += 1
                if len(pending) >= _SEND_CHUNK:
                    self._sock.sendall(pending)
                    pending.clear()
            self._sock.sendall(pending)
            self._sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the agent ended the session; its ErrorResponse says why
        except BaseException as exc:  # raised in the reading thread once output ends
            self._send_error = exc
            self._sock.shutdown(socket.SHUT_WR)

    def _next_responses(self) -> list[udf_pb2.Response] | None:
        """The Responses received since the last call ([] after a short wait, so progress can
        be shown while nothing comes out); None once the agent has closed its side."""
        with self._output.arrived:
            if not self._received and not self._output.closed.is_set():
                self._output.arrived.wait(PROGRESS_INTERVAL)
            if not self._received:
                return None if self._output.closed.is_set() else []
            responses = list(self._received)
            self._received.clear()
            return responses

    def close(self) -> None:
        self._sock.close()


def read_replay_input(path: str, precision: str, stdin: IO[bytes]) -> tuple[list[LinePoint], list[RecordedBatch] | None]:
    """The points in ``path`` (line protocol, gzip or not, ``-`` for ``stdin``; or a Kapacitor
    recording, by its extension) and, for a batch recording, its batches as recorded.
    Raises OSError, LineProtocolError or RecordingError."""
    if path.endswith(BATCH_EXTENSION):
        batches = read_batch_recording(path)
        return [point for batch in batches for point in batch.points], batches
    if path.endswith(STREAM_EXTENSION):
        return list(read_stream_recording(path, precision)), None
    with open_input(path, stdin) as stream:
        return list(read_points(stream, "stdin" if path == "-" else path, precision)), None


def in_process_engines() -> Engines:
    """Engines that compute every micro-batch in this process, without Spark (the code
    Spark's workers run)."""
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.runtime.engines import Engines

    return Engines(LocalEngine, local_max_points=1 << 62)


def replay_points(
    spec: UDFSpec,
    engines: Engines,
    options: Sequence[udf_pb2.Option],
    points: Sequence[LinePoint],
    *,
    group_by: Sequence[str] = (),
    batch_every_ns: int | None = None,
    recorded_batches: Sequence[RecordedBatch] | None = None,
    config: AgentConfig | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> Iterator[OutputPoint]:
    """Runs SPEC over POINTS as Kapacitor would and yields its output points in order;
    with ``recorded_batches`` (a batch recording) over those batches as recorded instead.

    ``options`` are checked against the UDF's InfoResponse as Kapacitor checks a
    TICKscript's call (ReplayError with Kapacitor's message), then sent in an InitRequest.
    """
    from udf_agent.runtime.config import AgentConfig

    if recorded_batches is not None and spec.wants != "batch":
        raise ReplayError(f"{spec.name} wants a stream: a batch recording (.brpl) is for batch UDFs; record the stream instead")
    if spec.wants == "batch" and batch_every_ns is None and recorded_batches is None:
        raise ReplayError(f"{spec.name} wants batches: say how to cut them with --batch-every DURATION (a window's period)")
    if config is None:
        config = AgentConfig(drain_timeout=REPLAY_DRAIN_TIMEOUT)
    kapacitor = InProcessKapacitor(spec, engines, config)
    try:
        info = kapacitor.ask(udf_pb2.Request(info=udf_pb2.InfoRequest()), "info").info
        for call in options:
            check_call(spec.name, info.options, call)
        init = kapacitor.ask(udf_pb2.Request(init=udf_pb2.InitRequest(options=options, taskID="replay", nodeID="udf1")), "init").init
        if not init.success:
            raise ReplayError(f"{spec.name} refused its options: {init.error}")
        if recorded_batches is not None:
            requests = recorded_batch_requests(recorded_batches)
        elif spec.wants == "stream":
            requests = stream_requests(points, group_by)
        else:
            assert batch_every_ns is not None
            requests = batch_requests(points, group_by, batch_every_ns)
        yield from _output_points(kapacitor.stream(requests, on_progress))
    finally:
        kapacitor.close()


def _output_points(responses: Iterator[udf_pb2.Response]) -> Iterator[OutputPoint]:
    batch: udf_pb2.BeginBatch | None = None
    for response in responses:
        kind = response.WhichOneof("message")
        if kind == "begin":
            batch = response.begin
        elif kind == "end":
            batch = None
        elif kind == "point":
            point = response.point
            # Points of a batch response may leave the batch's name and tags implicit.
            name = point.name or (batch.name if batch is not None else "")
            tags = dict(point.tags) if point.tags or batch is None else dict(batch.tags)
            yield OutputPoint(name, tags, fields_of(point), point.time, point.group or (batch.group if batch is not None else ""))
