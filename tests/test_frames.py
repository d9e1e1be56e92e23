"""Tests for udf_agent.wire.frames: varint-length-prefixed protobuf framing (sans-IO).

In the style of h11's tests: every input is fed whole, one byte at a time and
split at every position, and all of these must give the same messages.
"""

from __future__ import annotations

import math
import random

import pytest

from udf_agent import udf_pb2
from udf_agent.wire.frames import (
    DEFAULT_MAX_FRAME_SIZE,
    FrameDecoder,
    ProtocolError,
    encode_frame,
    encode_varint,
    frame_spans,
    last_frame_key,
)

# ---------------------------------------------------------------------------
# helpers


def feed_whole(message_type, data: bytes, **kwargs):
    decoder = FrameDecoder(message_type, **kwargs)
    out = decoder.feed(data)
    decoder.close()
    return out


def feed_bytewise(message_type, data: bytes, **kwargs):
    decoder = FrameDecoder(message_type, **kwargs)
    out = []
    for i in range(len(data)):
        out.extend(decoder.feed(data[i : i + 1]))
    decoder.close()
    return out


def feed_chunks(message_type, chunks, **kwargs):
    decoder = FrameDecoder(message_type, **kwargs)
    out = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    decoder.close()
    return out


def request_of_body_size(n: int) -> udf_pb2.Request:
    """A Request whose serialised body is exactly ``n`` bytes."""
    for k in range(n + 1):
        msg = udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=b"s" * k))
        size = msg.ByteSize()
        if size == n:
            return msg
        if size > n:
            break
    for k in range(n + 1):
        msg = udf_pb2.Request(point=udf_pb2.Point(name="p" * k, time=1))
        if msg.ByteSize() == n:
            return msg
    raise AssertionError(f"cannot build a Request of exactly {n} bytes")


def sample_requests() -> list[udf_pb2.Request]:
    """A handful of Requests of every kind, including empty and multi-byte bodies."""
    point = udf_pb2.Point(
        time=1_600_000_000_000_000_000,
        name="cpu",
        database="telegraf",
        retentionPolicy="autogen",
        group="host=a,region=eu",
        dimensions=["host", "region"],
        tags={"host": "a", "region": "eu"},
        fieldsDouble={"usage": 12.5},
        fieldsInt={"count": -3},
        fieldsString={"state": "ok"},
        fieldsBool={"up": True, "down": False},
        byName=True,
    )
    return [
        udf_pb2.Request(info=udf_pb2.InfoRequest()),
        udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=42)),
        udf_pb2.Request(),  # an empty frame: length 0
        udf_pb2.Request(point=point),
        udf_pb2.Request(
            begin=udf_pb2.BeginBatch(name="cpu", group="g", tags={"t": "v"}, size=300, byName=True)
        ),
        udf_pb2.Request(end=udf_pb2.EndBatch(name="cpu", group="g", tmax=7, tags={"t": "v"})),
        request_of_body_size(200),  # two-byte varint length
        udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()),
    ]


# ---------------------------------------------------------------------------
# encode_varint


@pytest.mark.parametrize(
    "value, expected",
    [
        (0, b"\x00"),
        (1, b"\x01"),
        (127, b"\x7f"),
        (128, b"\x80\x01"),
        (300, b"\xac\x02"),
        (16383, b"\xff\x7f"),
        (16384, b"\x80\x80\x01"),
        (2**64 - 1, b"\xff" * 9 + b"\x01"),
    ],
)
def test_encode_varint(value, expected):
    assert encode_varint(value) == expected


def test_encode_varint_rejects_negative():
    with pytest.raises(ValueError):
        encode_varint(-1)


def test_encode_frame_is_length_then_body():
    msg = udf_pb2.Request(point=udf_pb2.Point(name="cpu", tags={"a": "b"}))
    body = msg.SerializeToString()
    frame = encode_frame(msg)
    assert isinstance(frame, bytes)
    assert frame == encode_varint(len(body)) + body


# ---------------------------------------------------------------------------
# golden frames from the facts doc (Kapacitor's own encoding)

GOLDEN = [
    ("InfoRequest", udf_pb2.Request, "02 0a 00", udf_pb2.Request(info=udf_pb2.InfoRequest())),
    (
        "KeepaliveRequest(time=42)",
        udf_pb2.Request,
        "04 1a 02 08 2a",
        udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=42)),
    ),
    (
        "InitResponse(success)",
        udf_pb2.Response,
        "04 12 02 08 01",
        udf_pb2.Response(init=udf_pb2.InitResponse(success=True)),
    ),
    ("SnapshotRequest", udf_pb2.Request, "02 22 00", udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest())),
    (
        "ErrorResponse(boom)",
        udf_pb2.Response,
        "08 32 06 0a 04 62 6f 6f 6d",
        udf_pb2.Response(error=udf_pb2.ErrorResponse(error="boom")),
    ),
    (
        "InfoResponse(STREAM->BATCH)",
        udf_pb2.Response,
        "04 0a 02 10 01",
        udf_pb2.Response(info=udf_pb2.InfoResponse(wants=udf_pb2.STREAM, provides=udf_pb2.BATCH)),
    ),
]


@pytest.mark.parametrize("label, mtype, hexframe, expected", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_frame_decodes(label, mtype, hexframe, expected):
    frame = bytes.fromhex(hexframe)
    for got in (feed_whole(mtype, frame), feed_bytewise(mtype, frame)):
        assert got == [expected]
        assert got[0].WhichOneof("message") == expected.WhichOneof("message")


@pytest.mark.parametrize("label, mtype, hexframe, expected", GOLDEN, ids=[g[0] for g in GOLDEN])
def test_golden_frame_reencodes(label, mtype, hexframe, expected):
    frame = bytes.fromhex(hexframe)
    (decoded,) = feed_whole(mtype, frame)
    # These messages have no maps, so the bytes are deterministic too.
    assert encode_frame(decoded) == frame
    assert encode_frame(expected) == frame
    # and the re-encoded frame parses back to the same message
    assert feed_whole(mtype, encode_frame(decoded)) == [expected]


def test_all_golden_frames_in_one_stream():
    requests = [g for g in GOLDEN if g[1] is udf_pb2.Request]
    stream = b"".join(bytes.fromhex(g[2]) for g in requests)
    expected = [g[3] for g in requests]
    assert feed_whole(udf_pb2.Request, stream) == expected
    assert feed_bytewise(udf_pb2.Request, stream) == expected


# ---------------------------------------------------------------------------
# chunking: whole, bytewise, every split point


def test_whole_bytewise_and_every_split_agree():
    messages = sample_requests()
    stream = b"".join(encode_frame(m) for m in messages)
    assert feed_whole(udf_pb2.Request, stream) == messages
    assert feed_bytewise(udf_pb2.Request, stream) == messages
    for i in range(len(stream) + 1):
        got = feed_chunks(udf_pb2.Request, [stream[:i], stream[i:]])
        assert got == messages, f"split at {i}"


def test_every_pair_of_split_points_agree():
    messages = [
        udf_pb2.Request(info=udf_pb2.InfoRequest()),
        udf_pb2.Request(point=udf_pb2.Point(name="m", tags={"k": "v"}, fieldsInt={"f": 1})),
        udf_pb2.Request(),
        udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=2**40)),
    ]
    stream = b"".join(encode_frame(m) for m in messages)
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1):
            got = feed_chunks(udf_pb2.Request, [stream[:i], stream[i:j], stream[j:]])
            assert got == messages, f"split at {i}, {j}"


def test_feed_returns_messages_as_soon_as_each_frame_completes():
    messages = sample_requests()
    frames = [encode_frame(m) for m in messages]
    decoder = FrameDecoder(udf_pb2.Request)
    for frame, msg in zip(frames, messages):
        assert decoder.feed(frame[:-1]) == []
        assert decoder.buffered == len(frame) - 1
        assert decoder.feed(frame[-1:]) == [msg]
        assert decoder.buffered == 0
    decoder.close()


def test_empty_feed_returns_nothing():
    decoder = FrameDecoder(udf_pb2.Request)
    assert decoder.feed(b"") == []
    assert decoder.buffered == 0
    decoder.close()


def test_empty_frame_is_an_empty_message():
    (msg,) = feed_whole(udf_pb2.Request, b"\x00")
    assert msg == udf_pb2.Request()
    assert msg.WhichOneof("message") is None


# ---------------------------------------------------------------------------
# end of input


@pytest.mark.parametrize("cut", [1, 2, 5, -1])
def test_trailing_partial_frame(cut):
    complete = encode_frame(udf_pb2.Request(info=udf_pb2.InfoRequest()))
    partial = encode_frame(request_of_body_size(300))[:cut]
    decoder = FrameDecoder(udf_pb2.Request)
    assert decoder.feed(complete + partial) == [udf_pb2.Request(info=udf_pb2.InfoRequest())]
    assert decoder.buffered == len(partial)
    with pytest.raises(ProtocolError, match="ended inside a frame"):
        decoder.close()


def test_partial_varint_only_then_close():
    decoder = FrameDecoder(udf_pb2.Request)
    assert decoder.feed(b"\x80") == []  # first byte of a two-byte length
    with pytest.raises(ProtocolError):
        decoder.close()


def test_frame_spans_walk_whole_frames_and_end_at_a_cut():
    big = b"\x8a\x01" + b"x" * 200  # a body of 202 bytes: a length of two bytes
    data = encode_varint(len(big)) + big + b"\x00" + b"\x02\x1a\x00"
    spans = list(frame_spans(data))
    assert spans == [(0, 2, 204), (204, 205, 205), (205, 206, 208)]  # an empty body between
    assert last_frame_key(data) == 0x1A
    assert last_frame_key(data[:205]) is None and last_frame_key(b"") is None
    assert last_frame_key(data[:204]) == 0x8A and last_frame_key(data[:100]) is None  # a cut frame has no key yet
    # Cut inside a body, the last span ends past the data; cut inside a length, the walk ends.
    assert list(frame_spans(data[:100])) == [(0, 2, 204)]
    assert list(frame_spans(data[:1])) == []


def test_close_after_complete_frames_leaves_nothing_behind():
    decoder = FrameDecoder(udf_pb2.Request)
    (message,) = decoder.feed(b"\x02\x0a\x00")
    assert message == udf_pb2.Request(info=udf_pb2.InfoRequest()) and decoder.buffered == 0
    decoder.close()  # nothing left, so no error (a partial frame: test_trailing_partial_frame)


# ---------------------------------------------------------------------------
# 10,000-message round trip


def _random_string(rng: random.Random) -> str:
    alphabet = "abcxyz_-=,. \n\\\"é☃𝄞"
    return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 12)))


def _random_request(rng: random.Random) -> udf_pb2.Request:
    kind = rng.randrange(9)
    if kind <= 3:  # points dominate real streams
        ntags = rng.randrange(0, 4)
        tags = {f"t{i}_{_random_string(rng)}": _random_string(rng) for i in range(ntags)}
        point = udf_pb2.Point(
            time=rng.randrange(-(2**63), 2**63),
            name=_random_string(rng),
            database=_random_string(rng),
            retentionPolicy=_random_string(rng),
            group=_random_string(rng),
            dimensions=sorted(tags),
            tags=tags,
            fieldsDouble={
                f"d{i}": rng.choice([0.0, -0.0, 1.5, -1e300, 5e-324, math.inf, -math.inf, rng.random()])
                for i in range(rng.randrange(0, 4))
            },
            fieldsInt={f"i{i}": rng.randrange(-(2**63), 2**63) for i in range(rng.randrange(0, 4))},
            fieldsString={f"s{i}": _random_string(rng) for i in range(rng.randrange(0, 3))},
            fieldsBool={f"b{i}": rng.random() < 0.5 for i in range(rng.randrange(0, 3))},
            byName=rng.random() < 0.3,
        )
        return udf_pb2.Request(point=point)
    if kind == 4:
        return udf_pb2.Request(
            begin=udf_pb2.BeginBatch(
                name=_random_string(rng),
                group=_random_string(rng),
                tags={_random_string(rng): _random_string(rng) for _ in range(rng.randrange(0, 3))},
                size=rng.randrange(0, 2**40),
                byName=rng.random() < 0.5,
            )
        )
    if kind == 5:
        return udf_pb2.Request(
            end=udf_pb2.EndBatch(
                name=_random_string(rng),
                group=_random_string(rng),
                tmax=rng.randrange(0, 2**62),
                tags={_random_string(rng): _random_string(rng) for _ in range(rng.randrange(0, 3))},
                byName=rng.random() < 0.5,
            )
        )
    if kind == 6:
        values = [
            udf_pb2.OptionValue(type=udf_pb2.BOOL, boolValue=rng.random() < 0.5),
            udf_pb2.OptionValue(type=udf_pb2.INT, intValue=rng.randrange(-1000, 1000)),
            udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=rng.random()),
            udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=_random_string(rng)),
            udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=rng.randrange(0, 10**12)),
        ]
        rng.shuffle(values)
        return udf_pb2.Request(
            init=udf_pb2.InitRequest(
                options=[udf_pb2.Option(name=_random_string(rng), values=values[: rng.randrange(0, 6)])],
                taskID=_random_string(rng),
                nodeID=f"customFunc{rng.randrange(10)}",
            )
        )
    if kind == 7:
        return udf_pb2.Request(
            restore=udf_pb2.RestoreRequest(snapshot=rng.randbytes(rng.choice([0, 1, 127, 128, 500])))
        )
    return rng.choice(
        [
            udf_pb2.Request(info=udf_pb2.InfoRequest()),
            udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()),
            udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=rng.randrange(0, 2**63))),
        ]
    )


def test_round_trip_10000_varied_requests():
    rng = random.Random(20240611)
    messages = [_random_request(rng) for _ in range(10_000)]
    kinds = {m.WhichOneof("message") for m in messages}
    assert kinds == {"info", "init", "keepalive", "snapshot", "restore", "begin", "point", "end"}
    stream = b"".join(encode_frame(m) for m in messages)

    assert feed_whole(udf_pb2.Request, stream) == messages

    # random chunk sizes, from 1 byte to several frames at once
    chunks = []
    pos = 0
    while pos < len(stream):
        step = rng.choice([1, 2, 3, 7, 64, 1000, 4096, 65536])
        chunks.append(stream[pos : pos + step])
        pos += step
    got = feed_chunks(udf_pb2.Request, chunks)
    assert len(got) == len(messages)
    for i, (a, b) in enumerate(zip(got, messages)):
        assert a == b, f"message {i} differs"


# ---------------------------------------------------------------------------
# malformed input


@pytest.mark.parametrize("byte", [b"\x80", b"\xff"])
def test_malformed_varint_whole(byte):
    data = byte * 11
    decoder = FrameDecoder(udf_pb2.Request)
    with pytest.raises(ProtocolError):
        decoder.feed(data)


def test_malformed_varint_bytewise_raises_by_the_eleventh_byte():
    # 0x80 keeps the value at 0, so only the varint's own length can reject it.
    decoder = FrameDecoder(udf_pb2.Request)
    with pytest.raises(ProtocolError, match="malformed varint"):
        for _ in range(11):
            decoder.feed(b"\x80")


def test_ten_byte_zero_varint_is_not_malformed():
    # 0x80 * 9 + 0x00 is a (non-minimal) ten-byte encoding of 0: legal.
    assert feed_whole(udf_pb2.Request, b"\x80" * 9 + b"\x00") == [udf_pb2.Request()]
    assert feed_bytewise(udf_pb2.Request, b"\x80" * 9 + b"\x00") == [udf_pb2.Request()]


def test_malformed_varint_after_a_good_frame_bytewise():
    good = bytes.fromhex("02 0a 00")
    decoder = FrameDecoder(udf_pb2.Request)
    got = []
    for b in good:
        got.extend(decoder.feed(bytes([b])))
    assert got == [udf_pb2.Request(info=udf_pb2.InfoRequest())]
    with pytest.raises(ProtocolError):
        for _ in range(11):
            decoder.feed(b"\x80")


def test_oversized_length_refused_before_any_body_arrives():
    decoder = FrameDecoder(udf_pb2.Request, max_frame_size=100)
    with pytest.raises(ProtocolError, match="100"):
        decoder.feed(encode_varint(101))  # the length alone, no body bytes


def test_oversized_multibyte_length_refused_bytewise_within_the_varint():
    declared = 10**9
    varint = encode_varint(declared)
    decoder = FrameDecoder(udf_pb2.Request, max_frame_size=1000)
    # Only the length's bytes are fed: it must be refused without any body byte.
    with pytest.raises(ProtocolError, match="1000"):
        for i in range(len(varint)):
            decoder.feed(varint[i : i + 1])


def test_absurd_length_refused_with_the_default_cap():
    decoder = FrameDecoder(udf_pb2.Request)
    with pytest.raises(ProtocolError):
        decoder.feed(encode_varint(DEFAULT_MAX_FRAME_SIZE + 1))
    # ... and a length just below the cap is merely waited for, not refused
    decoder = FrameDecoder(udf_pb2.Request)
    assert decoder.feed(encode_varint(DEFAULT_MAX_FRAME_SIZE)) == []


@pytest.mark.parametrize("cap", [100, 128, 16384])
def test_length_exactly_at_cap_accepted(cap):
    msg = request_of_body_size(cap)
    frame = encode_frame(msg)
    assert feed_whole(udf_pb2.Request, frame, max_frame_size=cap) == [msg]
    assert feed_chunks(udf_pb2.Request, [frame[:2], frame[2:]], max_frame_size=cap) == [msg]
    with pytest.raises(ProtocolError):
        FrameDecoder(udf_pb2.Request, max_frame_size=cap - 1).feed(frame)


@pytest.mark.parametrize(
    "body",
    [
        b"\x0a\x05",  # field 1 declares 5 bytes, none follow
        b"\x8a\x01\x03\x12\x01\xff",  # Point.name with invalid UTF-8
        b"\xff\xff\xff",  # garbage tag
    ],
)
def test_invalid_protobuf_body(body):
    frame = encode_varint(len(body)) + body
    decoder = FrameDecoder(udf_pb2.Request)
    decoder.feed(bytes.fromhex("02 0a 00"))
    with pytest.raises(ProtocolError) as info:
        decoder.feed(frame)
    text = str(info.value)
    assert "not a valid Request" in text
    assert "frame 2" in text
    assert info.value.__cause__ is None


def test_invalid_body_bytewise_raises_on_last_byte():
    body = b"\x0a\x05"
    frame = encode_varint(len(body)) + body
    decoder = FrameDecoder(udf_pb2.Request)
    for i in range(len(frame) - 1):
        assert decoder.feed(frame[i : i + 1]) == []
    with pytest.raises(ProtocolError):
        decoder.feed(frame[-1:])


# ---------------------------------------------------------------------------
# multi-byte varint lengths


@pytest.mark.parametrize("size, varint_len", [(127, 1), (128, 2), (16383, 2), (16384, 3)])
def test_multibyte_lengths(size, varint_len):
    msg = request_of_body_size(size)
    frame = encode_frame(msg)
    assert len(frame) == size + varint_len
    assert frame[:varint_len] == encode_varint(size)
    assert feed_whole(udf_pb2.Request, frame) == [msg]
    # split inside the varint and at the body boundary
    for cut in range(1, varint_len + 2):
        assert feed_chunks(udf_pb2.Request, [frame[:cut], frame[cut:]]) == [msg]
    # two of them back to back
    assert feed_whole(udf_pb2.Request, frame + frame) == [msg, msg]


def test_16384_byte_body_fed_bytewise():
    msg = request_of_body_size(16384)
    assert feed_bytewise(udf_pb2.Request, encode_frame(msg)) == [msg]


# ---------------------------------------------------------------------------
# fresh objects


def test_messages_are_fresh_objects():
    msg = udf_pb2.Request(point=udf_pb2.Point(name="cpu", tags={"host": "a"}, fieldsDouble={"v": 1.0}))
    frame = encode_frame(msg)
    decoder = FrameDecoder(udf_pb2.Request)
    first, second = decoder.feed(frame + frame)
    assert first is not second
    assert first.point is not second.point
    first.point.tags["host"] = "changed"
    first.point.fieldsDouble["v"] = 99.0
    first.point.name = "other"
    assert second == msg
    (third,) = decoder.feed(frame)
    assert third == msg
    assert first.point.tags["host"] == "changed"


def test_sub_message_reference_survives_later_frames():
    decoder = FrameDecoder(udf_pb2.Request)
    a = udf_pb2.Request(point=udf_pb2.Point(name="a", time=1, tags={"k": "1"}))
    b = udf_pb2.Request(point=udf_pb2.Point(name="b", time=2, tags={"k": "2"}))
    (got_a,) = decoder.feed(encode_frame(a))
    point_a = got_a.point
    (got_b,) = decoder.feed(encode_frame(b))
    assert point_a.name == "a" and point_a.time == 1 and dict(point_a.tags) == {"k": "1"}
    assert got_b.point.name == "b"


def test_decoder_of_responses():
    msgs = [
        udf_pb2.Response(info=udf_pb2.InfoResponse(wants=udf_pb2.BATCH, provides=udf_pb2.STREAM)),
        udf_pb2.Response(point=udf_pb2.Point(name="x", fieldsBool={"ok": True})),
        udf_pb2.Response(error=udf_pb2.ErrorResponse(error="boom")),
    ]
    stream = b"".join(encode_frame(m) for m in msgs)
    got = feed_bytewise(udf_pb2.Response, stream)
    assert got == msgs
    assert all(isinstance(m, udf_pb2.Response) for m in got)


def test_messages_before_bad_bytes_in_the_same_chunk_are_kept():
    good = [udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=t)) for t in (1, 2)]
    data = b"".join(encode_frame(m) for m in good) + b"\x80" * 11
    decoder = FrameDecoder(udf_pb2.Request)
    with pytest.raises(ProtocolError) as caught:
        decoder.feed(data)
    assert caught.value.decoded == good


def test_point_frames_equal_what_protobuf_makes():
    from udf_agent.wire.guard import encode_points

    points = [
        udf_pb2.Point(),
        udf_pb2.Point(time=1, name="cpu", tags={"host": "a" * 300}, fieldsDouble={"v": 1.5}, fieldsBool={"b": True}),
        udf_pb2.Point(time=-5, fieldsString={"s": "x" * 20_000}, dimensions=["host"]),
    ]
    data = encode_points(points)
    assert FrameDecoder(udf_pb2.Response).feed(data) == [udf_pb2.Response(point=p) for p in points]
    assert data == b"".join(encode_frame(udf_pb2.Response(point=p)) for p in points)


def test_point_group_reads_the_group_without_parsing():
    from udf_agent.wire.frames import point_group

    rng = random.Random(5)
    for i in range(300):
        point = udf_pb2.Point(
            time=rng.randint(-(2**63), 2**63 - 1),
            name=rng.choice(["", "cpu", "ü" * 70]),
            group=rng.choice(["", "host=a", "cpu\nhost=b,region=ü", "g" * 200]),
            dimensions=["host"] * rng.randint(0, 2),
            tags={"host": "a"} if i % 2 else {},
            fieldsDouble={"d": rng.random()} if i % 3 else {},
            fieldsInt={"i": -1},
            fieldsBool={"b": True},
            byName=bool(i % 5),
        )
        assert point_group(point.SerializeToString()) == point.group


def test_point_group_rejects_a_truncated_point():
    from udf_agent.wire.frames import point_group

    data = udf_pb2.Point(name="cpu", group="host=a").SerializeToString()
    with pytest.raises(ProtocolError):
        point_group(data[:-2])


def test_request_point_returns_the_point_bytes_of_a_point_only_request():
    from udf_agent.wire.frames import request_point

    point = udf_pb2.Point(time=3, group="g", fieldsDouble={"v": 1.0})
    body = udf_pb2.Request(point=point).SerializeToString()
    assert udf_pb2.Point.FromString(request_point(body)) == point
    assert request_point(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=1)).SerializeToString()) is None
    # A point followed by another field is left to the full parser (the last field wins there).
    assert request_point(body + udf_pb2.Request(info=udf_pb2.InfoRequest()).SerializeToString()) is None
