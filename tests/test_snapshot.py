"""Snapshots: the format itself, and snapshot -> restore through real agents.

The agents run in this process on one end of a socketpair and compute
moving_avg on the shared real SparkSession (the ``engines`` fixture).
Reference: Kapacitor's own end-to-end moving average test, groups a and b
with values 1 and 2 at t=0..9 s, then a=0, b=1 at 10 s and 0, 0 at 11 s;
with .size(10) the means at 10 s are a 0.9, b 1.9 and at 11 s a 0.8, b 1.7.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import time

import pytest

from udf_agent import udf_pb2
from udf_agent.library.builtins import mirror, moving_avg
from udf_agent.runtime import snapshot as snap
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.snapshot import SnapshotError, dump_snapshot, load_snapshot
from udf_agent.testing import InProcessAgent, grouped_point, option
from udf_agent.wire.frames import encode_varint

pytestmark = pytest.mark.spark

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEC = 1_000_000_000
OPTIONS = (option("field", "value"), option("size", 10), option("as", "mean"))
HISTORY = [(t, 1.0, 2.0) for t in range(10)]  # (seconds, a, b)
TAIL = [(10, 0.0, 1.0), (11, 0.0, 0.0)]
EXPECTED_TAIL = {("a", 10): 0.9, ("b", 10): 1.9, ("a", 11): 0.8, ("b", 11): 1.7}
QUICK = AgentConfig(flush_interval=0.05)
SLOW = AgentConfig(flush_interval=60.0, adaptive_flush=False)  # nothing is flushed before a snapshot or EOF


# ---- helpers ----


def start(engines, spec=moving_avg, options=OPTIONS, config=QUICK) -> InProcessAgent:
    agent = InProcessAgent(spec, engines, config)
    answer = agent.driver.init(*options)
    assert answer.success, answer.error
    return agent


def feed(agent: InProcessAgent, rows) -> None:
    for t, a, b in rows:
        for group, value in (("a", a), ("b", b)):
            agent.driver.send(udf_pb2.Request(point=grouped_point(t * SEC, group, value, database="db", retentionPolicy="autogen")))


def means(agent: InProcessAgent, count: int) -> dict[tuple[str, int], float]:
    """Waits for ``count`` output points; returns {(group tag, second): mean}."""
    points = agent.driver.responses.wait_for("point", count, timeout=120)
    out = {}
    for p in points:
        key = (p.tags["group"], p.time // SEC)
        assert key not in out, f"two outputs for {key}"
        assert p.time % SEC == 0
        assert list(p.dimensions) == ["group"] and p.name == "cpu"
        assert set(p.fieldsDouble) == {"mean"}, p
        out[key] = p.fieldsDouble["mean"]
    assert len(out) == count
    return out


def tail_of(result: dict) -> dict:
    return {k: v for k, v in result.items() if k[1] >= 10}


def assert_reference_tail(result: dict) -> None:
    tail = tail_of(result)
    assert set(tail) == set(EXPECTED_TAIL)
    for key, expected in EXPECTED_TAIL.items():
        assert tail[key] == pytest.approx(expected, rel=1e-9), key


def finish_cleanly(agent: InProcessAgent) -> None:
    assert agent.finish(timeout=60) == 0
    assert "error" not in agent.driver.responses.kinds(), agent.driver.responses.of("error")


def snapshot_after_history(engines, config=QUICK) -> tuple[bytes, dict, list[str]]:
    """Agent 1: t=0..9 in, a snapshot out; returns (snapshot, outputs, response kinds)."""
    agent = start(engines, config=config)
    feed(agent, HISTORY)
    if config.flush_interval < 1:
        means(agent, 20)  # everything computed before the snapshot is asked for
    data = agent.driver.snapshot(timeout=120)
    outputs = means(agent, 20)
    kinds = agent.driver.responses.kinds()
    finish_cleanly(agent)
    return data, outputs, kinds


def expected_history_means() -> dict:
    return {("a", t): 1.0 for t in range(10)} | {("b", t): 2.0 for t in range(10)}


# ---- shared results ----


@pytest.fixture(scope="module")
def uninterrupted(engines) -> dict:
    """One agent that sees all 24 points."""
    agent = start(engines)
    feed(agent, HISTORY + TAIL)
    result = means(agent, 24)
    finish_cleanly(agent)
    return result


@pytest.fixture(scope="module")
def good_snapshot(engines) -> tuple[bytes, dict]:
    data, outputs, _ = snapshot_after_history(engines)
    return data, outputs


@pytest.fixture(scope="module")
def mirror_snapshot(engines) -> bytes:
    agent = start(engines, spec=mirror, options=())
    feed(agent, HISTORY[:1])
    agent.driver.responses.wait_for("point", 2)
    data = agent.driver.snapshot(timeout=60)
    finish_cleanly(agent)
    return data


# ---- snapshot -> restore through real agents ----


def test_uninterrupted_agent_gives_kapacitors_reference(uninterrupted):
    for key, value in expected_history_means().items():
        assert uninterrupted[key] == pytest.approx(value, rel=1e-12), key
    assert_reference_tail(uninterrupted)


def test_restore_in_a_fresh_agent_continues_the_moving_average_exactly(engines, good_snapshot, uninterrupted):
    data, first_outputs = good_snapshot
    assert data.startswith(snap.MAGIC)
    for key, value in expected_history_means().items():
        assert first_outputs[key] == pytest.approx(value, rel=1e-12)

    agent = start(engines)
    answer = agent.driver.restore(data)
    assert answer.success is True and answer.error == ""
    feed(agent, TAIL)
    result = means(agent, 4)
    finish_cleanly(agent)

    assert_reference_tail(result)
    assert set(result) == set(tail_of(uninterrupted))
    for key, value in result.items():
        assert value == pytest.approx(uninterrupted[key], rel=1e-12, abs=0), key


def test_a_fresh_agent_without_restore_does_not_know_the_history(engines):
    # The control for the test above: without the snapshot the window is empty.
    agent = start(engines)
    feed(agent, TAIL)
    result = means(agent, 4)
    finish_cleanly(agent)
    assert result[("a", 10)] == pytest.approx(0.0) and result[("b", 10)] == pytest.approx(1.0)
    assert result[("b", 11)] == pytest.approx(0.5)


def test_snapshot_requested_while_points_are_pending_includes_them(engines, uninterrupted):
    data, outputs, kinds = snapshot_after_history(engines, config=SLOW)
    # The pending points were computed (and sent) before the SnapshotResponse.
    assert kinds.index("snapshot") == 21, kinds  # init, 20 points, snapshot
    assert kinds[1:21] == ["point"] * 20
    assert outputs == pytest.approx(expected_history_means(), rel=1e-12)

    agent = start(engines, config=SLOW)
    assert agent.driver.restore(data).success
    feed(agent, TAIL)
    finish_cleanly(agent)  # end of input computes what is pending
    result = means(agent, 4)
    assert_reference_tail(result)
    for key, value in result.items():
        assert value == pytest.approx(uninterrupted[key], rel=1e-12, abs=0), key


def test_restore_replaces_the_state_an_agent_already_had(engines, good_snapshot):
    data, _ = good_snapshot
    agent = start(engines)
    feed(agent, [(t, 5.0, 5.0) for t in range(3)])
    means(agent, 6)
    assert agent.driver.restore(data).success
    feed(agent, TAIL)
    result = means(agent, 10)
    finish_cleanly(agent)
    assert_reference_tail(result)


def test_snapshot_of_a_fresh_agent_restores_to_nothing(engines):
    agent = start(engines)
    data = agent.driver.snapshot(timeout=60)
    finish_cleanly(agent)
    assert load_snapshot("moving_avg", data) == {}


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _header_only(data: bytes) -> bytes:
    return data[: snap._HEADER.size - 1]


def _body_byte_flipped(data: bytes) -> bytes:
    position = snap._HEADER.size + (len(data) - snap._HEADER.size) // 2
    return data[:position] + bytes([data[position] ^ 0x01]) + data[position + 1 :]


def _version_changed(data: bytes) -> bytes:
    return data[:8] + struct.pack(">H", snap.VERSION + 1) + data[10:]


BAD_RESTORES = [
    ("random-bytes", lambda data, other: os.urandom(len(data)), "not a udf-agent snapshot"),
    ("empty", lambda data, other: b"", "not a udf-agent snapshot"),
    ("truncated", lambda data, other: _truncated(data), "checksum mismatch"),
    ("truncated-header", lambda data, other: _header_only(data), "not a udf-agent snapshot"),
    ("body-byte-flipped", lambda data, other: _body_byte_flipped(data), "checksum mismatch"),
    ("version-changed", lambda data, other: _version_changed(data), f"version {snap.VERSION + 1} is not supported"),
    ("other-udf", lambda data, other: other, "belongs to UDF 'mirror', not 'moving_avg'"),
]


@pytest.mark.parametrize("make, reason", [case[1:] for case in BAD_RESTORES], ids=[case[0] for case in BAD_RESTORES])
def test_bad_restore_is_refused_and_leaves_the_state_unchanged(engines, good_snapshot, mirror_snapshot, make, reason):
    data, _ = good_snapshot
    bad = make(data, mirror_snapshot)
    assert bad != data

    agent = start(engines)
    feed(agent, HISTORY)
    means(agent, 20)
    answer = agent.driver.restore(bad)
    assert answer.success is False
    assert answer.error.startswith("restore refused: ")
    assert reason in answer.error

    # The task goes on with the history it had before the refused restore.
    feed(agent, TAIL)
    result = means(agent, 24)
    finish_cleanly(agent)
    assert_reference_tail(result)


def test_refused_restore_does_not_wipe_state_restored_earlier(engines, good_snapshot):
    data, _ = good_snapshot
    agent = start(engines)
    assert agent.driver.restore(data).success
    assert not agent.driver.restore(_body_byte_flipped(data)).success
    feed(agent, TAIL)
    result = means(agent, 4)
    finish_cleanly(agent)
    assert_reference_tail(result)


# ---- the format, unit level ----

def _history(*points: udf_pb2.Point) -> bytes:
    """Kept history as the runtime keeps it: length-prefixed point bytes."""
    return b"".join(encode_varint(len(b)) + b for b in (p.SerializeToString() for p in points))


GROUPS = {
    "group=a": (_history(grouped_point(1, "a", 1.0), grouped_point(2, "a", 2.5)), None),
    "group=b": (None, '{"count":3}'),
    "": (_history(udf_pb2.Point(time=3, fieldsInt={"n": 1})), '{"x":[1,2.5,null]}'),
}


def test_a_checksummed_snapshot_whose_history_holds_no_points_is_refused():
    data = dump_snapshot("moving_avg", {"group=a": (b"\x05junk", None)})
    with pytest.raises(SnapshotError, match="history of group 'group=a' holds no valid points"):
        load_snapshot("moving_avg", data)


def test_dump_load_round_trip():
    data = dump_snapshot("moving_avg", GROUPS)
    assert load_snapshot("moving_avg", data) == GROUPS


def test_a_snapshot_of_many_groups_is_never_held_whole_uncompressed():
    # A relayed task is checkpointed every few seconds; 500 k churned groups are ~120 MB of
    # records, which joined whole (and first as three objects a group) were the shared server's
    # peak. Compressed as they are written, the peak is a few thousand groups' records.
    import tracemalloc

    point = grouped_point(1, "x", 1.0).SerializeToString()
    history = encode_varint(len(point)) + point
    groups = {f"group=g{i:06d}": (history + history, None) for i in range(120_000)}
    records = sum(len(key) + 2 * len(history) + 6 for key in groups)
    dump_snapshot("moving_avg", {})  # its imports, before the count
    tracemalloc.start()
    try:
        data = dump_snapshot("moving_avg", groups)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < records / 4, (peak, records)
    assert load_snapshot("moving_avg", data) == groups


def test_dump_load_round_trip_of_no_groups():
    assert load_snapshot("mirror", dump_snapshot("mirror", {})) == {}


def test_snapshot_layout_is_magic_version_digest_body():
    data = dump_snapshot("moving_avg", GROUPS)
    magic, version, digest = struct.unpack_from(">8sH32s", data)
    assert magic == b"KUDFSNAP" and version == snap.VERSION == 3
    assert digest == hashlib.sha256(data[42:]).digest()


def _with_valid_digest(body: bytes, version: int = snap.VERSION) -> bytes:
    return snap._HEADER.pack(snap.MAGIC, version, hashlib.sha256(body).digest()) + body


def _arrow_body(table) -> bytes:
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _body_without_group_column() -> bytes:
    import pyarrow as pa

    table = pa.table({"history": pa.array([b"x"], pa.binary())}).replace_schema_metadata({"udf": "moving_avg"})
    return _with_valid_digest(_arrow_body(table), version=2)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda data: b"", "unknown header"),
        (lambda data: b"KUDFSNAP", "unknown header"),
        (lambda data: data[:41], "unknown header"),
        (lambda data: b"X" + data[1:], "unknown header"),
        (lambda data: os.urandom(len(data)), "unknown header"),
        (lambda data: _version_changed(data), "version 4 is not supported (this agent reads versions 2 and 3)"),
        (lambda data: data[:8] + struct.pack(">H", 0) + data[10:], "version 0 is not supported"),
        (lambda data: _body_byte_flipped(data), "checksum mismatch"),
        (lambda data: data[:12] + bytes([data[12] ^ 0x80]) + data[13:], "checksum mismatch"),
        (lambda data: data[:-1], "checksum mismatch"),
        (lambda data: data + b"\x00", "checksum mismatch"),
        (lambda data: _with_valid_digest(b"not arrow at all"), "body is unreadable"),
        (lambda data: _body_without_group_column(), "body is unreadable"),
        (lambda data: dump_snapshot("mirror", GROUPS), "belongs to UDF 'mirror', not 'moving_avg'"),
    ],
    ids=[
        "empty",
        "magic-only",
        "short-header",
        "wrong-magic",
        "random",
        "newer-version",
        "older-version",
        "body-flipped",
        "digest-flipped",
        "truncated",
        "extended",
        "body-not-arrow",
        "body-missing-column",
        "other-udf",
    ],
)
def test_load_snapshot_errors(make, reason):
    data = dump_snapshot("moving_avg", GROUPS)
    with pytest.raises(SnapshotError) as caught:
        load_snapshot("moving_avg", make(data))
    assert reason in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_snapshot_without_owner_metadata_is_refused():
    import pyarrow as pa

    table = pa.table(
        {"group": pa.array(["a"], pa.string()), "history": pa.array([None], pa.binary()), "state": pa.array([None], pa.string())}
    )
    with pytest.raises(SnapshotError, match="belongs to UDF '', not 'moving_avg'"):
        load_snapshot("moving_avg", _with_valid_digest(_arrow_body(table), version=2))


# ---- damaged snapshots, ordering under preemption ----



def test_body_cut_inside_a_record_batch_with_a_valid_digest_is_a_snapshot_error():
    data = dump_snapshot("moving_avg", GROUPS)
    with pytest.raises(SnapshotError, match="body is unreadable"):
        load_snapshot("moving_avg", _with_valid_digest(data[42:-20]))


def test_agent_refuses_a_body_cut_inside_a_record_batch_without_failing_the_task(engines, good_snapshot):
    data, _ = good_snapshot
    agent = start(engines)
    try:
        feed(agent, HISTORY)
        means(agent, 20)
        answer = agent.driver.restore(_with_valid_digest(data[42:-20]), timeout=60)
        assert answer.success is False and "restore refused" in answer.error
        feed(agent, TAIL)
        assert_reference_tail(means(agent, 24))
    finally:
        agent.finish(timeout=60)
    assert agent.exit_code == 0 and "error" not in agent.driver.responses.kinds()


def test_load_snapshot_refuses_columns_of_the_wrong_type():
    import pyarrow as pa

    table = pa.table(
        {"group": pa.array(["a", None]), "history": pa.array([1, 2]), "state": pa.array([3, 4])}
    ).replace_schema_metadata({"udf": "moving_avg"})
    with pytest.raises(SnapshotError):
        load_snapshot("moving_avg", _with_valid_digest(_arrow_body(table)))


def _slow_flush(session, delay=0.3):
    """Makes the compute thread lose the CPU at the worst moment: just before it closes a
    micro-batch, whether the flush timer or an idle compute thread (adaptive flush) closes it."""
    calls = []

    def slowed(original):
        def flush(*args):
            calls.append(time.monotonic())
            time.sleep(delay)
            return original(*args)

        return flush

    session.flush = slowed(session.flush)
    return calls


def rolling_means(rows, size=10) -> dict[tuple[str, int], float]:
    """Kapacitor's moving average over (seconds, a, b) rows, in plain Python."""
    out, seen = {}, {"a": [], "b": []}
    for t, a, b in rows:
        for group, value in (("a", a), ("b", b)):
            seen[group].append(value)
            window = seen[group][-size:]
            out[(group, t)] = sum(window) / len(window)
    return out


def test_rolling_means_helper_matches_kapacitors_reference(uninterrupted):
    reference = rolling_means(HISTORY + TAIL)
    assert_reference_tail(reference)
    assert uninterrupted == pytest.approx(reference, rel=1e-12)


def test_micro_batches_are_computed_in_order_even_if_the_compute_thread_is_preempted(engines):
    first_half = [(t, 1.0, 2.0) for t in range(5)]
    second_half = [(t, 3.0, 5.0) for t in range(5, 10)]
    expected = rolling_means(first_half + second_half + TAIL)
    config = AgentConfig(flush_interval=0.05)
    agent = InProcessAgent(moving_avg, engines, config)
    flushes = _slow_flush(agent.agent.session)
    try:
        assert agent.driver.init(*OPTIONS).success
        feed(agent, first_half)
        agent.driver.send(udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()))
        feed(agent, second_half)
        data = agent.driver.responses.wait_for("snapshot", 1, timeout=60)[0].snapshot
        outputs = means(agent, 20)
        kinds = agent.driver.responses.kinds()
    finally:
        agent.finish(timeout=60)
    assert flushes, "the flush timer never ran"
    assert outputs == pytest.approx({k: v for k, v in expected.items() if k[1] < 10}, rel=1e-12)
    # The snapshot holds what came before its request: t=0..4, not t=5..9.
    assert kinds.index("snapshot") == 11, kinds

    second = start(engines)
    assert second.driver.restore(data).success
    feed(second, second_half + TAIL)
    result = means(second, 14)
    finish_cleanly(second)
    assert result == pytest.approx({k: v for k, v in expected.items() if k[1] >= 5}, rel=1e-12)


def test_a_snapshot_taken_with_other_options_is_refused_at_restore(engines, good_snapshot):
    data, _ = good_snapshot
    other = [o for o in OPTIONS if o.name != "size"] + [option("size", 3)]
    agent = start(engines, options=other)
    answer = agent.driver.restore(data)
    assert answer.success is False
    assert "snapshot was taken with options" in answer.error and '"size":3' in answer.error
    finish_cleanly(agent)


def test_the_options_fingerprint_ignores_order_and_snapshots_without_one_still_restore():
    taken = dump_snapshot("moving_avg", GROUPS, {"size": 4, "field": "value", "as": "avg"})
    assert load_snapshot("moving_avg", taken, {"as": "avg", "field": "value", "size": 4}) == GROUPS
    with pytest.raises(SnapshotError, match='"field":"other"'):
        load_snapshot("moving_avg", taken, {"as": "avg", "field": "other", "size": 4})
    # An earlier agent's snapshot has no fingerprint: restored as before.
    assert load_snapshot("moving_avg", dump_snapshot("moving_avg", GROUPS), {"size": 4}) == GROUPS


def _version_2(groups, udf="moving_avg", compression=None) -> bytes:
    """A snapshot as earlier agents wrote it: the body an Arrow IPC stream."""
    import pyarrow as pa

    table = pa.table(
        {
            "group": pa.array(list(groups), pa.string()),
            "history": pa.array([h for h, _ in groups.values()], pa.binary()),
            "state": pa.array([s for _, s in groups.values()], pa.string()),
        }
    ).replace_schema_metadata({"udf": udf})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as writer:
        writer.write_table(table)
    return _with_valid_digest(sink.getvalue().to_pybytes(), version=2)


def test_a_snapshot_of_an_earlier_agent_still_restores():
    assert load_snapshot("moving_avg", _version_2(GROUPS)) == GROUPS


def test_a_compressed_arrow_snapshot_is_refused_before_it_is_decompressed():
    # A few KB that would expand to 1 GB: refused from the stream's metadata alone.
    bomb = {"group=a": (b"\x00" * 2**30, None)}
    import pyarrow as pa

    before = pa.total_allocated_bytes()
    data = _version_2(bomb, compression="zstd")
    del bomb
    assert len(data) < 2**20
    with pytest.raises(SnapshotError, match="record batches are compressed"):
        load_snapshot("moving_avg", data)
    assert pa.total_allocated_bytes() - before < 2**26


def test_a_snapshot_claiming_more_than_the_limit_is_refused_before_decompressing():
    body = struct.pack(">Q", snap.MAX_RECORDS_BYTES + 1) + b"\x28\xb5\x2f\xfd" + b"\x00" * 16
    with pytest.raises(SnapshotError, match="above the .*-byte limit"):
        load_snapshot("moving_avg", _with_valid_digest(body))


def test_a_hundred_thousand_groups_of_moving_avg_size_10_snapshot_fast_and_small(report):
    # Each group keeps its last 9 points, as a running moving_avg size 10 does.
    from udf_agent.wire.frames import encode_varint

    groups = {}
    for g in range(100_000):
        points = b"".join(
            encode_varint(len(p)) + p
            for p in (grouped_point(1_700_000_000 * SEC + t * SEC, f"host{g:06d}", float(g * 10 + t)).SerializeToString() for t in range(9))
        )
        groups[f"host=host{g:06d}"] = (points, None)
    started = time.monotonic()
    data = dump_snapshot("moving_avg", groups, {"field": "value", "size": 10, "as": "avg"})
    dumped = time.monotonic() - started
    started = time.monotonic()
    assert load_snapshot("moving_avg", data, {"field": "value", "size": 10, "as": "avg"}) == groups
    loaded = time.monotonic() - started
    report(f"snapshot of 100 k groups x 9 points: {len(data) / 2**20:.1f} MiB, dump {dumped:.2f} s, restore {loaded:.2f} s")
    assert len(data) < 64 * 2**20  # fits Kapacitor's frame and our --max-frame-size default
    assert dumped + loaded < 10


def test_a_restore_after_a_refused_init_is_answered(engines, good_snapshot):
    # Kapacitor sends Restore even when Init failed: it must get a RestoreResponse.
    agent = InProcessAgent(moving_avg, engines, QUICK)
    assert not agent.driver.init(option("size", 0)).success
    answer = agent.driver.restore(b"junk")
    assert answer.success is False and "not a udf-agent snapshot" in answer.error
    assert agent.driver.restore(good_snapshot[0]).success
    finish_cleanly(agent)


@pytest.mark.integration
def test_a_hundred_thousand_groups_snapshot_in_one_agent_process_and_restore_exactly_in_another(engines, report):
    """An agent process computes moving_avg size 10 over 100 k groups x 10 points and is asked
    for a snapshot; this process (another hash seed, nothing shared) restores it and computes
    each group's 11th point: every mean is that of the group's last 10 values, oldest first."""
    import numpy as np

    from benchmarks.driver import AgentCommand, AgentProcess
    from benchmarks.workload import FIELDS, Workload, init_frame

    groups, per_group = 100_000, 10
    workload = Workload(groups * (per_group + 1), groups)
    frames = workload.frames(0, workload.points)
    frame_length = workload.frame_length
    options = [("field", "usage_user"), ("size", 10), ("as", "avg")]
    command = AgentCommand("udf-agent", [sys.executable, "-m", "udf_agent", "run", "moving_avg"], cwd=ROOT)
    deadline = time.monotonic() + 240
    taker = AgentProcess(command, deadline)
    try:
        taker.init(init_frame(options), deadline)
        taker.write(memoryview(frames)[: groups * per_group * frame_length])
        assert taker.wait_for(lambda: taker.tally.points >= groups * per_group, deadline), taker.failure("outputs")
        asked = time.monotonic()
        request = udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest()).SerializeToString()
        taker.write(encode_varint(len(request)) + request)
        assert taker.wait_for(lambda: bool(taker.tally.snapshots), deadline), taker.failure("SnapshotResponse")
        answered, data = taker.tally.snapshots[0]
        assert not taker.tally.errors
    finally:
        taker.kill()
    report(f"snapshot of 100 k groups x 9 kept points by an agent process: {len(data) / 2**20:.1f} MiB in {answered - asked:.2f} s")
    assert answered - asked <= 10

    restorer = InProcessAgent(moving_avg, engines, QUICK)
    assert restorer.driver.init(*(option(name, value) for name, value in options)).success
    started = time.monotonic()
    answer = restorer.driver.restore(data)
    assert answer.success, answer.error
    report(f"restored in another process in {time.monotonic() - started:.2f} s")
    restorer.driver.send_raw(frames[groups * per_group * frame_length :])
    outputs = restorer.driver.responses.wait_for("point", groups, timeout=180)
    finish_cleanly(restorer)

    values = workload.values(0, workload.points)[:, FIELDS.index("usage_user")].reshape(per_group + 1, groups)
    expected = np.zeros(groups)
    for row in values[1:]:  # the last 10 values of each group, oldest first, as moving_avg sums them
        expected += row
    expected /= per_group
    got = np.full(groups, np.nan)
    step = workload.time_of(1) - workload.time_of(0)
    for point in outputs:
        index = (point.time - workload.time_of(0)) // step
        assert index >= groups * per_group, "an output for a point of the first agent"
        got[index % groups] = point.fieldsDouble["avg"]
    assert np.array_equal(got, expected)
