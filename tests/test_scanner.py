"""The compiled frame scanner (udf_agent.wire.scanner) against the reference splitter (udf_agent.wire.frames).

Every input is fed whole, one byte at a time and split at many positions; the
pieces must stand for exactly the frames the reference finds, point runs must be
the received bytes, and errors must carry the same message and the same accepted pieces.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from google.protobuf.message import DecodeError

from udf_agent import udf_pb2
from udf_agent.wire.frames import FrameSplitter, PointRun, ProtocolError, RequestRun, encode_frame, encode_varint, point_group, request_point
from udf_agent.wire.scanner import POINT, RUN_BYTES, FastFrameSplitter, RequestRunSplitter, _scan, _scan_runs


def expand(pieces):
    """Each piece as the frames it stands for: ("point", point bytes, group) or ("other", body)."""
    out = []
    for piece in pieces:
        if isinstance(piece, PointRun):
            assert len(piece.points) == len(piece.groups) == piece.count
            for (start, end), (group_start, group_end) in zip(piece.points.tolist(), piece.groups.tolist()):
                prefixed = piece.frames[start:end]
                point = FrameSplitter().feed(prefixed)[0]  # strip the length varint
                group = piece.frames[group_start:group_end].decode() if group_start >= 0 else ""
                out.append(("point", point, group))
        else:
            out.append(("other", piece))
    return out


def reference(stream):
    """What the fast splitter must find, from the reference splitter and protobuf."""
    out = []
    for body in FrameSplitter().feed(stream):
        point = request_point(body)
        try:
            group = point_group(point) if point is not None and udf_pb2.Point.FromString(point) is not None else None
        except Exception:  # a point that does not parse is no point for the scanner either
            group = None
        out.append(("point", point, group) if group is not None else ("other", body))
    return out


def feed_all(chunks, **kwargs):
    splitter = FastFrameSplitter(**kwargs)
    pieces = []
    for chunk in chunks:
        pieces.extend(splitter.feed(chunk))
    splitter.close()
    return splitter, pieces


def sample_stream():
    big = udf_pb2.Point(name="m", group="host=" + "h" * 200, tags={"host": "h" * 200}, fieldsDouble={"x": 1.5})
    huge = udf_pb2.Point(name="m", tags={"blob": "b" * 20_000})
    requests = [
        udf_pb2.Request(point=udf_pb2.Point(time=1, name="m", group="g=a", dimensions=["g"], tags={"g": "a"})),
        udf_pb2.Request(point=big),
        udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=5)),
        udf_pb2.Request(point=udf_pb2.Point(time=-2, fieldsBool={"ok": True}, fieldsString={"s": "x"})),  # a 10-byte time varint
        udf_pb2.Request(point=huge),
        udf_pb2.Request(point=udf_pb2.Point()),
        udf_pb2.Request(),
        udf_pb2.Request(info=udf_pb2.InfoRequest()),
        udf_pb2.Request(point=udf_pb2.Point(time=3, fieldsInt={"n": 7}, byName=True)),
    ]
    return b"".join(encode_frame(r) for r in requests)


def test_whole_bytewise_and_split_feeds_find_the_reference_frames():
    stream = sample_stream()
    expected = reference(stream)
    assert [kind for kind, *_ in expected].count("point") == 6
    for chunks in ([stream], [stream[i : i + 1] for i in range(len(stream))], *([stream[:i], stream[i:]] for i in range(0, len(stream) + 1, 11))):
        splitter, pieces = feed_all(chunks)
        assert expand(pieces) == expected
        assert splitter.frames == len(expected)
        for piece in pieces:
            if isinstance(piece, PointRun):
                assert piece.frames in stream


def test_a_run_is_byte_identical_to_the_response_frames_of_its_points():
    points = [udf_pb2.Point(time=t, name="cpu", group=f"host=h{t % 3}", tags={"host": f"h{t % 3}"}, fieldsDouble={"v": t / 3}) for t in range(300)]
    stream = b"".join(encode_frame(udf_pb2.Request(point=p)) for p in points)
    (run,) = FastFrameSplitter().feed(stream)
    assert run.count == 300
    assert run.frames == b"".join(encode_frame(udf_pb2.Response(point=p)) for p in points)


def test_many_tiny_frames_fill_the_scanner_more_than_once():
    stream = b"\x00" * 10_000 + encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=1)))
    splitter, pieces = feed_all([stream])
    assert splitter.frames == 10_001
    assert pieces[:-1] == [b""] * 10_000 and isinstance(pieces[-1], PointRun)


@pytest.mark.parametrize(
    "point",
    [
        udf_pb2.Point(group="g", name="m").SerializeToString() + b"\x3a\x04\x0a\x05ab",  # a tags entry overrunning itself
        udf_pb2.Point(name="m").SerializeToString() + b"\x42\x02\x09\x00",  # a double field's value cut short
        b"\x12\x05ab",  # name overruns the point
        b"\x0b",  # wire type 3
    ],
    ids=["entry-overrun", "short-double", "field-overrun", "group-wire-type"],
)
def test_a_point_that_does_not_parse_is_never_in_a_run(point):
    good = encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=1)))
    body = b"\x8a\x01" + encode_varint(len(point)) + point
    stream = good + encode_varint(len(body)) + body + good
    with pytest.raises(DecodeError):
        udf_pb2.Point.FromString(point)
    _, pieces = feed_all([stream])
    assert [type(p).__name__ for p in pieces] == ["PointRun", "bytes", "PointRun"]
    assert pieces[1] == body


@pytest.mark.parametrize(
    "bad, message",
    [
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x7f", "declares a length above the 1024-byte limit"),
        (b"\x81\x08", "declares a length above the 1024-byte limit"),
        (b"\x80" * 10 + b"\x00", "starts with a malformed varint length"),
    ],
)
def test_errors_match_the_reference_and_keep_what_came_before(bad, message):
    good = encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=1))) + encode_frame(udf_pb2.Request(info=udf_pb2.InfoRequest()))
    stream = good + bad
    with pytest.raises(ProtocolError) as fast:
        FastFrameSplitter(max_frame_size=1024).feed(stream)
    with pytest.raises(ProtocolError) as slow:
        FrameSplitter(max_frame_size=1024).feed(stream)
    assert str(fast.value) == str(slow.value) and message in str(fast.value)
    assert "frame 3" in str(fast.value)
    assert [kind for kind, *_ in expand(fast.value.decoded)] == ["point", "other"]


def test_continuing_takes_over_a_partial_frame_mid_stream():
    stream = sample_stream()
    for cut in range(1, len(stream), 97):
        slow = FrameSplitter()
        first = [("other", body) for body in slow.feed(stream[:cut])]
        fast = FastFrameSplitter.continuing(slow)
        rest = expand(fast.feed(stream[cut:]))
        fast.close()
        expected = reference(stream)
        assert len(first) + len(rest) == len(expected) and rest == expected[len(first):]
        assert fast.frames == len(expected)


def test_random_streams_agree_with_the_reference():
    rng = random.Random(11)
    requests = []
    for i in range(3_000):
        roll = rng.random()
        if roll < 0.8:
            tags = {f"t{k}": "v" * rng.randrange(0, 40) for k in range(rng.randrange(0, 4))}
            requests.append(udf_pb2.Request(point=udf_pb2.Point(time=rng.randrange(-2**40, 2**40), name="m", group=",".join(f"{k}={v}" for k, v in tags.items()), tags=tags, fieldsDouble={"x": rng.random()})))
        elif roll < 0.9:
            requests.append(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=i)))
        else:
            requests.append(udf_pb2.Request(begin=udf_pb2.BeginBatch(name="b", size=i)))
    stream = b"".join(encode_frame(r) for r in requests)
    cuts = sorted(rng.sample(range(1, len(stream)), 200))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    _, pieces = feed_all(chunks)
    assert expand(pieces) == reference(stream)


class _Scanned:
    """``scanner._scan``'s arrays for the whole frames of ``stream``."""

    def __init__(self, stream):
        arrays = [np.empty(len(stream), dtype) for dtype in (np.int64, np.int64, np.int8, np.int64, np.int64)]
        self.count, _, _ = _scan(np.frombuffer(bytearray(stream), np.uint8), 1 << 20, *arrays)
        self.body_start, self.body_end, self.kind, self.group_start, self.group_end = (array[: self.count] for array in arrays)


def _runs_twin(found, run_bytes):
    """``scanner._runs``'s twin: the numpy calls it replaced."""
    is_point = found.kind == POINT
    frame_start = np.concatenate(([0], found.body_end[:-1]))
    edges = np.flatnonzero((is_point[1:] != is_point[:-1]) | (frame_start[1:] // run_bytes != frame_start[:-1] // run_bytes)) + 1
    bounds = [0, *edges.tolist(), found.count]
    points, groups = [], []
    for first, stop in zip(bounds[:-1], bounds[1:]):
        offset = int(frame_start[first])
        points.append(np.stack([found.body_start[first:stop] + 2, found.body_end[first:stop]], axis=1) - offset)
        run_groups = np.stack([found.group_start[first:stop], found.group_end[first:stop]], axis=1)
        groups.append(np.where(run_groups >= 0, run_groups - offset, -1))
    return bounds, np.concatenate(points), np.concatenate(groups)


@pytest.mark.parametrize("run_bytes", [64, 1000, RUN_BYTES])
def test_runs_and_offsets_are_their_numpy_twins(run_bytes):
    stream = sample_stream() * 3 + b"".join(encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=t, name="m", group="g=" + "x" * (t % 50)))) for t in range(400))
    found = _Scanned(stream)
    count, consumed, _, body_start, body_end, kind, edges, points, groups = _scan_runs(np.frombuffer(bytearray(stream), np.uint8), 1 << 20, len(stream), run_bytes)
    assert (count, consumed) == (found.count, len(stream)) and np.array_equal(body_end, found.body_end) and np.array_equal(kind, found.kind)
    twin_edges, twin_points, twin_groups = _runs_twin(found, run_bytes)
    assert edges.tolist() == twin_edges
    point = found.kind == POINT  # a frame that is no point has no point span to compare
    assert np.array_equal(points[point], twin_points[point])
    assert np.array_equal(groups, twin_groups)
    assert len(twin_edges) > (3 if run_bytes < RUN_BYTES else 2)


# ---- a Kapacitor Handler script's session: runs of the requests its handler takes as they came ----


def handler_stream():
    """Points, batches, and every request a Handler script's session acts on itself."""
    requests = [
        udf_pb2.Request(info=udf_pb2.InfoRequest()),
        udf_pb2.Request(init=udf_pb2.InitRequest(taskID="t")),
        *(udf_pb2.Request(point=udf_pb2.Point(time=t, name="m", group="g=a", tags={"g": "a" * t}, fieldsDouble={"x": t})) for t in range(3)),
        udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=5)),
        udf_pb2.Request(begin=udf_pb2.BeginBatch(name="b", size=2)),
        udf_pb2.Request(point=udf_pb2.Point(time=9, tags={"blob": "b" * 300})),  # a two-byte length
        udf_pb2.Request(end=udf_pb2.EndBatch(name="b", tmax=9)),
        udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()),
        udf_pb2.Request(),  # no request at all: for the handler's agent to say so
        udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=b"s")),
        udf_pb2.Request(point=udf_pb2.Point(time=10)),
    ]
    return b"".join(encode_frame(r) for r in requests)


def as_frames(pieces):
    """Each piece as the whole frames it stands for, length prefixes included."""
    out = []
    for piece in pieces:
        if isinstance(piece, RequestRun):
            bodies = FrameSplitter().feed(piece.frames)
            assert len(bodies) == piece.count and all(body[:2] in (b"\x82\x01", b"\x8a\x01", b"\x92\x01") for body in bodies)
            out += [encode_varint(len(body)) + body for body in bodies]
        else:
            out.append(encode_varint(len(piece)) + piece)
    return out


def test_handler_runs_whole_bytewise_and_split_are_the_reference_frames():
    stream = handler_stream()
    expected = [encode_varint(len(body)) + body for body in FrameSplitter().feed(stream)]
    for chunks in ([stream], [stream[i : i + 1] for i in range(len(stream))], *([stream[:i], stream[i:]] for i in range(len(stream) + 1))):
        splitter = RequestRunSplitter()
        pieces = [piece for chunk in chunks for piece in splitter.feed(chunk)]
        splitter.close()
        assert as_frames(pieces) == expected
        assert splitter.frames == len(expected) == 13
        # Management requests, keepalives and the empty Request are bodies, acted on by the session.
        assert [piece for piece in pieces if isinstance(piece, bytes)] == [body for body in FrameSplitter().feed(stream) if body[:2] not in (b"\x82\x01", b"\x8a\x01", b"\x92\x01")]
    (run, keepalive, *_) = RequestRunSplitter().feed(stream)[2:]
    assert isinstance(run, RequestRun) and run.count == 3 and run.frames in stream
    assert keepalive == udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=5)).SerializeToString()


def test_handler_runs_continue_mid_frame_and_report_broken_framing_as_the_reference():
    stream = handler_stream()
    for cut in range(1, len(stream), 7):
        slow = FrameSplitter()
        first = [encode_varint(len(body)) + body for body in slow.feed(stream[:cut])]
        runs = RequestRunSplitter.continuing(slow)
        assert first + as_frames(runs.feed(stream[cut:])) == [encode_varint(len(body)) + body for body in FrameSplitter().feed(stream)]
    good = encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=1))) + encode_frame(udf_pb2.Request(info=udf_pb2.InfoRequest()))
    for bad in (b"\x81\x08", b"\x80" * 10 + b"\x00"):
        with pytest.raises(ProtocolError) as fast:
            RequestRunSplitter(max_frame_size=1024).feed(good + bad)
        with pytest.raises(ProtocolError) as slow:
            FrameSplitter(max_frame_size=1024).feed(good + bad)
        assert str(fast.value) == str(slow.value) and "frame 3" in str(fast.value)
        assert as_frames(fast.value.decoded) == [encode_varint(len(body)) + body for body in slow.value.decoded]


def test_group_utf8_check_agrees_with_python_on_every_tricky_sequence():
    import random

    import numpy as np

    from udf_agent.wire.scanner import first_invalid_group

    tricky = [
        b"", b"plain", "é€𝄞".encode(), b"\x80", b"\xc0\xaf", b"\xc1\xbf", b"\xc2", b"\xc2\x41",
        b"\xe0\x80\xaf", b"\xe0\xa0\x80", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xef\xbf\xbf",
        b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
        b"\xff", b"a\xe2\x82", b"\xe2\x82\xac\xe2",
    ]
    rng = random.Random(5)
    samples = tricky + [bytes(rng.choice(b"a\x80\xbf\xc2\xdf\xe0\xed\xef\xf0\xf4\xf5") for _ in range(rng.randint(1, 6))) for _ in range(3000)]
    for sample in samples:
        spans = np.array([[1, 1 + len(sample)]])
        try:
            sample.decode()
            valid = True
        except UnicodeDecodeError:
            valid = False
        assert (first_invalid_group(b"x" + sample + b"y", spans) == -1) == valid, sample
    # A point with no group, then a bad one: the index of the bad one.
    assert first_invalid_group(b"ok\xff", np.array([[-1, -1], [0, 2], [2, 3]])) == 2


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "reference"])
def test_output_frames_go_back_in_arrival_order(compiled):
    import numpy as np

    from udf_agent.wire.hotpath import REFERENCE, CompiledWireKernels

    kernels = CompiledWireKernels() if compiled else REFERENCE

    # Bodies of 2 to 250 bytes: length prefixes of one byte and of two.
    frames = [encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=t, name="m" * (t % 7 * 40)))) for t in range(50)]
    arrival = np.random.default_rng(3).permutation(50)
    grouped_order = b"".join(frames[a] for a in arrival)  # frame j is the output of the point that arrived arrival[j]-th
    data, ends = kernels.arrival_order(grouped_order, arrival)
    assert data == b"".join(frames)
    assert ends.tolist() == np.cumsum([len(f) for f in frames]).tolist()
    # Not one whole frame per point: no reordering.
    assert kernels.arrival_order(grouped_order[:-1], arrival) is None
    assert kernels.arrival_order(grouped_order, arrival[:-1]) is None


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "reference"])
def test_frames_are_counted_but_those_whose_body_starts_with_the_uncounted_key(compiled):
    from udf_agent.wire.frames import KEEPALIVE_KEY
    from udf_agent.wire.hotpath import REFERENCE, CompiledWireKernels

    kernels = CompiledWireKernels() if compiled else REFERENCE
    keepalive = encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=5)))
    init_ok = encode_frame(udf_pb2.Response(init=udf_pb2.InitResponse(success=True)))
    points = [encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=t, name="m"))) for t in range(200)]
    data = b"".join(points[:40]) + keepalive + init_ok + b"".join(points[40:])
    assert kernels.count_frames(data, KEEPALIVE_KEY) == 201
    # Lengths of two and three bytes, and an empty frame, count as well.
    long_points = b"".join(encode_frame(udf_pb2.Response(point=udf_pb2.Point(name="m" * size))) for size in (300, 20_000))
    assert kernels.count_frames(long_points + b"\x00" + keepalive + data, KEEPALIVE_KEY) == 204
    assert kernels.count_frames(b"", KEEPALIVE_KEY) == 0


def test_a_micro_batchs_frames_are_read_from_its_result_columns_as_they_lie():
    """Each group's frames from the engine's output columns (sliced, with nulls for groups
    that gave none or were set aside), one group after another, with where each group ends."""
    import numpy as np
    import pyarrow as pa

    from udf_agent.compute.packed import Blobs
    from udf_agent.runtime.output import output_pieces
    from udf_agent.wire.hotpath import REFERENCE

    frames = [encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=t, name="m" * t))) for t in range(8)]
    first = Blobs.of_arrow(pa.array([frames[0] + frames[1], None, frames[2]], pa.binary()))
    second = Blobs.of_arrow(pa.array([b"ignored", frames[3], b"", frames[4] + frames[5] + frames[6], b"ignored too"], pa.binary()).slice(1, 3))
    both = Blobs.concat([first, second])
    assert both.data.tobytes() == b"".join(frames[:7])
    sizes = [len(frames[0] + frames[1]), 0, len(frames[2]), len(frames[3]), 0, len(frames[4] + frames[5] + frames[6])]
    assert both.ends.tolist() == np.cumsum(sizes).tolist()
    assert both.tolist() == [frames[0] + frames[1], None, frames[2], frames[3], b"", b"".join(frames[4:7])]
    # Group after group (no arrival order given), in pieces of whole frames.
    # Each task table's frames are joined as it is computed, then the slices one after another.
    slices = [(first.data.tobytes(), first.ends), (second.data.tobytes(), second.ends)]
    pieces = list(output_pieces(slices, np.array([2, 0, 1, 1, 0, 3]), None, REFERENCE))
    assert b"".join(pieces) == b"".join(frames[:7])
    assert all(piece for piece in pieces)
