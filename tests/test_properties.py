"""Property tests (hypothesis) for the sans-IO codec and session.

Invariants, over generated request streams cut at arbitrary places, valid or not:
the compiled splitter stands for exactly the frames the reference finds; only the
documented ``ProtocolError`` escapes the codec; the session never raises, answers
what it must, and every frame it emits parses as a Response.
"""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from udf_agent import udf_pb2
from udf_agent.library.builtins import moving_avg, outliers
from udf_agent.runtime.events import Compute, Emit, Fail, Restore, Send, Started, TakeSnapshot
from udf_agent.runtime.session import Session
from udf_agent.testing import option
from udf_agent.wire.frames import FrameDecoder, FrameSplitter, PointRun, ProtocolError, encode_frame, parse_message
from udf_agent.wire.scanner import FastFrameSplitter

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
doubles = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, math.inf, -math.inf]))
int64 = st.integers(-(2**63), 2**63 - 1)


@st.composite
def points(draw: st.DrawFn) -> udf_pb2.Point:
    tags = draw(st.dictionaries(names, names, max_size=3))
    return udf_pb2.Point(
        time=draw(int64),
        name=draw(names),
        database=draw(names),
        retentionPolicy=draw(names),
        group=draw(names),
        dimensions=sorted(tags),
        tags=tags,
        fieldsDouble=draw(st.dictionaries(names, doubles, max_size=3)),
        fieldsInt=draw(st.dictionaries(names, int64, max_size=3)),
        fieldsString=draw(st.dictionaries(names, names, max_size=2)),
        fieldsBool=draw(st.dictionaries(names, st.booleans(), max_size=2)),
        byName=draw(st.booleans()),
    )


requests = st.one_of(
    points().map(lambda p: udf_pb2.Request(point=p)),
    points().map(lambda p: udf_pb2.Request(point=p)),  # points dominate real streams
    int64.map(lambda t: udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=t))),
    st.just(udf_pb2.Request(info=udf_pb2.InfoRequest())),
    names.map(lambda g: udf_pb2.Request(begin=udf_pb2.BeginBatch(name="m", group=g))),
    st.integers(0, 2**62).map(lambda t: udf_pb2.Request(end=udf_pb2.EndBatch(name="m", tmax=t))),
    st.just(udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest())),
    st.binary(max_size=64).map(lambda b: udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=b))),
)


def _cut(data: bytes, cuts: list[int]) -> list[bytes]:
    positions = sorted({min(c, len(data)) for c in cuts})
    edges = [0, *positions, len(data)]
    return [data[a:b] for a, b in zip(edges[:-1], edges[1:])]


def _bodies(splitter: FrameSplitter, chunks: list[bytes]) -> list[bytes]:
    """Every frame body the splitter gives, point runs expanded (their frames as bodies)."""
    bodies: list[bytes] = []
    for chunk in chunks:
        for piece in splitter.feed(bytearray(chunk) if isinstance(splitter, FastFrameSplitter) else chunk):
            if isinstance(piece, PointRun):
                bodies.extend(b"\x8a\x01" + piece.frames[start:end] for start, end in piece.points.tolist())
            else:
                bodies.append(piece)
    return bodies


@PROPERTY
@given(st.lists(requests, max_size=20), st.lists(st.integers(0, 4000), max_size=12))
def test_any_cut_of_valid_frames_gives_every_message_back(messages: list[udf_pb2.Request], cuts: list[int]) -> None:
    data = b"".join(encode_frame(m) for m in messages)
    chunks = _cut(data, cuts)
    reference = _bodies(FrameSplitter(), chunks)
    # Compared serialized: with NaN values, protobuf 5's message equality fails, 7's passes.
    assert [parse_message(udf_pb2.Request, body).SerializeToString(deterministic=True) for body in reference] == [m.SerializeToString(deterministic=True) for m in messages]
    # The compiled scanner stands for exactly the same frames, point runs included.
    assert _bodies(FastFrameSplitter(), chunks) == reference


@PROPERTY
@given(st.lists(requests, max_size=8), st.binary(max_size=40), st.integers(0, 10_000), st.lists(st.integers(0, 2000), max_size=6))
def test_corrupt_input_is_refused_with_a_protocol_error_or_read_as_other_messages(messages: list[udf_pb2.Request], junk: bytes, position: int, cuts: list[int]) -> None:
    data = b"".join(encode_frame(m) for m in messages)
    at = min(position, len(data))
    corrupt = data[:at] + junk + data[at:]
    outcomes: list[object] = []
    for splitter in (FrameSplitter(max_frame_size=4096), FastFrameSplitter(max_frame_size=4096)):
        try:
            bodies = _bodies(splitter, _cut(corrupt, cuts))
            splitter.close()  # a frame left unfinished is refused too
            outcomes.append([parse_message(udf_pb2.Request, body).SerializeToString(deterministic=True) for body in bodies])
        except ProtocolError:  # the one documented failure
            outcomes.append(ProtocolError)
    # Both splitters take the same bytes the same way.
    assert outcomes[0] == outcomes[1]
    # Junk is never skipped: what is not refused is read, as messages the input did not hold.
    if junk and outcomes[0] is not ProtocolError:
        assert outcomes[0] != [m.SerializeToString(deterministic=True) for m in messages]


@st.composite
def sessions_input(draw: st.DrawFn) -> tuple[object, list[udf_pb2.Request]]:
    spec = draw(st.sampled_from([moving_avg, outliers]))
    good_init = (
        (option("field", "v"), option("size", 3)) if spec is moving_avg else (option("field", "v"),)
    )
    init = udf_pb2.Request(init=udf_pb2.InitRequest(options=draw(st.sampled_from([good_init, (option("size", 0),), ()]))))
    stream = draw(st.lists(st.one_of(requests, st.just(init)), max_size=25))
    # Usually an Init first, as Kapacitor does; sometimes not.
    return spec, ([init] if draw(st.booleans()) else []) + stream


@PROPERTY
@given(sessions_input(), st.integers(1, 5))
def test_the_session_never_raises_and_every_frame_it_emits_parses(case: tuple[object, list[udf_pb2.Request]], max_batch: int) -> None:
    spec, stream = case
    session = Session(spec, max_batch_points=max_batch)  # type: ignore[arg-type]
    events = []
    failed_at = None
    for index, request in enumerate(stream):
        produced = session.receive(request, float(index))
        if failed_at is not None:
            assert produced == [], "nothing happens after the session failed"
        events.extend(produced)
        if any(isinstance(e, Fail) for e in produced):
            failed_at = index
        if request.WhichOneof("message") in ("info", "keepalive") and failed_at is None:
            assert any(isinstance(e, Send) for e in produced), "Info and keepalives are always answered"
    events.extend(session.finish())
    decoder = FrameDecoder(udf_pb2.Response)
    for event in events:
        if isinstance(event, Send):
            (response,) = decoder.feed(event.frame)
            assert response.WhichOneof("message") is not None
        elif isinstance(event, Started):
            (response,) = decoder.feed(event.reply)
            assert response.init.success
        elif isinstance(event, Emit):
            assert all(r.WhichOneof("message") == "point" for r in decoder.feed(event.frames))
        elif isinstance(event, Fail):
            assert event.message
        elif isinstance(event, Compute):
            # Work to do: points, or whole Kapacitor batches (an empty one is passed on as one).
            assert event.batch.count > 0 or getattr(event.batch, "batches", None)
        else:
            assert isinstance(event, (TakeSnapshot, Restore)), event
