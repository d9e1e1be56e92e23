"""The compiled point decoder and encoder (udf_agent.wire.pointcodec) against the reference path.

decode: the same Arrow table as ``table.decode_points`` (protobuf, point by point).
encode: the same points, parsed, as ``compute.output_points`` + ``guard.encode_points``.
"""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from udf_agent import udf_pb2
from udf_agent.api import Context
from udf_agent.compute.frame import Layout
from udf_agent.compute.results import output_points
from udf_agent.options import OptionValues
from udf_agent.wire import columns as cols
from udf_agent.wire import pointcodec
from udf_agent.wire.batches import GroupRows
from udf_agent.wire.columns import decode_points
from udf_agent.wire.frames import FrameDecoder, ProtocolError, encode_varint
from udf_agent.wire.guard import encode_points


def random_points(seed: int, count: int) -> list[udf_pb2.Point]:
    rng = random.Random(seed)
    points = []
    for _ in range(count):
        tags = {f"t{k}": rng.choice(["", "a", "é", "v" * 30]) for k in range(rng.randrange(0, 4))}
        point = udf_pb2.Point(
            time=rng.randrange(-(2**62), 2**62),
            name=rng.choice(["cpu", "mem", "ünïcode"]),
            database=rng.choice(["", "telegraf"]),
            retentionPolicy=rng.choice(["", "autogen"]),
            group=",".join(f"{k}={v}" for k, v in tags.items()),
            dimensions=sorted(tags)[: rng.randrange(0, len(tags) + 1)],
            tags=tags,
            byName=rng.random() < 0.3,
        )
        if rng.random() < 0.8:
            point.fieldsDouble["x"] = rng.choice([rng.random(), -0.0, float("inf"), float("nan"), 1e300])
        if rng.random() < 0.5:
            point.fieldsInt["n"] = rng.randrange(-(2**63), 2**63)
        if rng.random() < 0.3:
            point.fieldsString["s"] = rng.choice(["", "é", "x" * 200])
        if rng.random() < 0.3:
            point.fieldsBool["b"] = rng.random() < 0.5
        if rng.random() < 0.1:
            point.fieldsDouble["tag_clash"] = 1.0
            point.tags["tag_clash"] = "t"
        points.append(point)
    return points


def encoded(points: list[udf_pb2.Point]) -> bytes:
    rows = GroupRows()
    for point in points:
        rows.append(point.SerializeToString())
    return rows.encoded()


def assert_same_table(fast, reference):
    """Equal schemas and values, NaN equal to NaN (Arrow's ``equals`` says it is not)."""
    assert fast.schema == reference.schema
    for name in reference.column_names:
        for got, want in zip(fast.column(name).to_pylist(), reference.column(name).to_pylist()):
            assert got == want or (got != got and want != want), (name, got, want)


@pytest.mark.parametrize("seed", range(5))
def test_decode_gives_the_reference_table(seed):
    data = encoded(random_points(seed, 2_000))
    assert_same_table(pointcodec.decode_points(data), decode_points(data))


def test_decode_of_no_points_and_of_empty_points():
    assert_same_table(pointcodec.decode_points(b""), decode_points(b""))
    data = encoded([udf_pb2.Point(), udf_pb2.Point(time=5)])
    assert_same_table(pointcodec.decode_points(data), decode_points(data))


@pytest.mark.parametrize("fields", [3, pointcodec._FEW_COLUMNS - 1, pointcodec._FEW_COLUMNS, 500])
def test_decode_of_sparse_keys_gives_the_reference_table(fields):
    # Up to _FEW_COLUMNS distinct keys (one tag and the fields) are found by a linear
    # search, more by sorting their hashes.
    rng = random.Random(fields)
    points = []
    for i in range(5_000):
        point = udf_pb2.Point(time=i, name="m", tags={"host": rng.choice(["a", "b"])})
        for _ in range(rng.randrange(4)):
            point.fieldsDouble[f"f{rng.randrange(fields)}"] = rng.random()
        points.append(point)
    data = encoded(points)
    fast = pointcodec.decode_points(data)
    assert_same_table(fast, decode_points(data))
    assert sum(name.startswith("fd:") for name in fast.column_names) == fields


def test_duplicate_map_keys_keep_the_last_value_as_protobuf_does():
    entry = lambda value: b"\x42\x0c\x0a\x01x\x11" + np.float64(value).tobytes()  # fieldsDouble {x: value}
    point = udf_pb2.Point(time=1, name="m").SerializeToString() + entry(1.0) + entry(2.0)
    data = encode_varint(len(point)) + point
    assert_same_table(pointcodec.decode_points(data), decode_points(data))
    assert pointcodec.decode_points(data).column("fd:x").to_pylist() == [2.0]


@pytest.mark.parametrize(
    "point",
    [b"\x12\x05ab", b"\x3a\x04\x0a\x05ab", b"\x0b", b"\x42\x03\x11\x00\x00"],
    ids=["field-overrun", "entry-overrun", "wire-type-3", "short-double"],
)
def test_a_malformed_point_is_a_protocol_error(point):
    with pytest.raises(ProtocolError):
        pointcodec.decode_points(encode_varint(len(point)) + point)


@pytest.mark.parametrize(
    "extra",
    [b"\x12\x02\xff\xfe", b"\x32\x01\xc0", b"\x3a\x07\x0a\x01h\x12\x02\xed\xa0", b"\x52\x05\x0a\x01\xff\x12\x00", b"\x52\x06\x0a\x01s\x12\x01\x80"],
    ids=["name", "dimension", "tag-value", "field-name", "string-field"],
)
def test_invalid_utf8_is_a_protocol_error_naming_the_point_when_decoded(extra):
    good = udf_pb2.Point(time=1, name="m", tags={"host": "a"}).SerializeToString()
    bad = udf_pb2.Point(time=2).SerializeToString() + extra
    # Decoding alone raises: a vectorized UDF's frame is made without the table that used to check.
    with pytest.raises(ProtocolError, match="point 2 of this micro-batch's group has a string, tag or field name that is not valid UTF-8"):
        pointcodec.decode_with_headers(encode_varint(len(good)) + good + encode_varint(len(bad)) + bad)



def test_invalid_utf8_names_the_first_point_at_fault_whatever_the_string():
    """A bad tag value in point 2 and a bad name in point 3: point 2, though names are checked first."""
    good = udf_pb2.Point(time=1, name="m").SerializeToString()
    bad_tag = udf_pb2.Point(time=2).SerializeToString() + b"\x3a\x07\x0a\x01h\x12\x02\xed\xa0"
    bad_name = udf_pb2.Point(time=3).SerializeToString() + b"\x12\x02\xff\xfe"
    data = b"".join(encode_varint(len(point)) + point for point in (good, bad_tag, bad_name))
    with pytest.raises(ProtocolError, match="point 2 of this micro-batch's group has a string"):
        pointcodec.decode_with_headers(data)

def reference_frames(points, result, first_row=0):
    data = decode_points(encoded(points))
    ctx = Context(options=OptionValues({}, ()), group=points[-1].group, tags={}, name=points[-1].name)
    return encode_points(output_points(result, data, Layout(tag_columns={}), ctx, first_row=first_row))


def parsed(frames: bytes) -> list[bytes]:
    """Each point, serialized deterministically: comparable with NaN values on every protobuf
    runtime (5.x's message equality has NaN unequal to itself, 7.x's not)."""
    return [r.point.SerializeToString(deterministic=True) for r in FrameDecoder(udf_pb2.Response).feed(frames)]


@pytest.mark.parametrize("seed", range(3))
def test_encode_rows_gives_the_reference_points(seed):
    points = [p for p in random_points(seed, 500) if p.name]
    for point in points:
        point.group = "g=1"  # a task holds one group; the reference names every output point with it
    rng = np.random.default_rng(seed)
    count = len(points)
    result = pd.DataFrame(
        {
            "avg": np.where(rng.random(count) < 0.1, np.nan, rng.normal(size=count)),
            "count": rng.integers(-(2**63), 2**63 - 1, size=count),
            "flag": rng.random(count) < 0.5,
            "field:time": rng.normal(size=count),
        },
        index=pd.RangeIndex(count, name="input_row"),
    )
    rows = rng.permutation(count)[: count // 2]  # a subset, in any order: output is in input order
    subset = result.iloc[rows]
    _, headers = pointcodec.decode_with_headers(encoded(points))
    order = np.sort(rows)
    fields = [(("time" if c == "field:time" else c), subset[c].to_numpy()[np.argsort(rows)]) for c in subset.columns]
    written = pointcodec.encode_rows(headers, order, fields)
    assert written is not None
    frames, ends = written
    assert parsed(frames) == parsed(reference_frames(points, subset))
    # Each frame ends where the next begins: the frames of any row range can be cut out.
    assert ends[-1] == len(frames) and len(ends) == len(order)
    starts = np.concatenate(([0], ends[:-1]))
    assert [parsed(frames[a:b])[0] for a, b in zip(starts, ends)] == parsed(frames)


@pytest.mark.parametrize(
    "rows",
    [slice(None), slice(7, None), slice(3, 40), slice(None, None, 3), slice(None, None, -1), [5, 2, 9, 0, 31, 30]],
    ids=["whole", "from-row-7", "a-stretch", "every-third", "reversed", "in-any-order"],
)
def test_encode_rows_of_gives_the_reference_points_whatever_the_results_index(rows):
    """Whether the result keeps the input's RangeIndex (the fast path: in order, no label
    checked), a stretch or stride of it, or labels in any order, the frames are the
    reference's: input order, history rows (below ``first_row``) dropped."""
    from udf_agent.compute.results import encode_rows_of

    points = [p for p in random_points(4, 60) if p.name]
    for point in points:
        point.group = "g=1"
    _, headers = pointcodec.decode_with_headers(encoded(points))
    count = len(points)
    whole = pd.DataFrame({"avg": np.arange(count) * 0.5}, index=pd.RangeIndex(count, name="input_row"))
    result = whole.iloc[rows]
    # No history row, or the first four; given as one row number, or one per row (a vectorized
    # call's, each group's own).
    for first_row in (0, 4):
        for seen in (first_row, np.full(count, first_row)):
            written = encode_rows_of(result, headers, Layout(tag_columns={}), count, seen)
            assert written is not None
            frames, picked, _ = written
            assert picked.tolist() == sorted(r for r in result.index if r >= first_row)
            assert parsed(frames) == parsed(reference_frames(points, result, first_row))


def test_encode_rows_of_refuses_a_range_index_past_the_input_rows():
    from udf_agent.compute.results import encode_rows_of

    points = [udf_pb2.Point(time=t, name="m", fieldsDouble={"v": 1.0}) for t in range(3)]
    _, headers = pointcodec.decode_with_headers(encoded(points))
    result = pd.DataFrame({"avg": [1.0, 2.0, 3.0]}, index=pd.RangeIndex(1, 4, name="input_row"))
    with pytest.raises(ValueError, match="holds labels that are not input rows"):
        encode_rows_of(result, headers, Layout(tag_columns={}), 3, 0)


def _last_points_twin(headers, starts, rows):
    """``Headers.last_points``'s twin: the numpy calls it replaced."""
    first = np.maximum(starts[:-1], starts[1:] - rows)
    stop = starts[1:]
    spans = np.zeros((len(first), 2), np.int64)
    present = first < stop
    spans[present, 0] = headers.points[first[present], 0]
    spans[present, 1] = headers.points[stop[present] - 1, 1]
    data = b"".join(headers.raw[a:b] for a, b in spans.tolist())
    lengths = (spans[:, 1] - spans[:, 0]).astype(np.int64)
    lengths[~present] = -1
    return data, lengths


@pytest.mark.parametrize("rows", [0, 1, 3, 50])
def test_last_points_of_each_group_are_their_numpy_twin(rows):
    rng = random.Random(rows)
    points = [udf_pb2.Point(time=t, name="m", tags={"g": "x" * rng.randrange(0, 300)}, fieldsDouble={"v": t}) for t in range(60)]
    _, headers = pointcodec.decode_with_headers(encoded(points))
    sizes = [0, 1, 2, 7, 0, 20, 30, 0]  # groups of none, of fewer points than rows, of more
    starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
    data, lengths = headers.last_points(starts, rows)
    twin_data, twin_lengths = _last_points_twin(headers, starts, rows)
    assert data.tobytes() == twin_data and lengths.tolist() == twin_lengths.tolist()
    assert (lengths == -1).sum() == (3 if rows else len(sizes))


@pytest.mark.parametrize("seed", range(6))
def test_compacted_points_keep_their_time_name_database_retention_policy_and_the_columns_asked_for(seed):
    """Each compacted point, parsed by protobuf, is its point with only those: every value as
    it was (NaN, -0.0, the int64 extremes, empty strings, a tag and a field of one name), in
    groups of the rows asked for, a group of none -1."""
    rng = random.Random(seed)
    points = random_points(seed, 80)
    decoded, _ = pointcodec.decode_with_headers(encoded(points))
    columns = frozenset(rng.sample(sorted(set(decoded.names) - set(pointcodec._FIXED_COLUMNS)), rng.randrange(0, 4)))
    sizes = [0, 3, 1, 0, 12, 40, 0]
    rows = np.array(rng.sample(range(len(points)), sum(sizes)), np.int64)
    data, lengths = decoded.compacted(rows, np.cumsum(sizes), columns | {cols.FIELD_DOUBLE + "absent"})
    assert [length == -1 for length in lengths.tolist()] == [size == 0 for size in sizes]
    assert sum(max(0, length) for length in lengths.tolist()) == len(data)
    compacts = FrameDecoder(udf_pb2.Point).feed(data.tobytes())
    assert len(compacts) == len(rows)
    kept = {name: name[len(cols.column_prefix(name)) :] for name in columns}
    for row, compact in zip(rows.tolist(), compacts):
        point = points[row]
        expected = udf_pb2.Point(time=point.time, name=point.name, database=point.database, retentionPolicy=point.retentionPolicy)
        for kind, maps in ((cols.TAG, "tags"), (cols.FIELD_DOUBLE, "fieldsDouble"), (cols.FIELD_INT, "fieldsInt"), (cols.FIELD_STRING, "fieldsString"), (cols.FIELD_BOOL, "fieldsBool")):
            for name, key in kept.items():
                if name.startswith(kind) and key in getattr(point, maps):
                    getattr(expected, maps)[key] = getattr(point, maps)[key]
        assert compact.SerializeToString(deterministic=True) == expected.SerializeToString(deterministic=True)


def test_points_decoded_by_the_reference_are_not_compacted():
    """Two keys of one 64-bit hash send a micro-batch to the reference decoder: its map entries
    are not at hand, and the caller keeps the points whole."""
    decoded = pointcodec.DecodedPoints(decode_points(encoded(random_points(1, 3))))
    assert decoded.compacted(np.array([0, 1]), np.array([2]), frozenset({cols.FIELD_DOUBLE + "x"})) is None


def test_encode_rows_declines_what_it_does_not_write():
    points = [udf_pb2.Point(time=1, name="m"), udf_pb2.Point(time=2)]  # the second has no name
    _, headers = pointcodec.decode_with_headers(encoded(points))
    assert pointcodec.encode_rows(headers, np.array([0]), [("s", np.array(["text"], dtype=object))]) is None
    assert pointcodec.encode_rows(headers, np.array([1]), [("x", np.array([1.0]))]) is None
    # A point whose tags come after a field map (not as Kapacitor writes it) keeps the reference path.
    out_of_order = udf_pb2.Point(time=3, name="m", fieldsDouble={"x": 1.0}).SerializeToString() + udf_pb2.Point(tags={"k": "v"}).SerializeToString()
    _, headers = pointcodec.decode_with_headers(encode_varint(len(out_of_order)) + out_of_order)
    assert pointcodec.encode_rows(headers, np.array([0]), [("y", np.array([2.0]))]) is None
