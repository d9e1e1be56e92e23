"""The sans-IO protocol state (Session) and the OutputGuard, driven without threads.

Time is passed in explicitly, so micro-batch deadlines are tested exactly.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import pathlib
import sys
from collections.abc import Iterable
from typing import Any

import pytest

from udf_agent import udf_pb2
from udf_agent.library.builtins import mirror, moving_avg, outliers
from udf_agent.runtime.events import Compute, Emit, Fail, Restore, Send, Started, TakeCheckpoint
from udf_agent.runtime.flushing import FlushPolicy
from udf_agent.runtime.session import Session
from udf_agent.targets import FUNCTION_TARGETS
from udf_agent.testing import grouped_point, option
from udf_agent.wire.batches import BatchMicroBatch, StreamMicroBatch
from udf_agent.wire.columns import decode_points
from udf_agent.wire.frames import FrameDecoder, PointRun, encode_frame
from udf_agent.wire.guard import OutputGuard
from udf_agent.wire.scanner import FastFrameSplitter

# ---- a tiny in-memory Kapacitor ----

MOVING_AVG_OPTIONS = (option("field", "value"), option("size", 10), option("as", "mean"))
OUTLIERS_OPTIONS = (option("field", "value"), option("scale", 1.5))


def session(spec: Any = moving_avg, *, max_batch_points: int = 1000, **kwargs: Any) -> Session:
    return Session(spec, max_batch_points=max_batch_points, **kwargs)


def info() -> udf_pb2.Request:
    return udf_pb2.Request(info=udf_pb2.InfoRequest())


def init(*options: udf_pb2.Option) -> udf_pb2.Request:
    return udf_pb2.Request(init=udf_pb2.InitRequest(options=options, taskID="task", nodeID="customFunc4"))


def keepalive(stamp: int) -> udf_pb2.Request:
    return udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=stamp))


def snapshot() -> udf_pb2.Request:
    return udf_pb2.Request(snapshot=udf_pb2.SnapshotRequest())


def restore(data: bytes) -> udf_pb2.Request:
    return udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=data))


def point(t: int, group: str = "a", value: float = 1.0, *, batch: bool = False) -> udf_pb2.Request:
    if batch:  # inside a batch Kapacitor sends only time, group, tags and fields
        p = udf_pb2.Point(time=t, group=group, tags={"group": group}, fieldsDouble={"value": value})
    else:
        p = grouped_point(t, group, value, database="db", retentionPolicy="rp")
    return udf_pb2.Request(point=p)


def begin(group: str = "g", name: str = "cpu", tags: dict | None = None) -> udf_pb2.Request:
    return udf_pb2.Request(begin=udf_pb2.BeginBatch(name=name, group=group, tags=tags or {}, size=3))


def end(group: str = "g", name: str = "cpu", tmax: int = 0, tags: dict | None = None) -> udf_pb2.Request:
    return udf_pb2.Request(end=udf_pb2.EndBatch(name=name, group=group, tags=tags or {}, tmax=tmax))


def drive(s: Session, requests: Iterable[udf_pb2.Request], now: float = 0.0) -> list[Any]:
    """Feeds requests in order at one instant; returns the flattened events."""
    events: list[Any] = []
    for request in requests:
        events.extend(s.receive(request, now))
    return events


def started(spec: Any = moving_avg, options: tuple = MOVING_AVG_OPTIONS, **kwargs: Any) -> Session:
    s = session(spec, **kwargs)
    events = drive(s, [init(*options)])
    assert [type(e) for e in events] == [Started], events
    return s


def decode(frame: bytes) -> udf_pb2.Response:
    messages = FrameDecoder(udf_pb2.Response).feed(frame)
    assert len(messages) == 1, messages
    return messages[0]


def reply_of(event: Any, kind: str) -> Any:
    assert isinstance(event, (Send, Started)), event
    response = decode(event.frame if isinstance(event, Send) else event.reply)
    assert response.WhichOneof("message") == kind, response
    return getattr(response, kind)


def kinds(events: list[Any]) -> list[str]:
    return [type(e).__name__ for e in events]


def only_fail(events: list[Any]) -> Fail:
    assert kinds(events) == ["Fail"], events
    return events[0]


# ---- Info ----


def test_info_before_init_describes_the_udf():
    s = session(moving_avg)
    events = drive(s, [info()])
    assert len(events) == 1 and not events[0].urgent
    answer = reply_of(events[0], "info")
    assert answer.wants == udf_pb2.STREAM and answer.provides == udf_pb2.STREAM
    assert set(answer.options) == {"field", "size", "as"}
    assert list(answer.options["size"].valueTypes) == [udf_pb2.INT]
    assert list(answer.options["field"].valueTypes) == [udf_pb2.STRING]
    assert s.options is None and not s.failed


def test_info_of_a_batch_udf_says_batch():
    answer = reply_of(drive(session(outliers), [info()])[0], "info")
    assert answer.wants == udf_pb2.BATCH and answer.provides == udf_pb2.BATCH
    assert list(answer.options["scale"].valueTypes) == [udf_pb2.DOUBLE]


def test_info_after_init_is_answered():
    s = started()
    events = drive(s, [info()])
    assert reply_of(events[0], "info").wants == udf_pb2.STREAM
    assert len(events) == 1


def test_info_between_data_does_not_close_the_micro_batch():
    s = started()
    events = drive(s, [point(1), point(2), info(), point(3)], now=1.0)
    assert len(events) == 1
    reply_of(events[0], "info")
    assert s.open_micro_batch() == (1.0, 3)
    (computed,) = s.finish()
    assert computed.batch.count == 3


# ---- Init ----


def test_init_success_reply_and_started_event():
    s = session()
    (start,) = drive(s, [init(*MOVING_AVG_OPTIONS)])
    answer = reply_of(start, "init")
    assert answer.success is True and answer.error == ""
    assert isinstance(start, Started)
    assert dict(start.options.raw()) == {"field": "value", "size": 10, "as": "mean"}
    assert s.options is not None


def test_init_default_option_is_filled_in():
    s = session()
    (start,) = drive(s, [init(option("field", "value"), option("size", 3))])
    assert start.options["as"] == "avg"


@pytest.mark.parametrize(
    ("spec", "options", "named"),
    [
        (moving_avg, (option("field", ""), option("size", 3)), "'field'"),
        (moving_avg, (option("field", "v"), option("size", 3), option("as", "")), "'as'"),
        (moving_avg, (option("field", "v"), option("size", 3), option("as", "  ")), "'as'"),
        (outliers, (option("field", ""),), "'field'"),
    ],
)
def test_an_empty_name_is_refused_in_the_init_response(spec, options, named):
    answer = reply_of(drive(session(spec), [init(*options)])[0], "init")
    assert answer.success is False
    assert named in answer.error and "must be a field name, got an empty string" in answer.error


def test_init_failure_lists_every_problem_and_the_session_stays_usable():
    s = session()
    bad = init(option("size", 0), option("as", 5), option("bogus", "x"))  # 'field' is missing too
    events = drive(s, [bad])
    assert len(events) == 1, events  # no Started, no Fail
    answer = reply_of(events[0], "init")
    assert answer.success is False
    error = answer.error
    assert "moving_avg" in error
    assert "'size'" in error and "must be > 0" in error
    assert "'as'" in error and "STRING" in error and "INT" in error
    assert "'bogus'" in error and "unknown option" in error
    assert "'field'" in error and "missing required option" in error
    assert not s.failed and s.options is None

    # A second, correct Init is accepted.
    events = drive(s, [init(*MOVING_AVG_OPTIONS)])
    assert kinds(events) == ["Started"]
    assert reply_of(events[0], "init").success is True


def test_init_with_wrong_type_for_a_double_option_is_refused():
    # Kapacitor never coerces: .scale(2) arrives as INT and must be rejected.
    s = session(outliers)
    answer = reply_of(drive(s, [init(option("field", "value"), option("scale", 2))])[0], "init")
    assert answer.success is False and "'scale'" in answer.error and "DOUBLE" in answer.error


def test_second_init_after_success_is_a_fail():
    s = started()
    fail = only_fail(drive(s, [init(*MOVING_AVG_OPTIONS)]))
    assert "second InitRequest" in fail.message
    assert s.failed


def test_second_init_after_success_still_computes_pending_points_first():
    s = started()
    events = drive(s, [point(1), init(*MOVING_AVG_OPTIONS)])
    assert kinds(events) == ["Compute", "Fail"]


# ---- Keepalive ----


@pytest.mark.parametrize("initialised", [False, True])
def test_keepalive_is_an_urgent_reply_with_the_same_time(initialised):
    s = started() if initialised else session()
    events = drive(s, [keepalive(1_700_000_000_123_456_789)])
    assert len(events) == 1
    (send,) = events
    assert isinstance(send, Send) and send.urgent is True
    assert reply_of(send, "keepalive").time == 1_700_000_000_123_456_789


def test_keepalive_matches_the_golden_frame():
    (send,) = drive(session(), [keepalive(42)])
    assert send.frame == bytes.fromhex("04 1a 02 08 2a")


def test_keepalive_does_not_close_the_micro_batch():
    s = started()
    events = drive(s, [point(1), keepalive(7), point(2)])
    assert kinds(events) == ["Send"]
    assert s.finish()[0].batch.count == 2


# ---- data before Init and protocol violations ----


@pytest.mark.parametrize(
    "spec, request_, what",
    [
        (moving_avg, point(1), "a Point"),
        (outliers, begin(), "a BeginBatch"),
        (outliers, end(), "an EndBatch"),
    ],
    ids=["point", "begin", "end"],
)
def test_data_before_init_is_a_fail(spec, request_, what):
    s = session(spec)
    fail = only_fail(drive(s, [request_]))
    assert what in fail.message and "before a successful Init" in fail.message
    assert s.failed


def test_data_after_a_failed_init_is_a_fail():
    s = session()
    drive(s, [init(option("size", 0))])
    fail = only_fail(drive(s, [point(1)]))
    assert "before a successful Init" in fail.message


def test_begin_batch_to_a_stream_udf_is_a_fail():
    s = started()
    fail = only_fail(drive(s, [begin()]))
    assert "wants a stream" in fail.message


def test_point_outside_a_batch_to_a_batch_udf_is_a_fail():
    s = started(outliers, OUTLIERS_OPTIONS)
    fail = only_fail(drive(s, [point(1, batch=True)]))
    assert "outside BeginBatch/EndBatch" in fail.message


def test_end_batch_with_no_open_begin_is_a_fail():
    s = started(outliers, OUTLIERS_OPTIONS)
    fail = only_fail(drive(s, [end()]))
    assert "no open BeginBatch" in fail.message


def test_end_batch_after_a_closed_batch_is_a_fail():
    s = started(outliers, OUTLIERS_OPTIONS)
    events = drive(s, [begin(), point(1, batch=True), end(tmax=1), end(tmax=1)])
    assert kinds(events) == ["Compute", "Fail"]
    assert "no open BeginBatch" in events[1].message


def test_end_batch_to_a_stream_udf_is_a_fail():
    s = started()
    assert "no open BeginBatch" in only_fail(drive(s, [end()])).message


def test_begin_batch_while_a_batch_is_open_is_a_fail():
    s = started(outliers, OUTLIERS_OPTIONS)
    events = drive(s, [begin(group="g1"), point(1, batch=True), begin(group="g2")])
    fail = only_fail(events)
    assert "'g2'" in fail.message and "'g1'" in fail.message and "still open" in fail.message


def test_empty_request_is_a_fail():
    s = started()
    fail = only_fail(drive(s, [udf_pb2.Request()]))
    assert "empty Request" in fail.message
    assert s.failed


def test_empty_request_before_init_is_a_fail():
    assert "empty Request" in only_fail(drive(session(), [udf_pb2.Request()])).message


def test_points_accepted_before_a_fail_are_computed_before_it():
    s = started()
    events = drive(s, [point(1, "a"), point(2, "b"), point(3, "a"), udf_pb2.Request()])
    assert kinds(events) == ["Compute", "Fail"]
    batch = events[0].batch
    assert isinstance(batch, StreamMicroBatch)
    assert batch.count == 3
    grouped = batch.grouped()
    assert {g: column(grouped.points(i), "__time") for i, g in enumerate(grouped.keys)} == {"group=a": [1, 3], "group=b": [2]}


def test_complete_batches_before_a_fail_are_computed_and_the_open_one_is_not():
    s = started(outliers, OUTLIERS_OPTIONS)
    events = drive(
        s,
        [begin("g1"), point(1, batch=True), end("g1", tmax=1), begin("g2"), point(2, batch=True), begin("g3")],
    )
    assert kinds(events) == ["Compute", "Fail"]
    assert [b.group for b in events[0].batch.batches] == ["g1"]


def test_after_a_fail_the_session_ignores_further_input():
    s = started()
    only_fail(drive(s, [udf_pb2.Request()]))
    assert drive(s, [point(1), info(), init(*MOVING_AVG_OPTIONS), udf_pb2.Request()]) == []
    assert s.open_micro_batch() is None and s.finish() == []


# ---- micro-batches ----


def test_nothing_is_open_before_a_point():
    s = started()
    assert s.open_micro_batch() is None
    assert s.flush() == []
    assert s.finish() == []


def test_micro_batch_closes_at_max_batch_points():
    s = started(max_batch_points=3)
    assert drive(s, [point(1), point(2)]) == []
    events = drive(s, [point(3)])
    assert kinds(events) == ["Compute"]
    assert events[0].batch.count == 3
    assert s.open_micro_batch() is None
    # The next point opens a new micro-batch.
    assert drive(s, [point(4), point(5)], now=7.0) == []
    assert s.open_micro_batch() == (7.0, 2)
    assert kinds(drive(s, [point(6)])) == ["Compute"]


def test_a_micro_batch_is_as_old_as_its_first_point_and_closes_when_flushed():
    s = started()
    drive(s, [point(1)], now=10.0)
    drive(s, [point(2)], now=10.3)  # later points do not make it younger
    assert s.open_micro_batch() == (10.0, 2)
    assert FlushPolicy(flush_interval=0.5, adaptive=False).due(s.open_micro_batch()[0], 10.3) == pytest.approx(10.5)
    events = s.flush()
    assert kinds(events) == ["Compute"]
    assert events[0].batch.count == 2
    assert events[0].batch.opened_at == 10.0
    assert s.open_micro_batch() is None
    assert s.flush() == []


def column(points: bytes, name: str) -> list:
    """One column of length-prefixed points, decoded as a worker would."""
    return decode_points(points).column(name).to_pylist()


def test_micro_batch_keeps_groups_apart_in_arrival_order():
    s = started()
    drive(s, [point(1, "a", 1.0), point(2, "b", 2.0), point(3, "a", 3.0)])
    (computed,) = s.finish()
    grouped = computed.batch.grouped()
    assert grouped.keys == ["group=a", "group=b"]
    assert column(grouped.points(0), "__time") == [1, 3]
    assert column(grouped.points(0), "fd:value") == [1.0, 3.0]
    assert grouped.counts[1] == 1


def test_snapshot_request_closes_the_pending_micro_batch_first():
    s = started()
    drive(s, [point(1), point(2)])
    events = drive(s, [snapshot()])
    assert kinds(events) == ["Compute", "TakeSnapshot"]
    assert events[0].batch.count == 2
    assert s.open_micro_batch() is None


def test_snapshot_request_with_nothing_pending_is_only_take_snapshot():
    assert kinds(drive(started(), [snapshot()])) == ["TakeSnapshot"]


def test_the_snapshot_taken_for_a_request_comes_out_as_its_reply_once():
    """The compute side hands the session the state it took; the session says what to send,
    as for every other reply, and never answers a request twice."""
    s = started()
    drive(s, [snapshot()])
    events = s.snapshot_taken(b"state")
    assert kinds(events) == ["Send"]
    assert decode(events[0].frame).snapshot.snapshot == b"state"
    assert s.snapshot_taken(b"again") == []


def test_a_restore_comes_out_as_its_reply_done_or_refused():
    s = started()
    drive(s, [restore(b"one"), restore(b"two")])
    done = decode(s.restored(None)[0].frame).restore
    refused = decode(s.restored("restore refused: not ours")[0].frame).restore
    assert (done.success, done.error) == (True, "")
    assert (refused.success, refused.error) == (False, "restore refused: not ours")
    assert s.restored(None) == []


def test_restore_request_closes_the_pending_micro_batch_first():
    s = started()
    drive(s, [point(1)])
    events = drive(s, [restore(b"opaque")])
    assert kinds(events) == ["Compute", "Restore"]
    assert isinstance(events[1], Restore) and events[1].snapshot == b"opaque"


def test_finish_closes_pending_stream_points():
    s = started()
    drive(s, [point(1), point(2)])
    (computed,) = s.finish()
    assert isinstance(computed, Compute) and computed.batch.count == 2
    assert s.finish() == []


def test_finish_drops_an_unclosed_kapacitor_batch():
    s = started(outliers, OUTLIERS_OPTIONS)
    drive(s, [begin("g1"), point(1, batch=True), end("g1", tmax=1), begin("g2"), point(2, batch=True)])
    (computed,) = s.finish()
    assert [b.group for b in computed.batch.batches] == ["g1"]
    assert computed.batch.count == 1
    assert s.finish() == []


def test_finish_with_only_an_unclosed_batch_computes_nothing():
    s = started(outliers, OUTLIERS_OPTIONS)
    drive(s, [begin("g1"), point(1, batch=True)])
    assert s.finish() == []


# ---- batch UDFs ----


def test_batch_udf_groups_complete_batches_into_one_micro_batch():
    s = started(outliers, OUTLIERS_OPTIONS)
    events = drive(
        s,
        [
            begin("host=x", name="begin-name", tags={"host": "x", "old": "1"}),
            point(1, "x", 5.0, batch=True),
            point(2, "x", 6.0, batch=True),
            end("host=x", name="cpu", tmax=2, tags={"host": "x"}),
            begin("host=y", name="mem", tags={"host": "y"}),
            point(3, "y", 7.0, batch=True),
            end("host=y", name="", tmax=3),  # no name/tags at the end: BeginBatch's stay
        ],
        now=5.0,
    )
    assert events == []
    assert s.open_micro_batch() == (5.0, 3)
    (computed,) = s.flush()
    batch = computed.batch
    assert isinstance(batch, BatchMicroBatch)
    assert batch.count == 3
    first, second = batch.batches
    assert (first.group, first.name, first.tags, first.tmax) == ("host=x", "cpu", {"host": "x"}, 2)
    assert column(first.rows.encoded(), "__time") == [1, 2]
    assert column(first.rows.encoded(), "fd:value") == [5.0, 6.0]
    assert (second.group, second.name, second.tags, second.tmax) == ("host=y", "mem", {"host": "y"}, 3)


def test_batch_micro_batch_closes_at_max_batch_points_counting_rows():
    s = started(outliers, OUTLIERS_OPTIONS, max_batch_points=3)
    events = drive(s, [begin("g1"), point(1, batch=True), point(2, batch=True), end("g1", tmax=2)])
    assert events == []
    events = drive(s, [begin("g2"), point(3, batch=True), end("g2", tmax=3)])
    assert kinds(events) == ["Compute"]
    assert [b.group for b in events[0].batch.batches] == ["g1", "g2"]


def test_a_batch_micro_batch_opens_at_the_first_end_batch():
    s = started(outliers, OUTLIERS_OPTIONS)
    drive(s, [begin("g1"), point(1, batch=True)], now=0.0)
    assert s.open_micro_batch() is None  # an open Kapacitor batch is not pending work yet
    drive(s, [end("g1", tmax=1)], now=4.0)
    assert s.open_micro_batch() == (4.0, 1)


def test_snapshot_inside_an_open_batch_keeps_the_batch_open():
    s = started(outliers, OUTLIERS_OPTIONS)
    events = drive(s, [begin("g1"), point(1, batch=True), snapshot(), point(2, batch=True), end("g1", tmax=2)])
    assert kinds(events) == ["TakeSnapshot"]
    (computed,) = s.finish()
    assert column(computed.batch.batches[0].rows.encoded(), "__time") == [1, 2]


# ---- the guard on the session's replies ----


def test_session_guard_awaits_one_snapshot_reply_per_request():
    s = started()
    drive(s, [snapshot()])
    response = udf_pb2.Response(snapshot=udf_pb2.SnapshotResponse(snapshot=b"x"))
    assert s.guard.reply(response) is not None
    assert s.guard.reply(response) is None


def test_session_guard_awaits_one_restore_reply_per_request():
    s = started()
    drive(s, [restore(b"x")])
    response = udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=True))
    assert s.guard.reply(response) is not None
    assert s.guard.reply(response) is None


def test_session_guard_has_no_init_or_info_reply_outstanding_after_answering():
    s = started()
    drive(s, [info()])
    assert s.guard.reply(udf_pb2.Response(init=udf_pb2.InitResponse(success=True))) is None
    assert s.guard.reply(udf_pb2.Response(info=s.binding.info())) is None


# ---- OutputGuard ----

REPLIES = {
    "info": udf_pb2.Response(info=udf_pb2.InfoResponse(wants=udf_pb2.STREAM)),
    "init": udf_pb2.Response(init=udf_pb2.InitResponse(success=True)),
    "snapshot": udf_pb2.Response(snapshot=udf_pb2.SnapshotResponse(snapshot=b"state")),
    "restore": udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=True)),
}


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_guard_refuses_an_unrequested_reply(kind):
    assert OutputGuard().reply(REPLIES[kind]) is None


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_guard_refuses_a_reply_of_another_type_than_requested(kind):
    guard = OutputGuard()
    for other in REPLIES:
        if other != kind:
            guard.expect(other)
    assert guard.reply(REPLIES[kind]) is None


@pytest.mark.parametrize("kind", sorted(REPLIES))
def test_guard_admits_exactly_one_reply_per_request(kind):
    guard = OutputGuard()
    guard.expect(kind)
    guard.expect(kind)
    first = guard.reply(REPLIES[kind])
    assert first is not None and decode(first) == REPLIES[kind]
    assert guard.reply(REPLIES[kind]) is not None
    assert guard.reply(REPLIES[kind]) is None
    guard.expect(kind)
    assert guard.reply(REPLIES[kind]) is not None


def test_guard_refuses_an_empty_response():
    guard = OutputGuard()
    for kind in REPLIES:
        guard.expect(kind)
    assert guard.reply(udf_pb2.Response()) is None


@pytest.mark.parametrize(
    "response",
    [
        udf_pb2.Response(point=udf_pb2.Point(time=1)),
        udf_pb2.Response(begin=udf_pb2.BeginBatch(name="x")),
        udf_pb2.Response(end=udf_pb2.EndBatch(name="x")),
    ],
    ids=["point", "begin", "end"],
)
def test_guard_raises_for_data_responses(response):
    guard = OutputGuard()
    for kind in ("point", "begin", "end", *REPLIES):
        guard.expect(kind)
    with pytest.raises(ValueError):
        guard.reply(response)


def test_guard_ignores_expect_for_non_management_kinds():
    guard = OutputGuard()
    guard.expect("keepalive")
    guard.expect("point")
    assert guard.reply(REPLIES["info"]) is None


def test_guard_passes_keepalive_and_error_responses_unasked():
    guard = OutputGuard()
    keep = udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=42))
    assert guard.reply(keep) == bytes.fromhex("04 1a 02 08 2a")
    err = udf_pb2.Response(error=udf_pb2.ErrorResponse(error="boom"))
    assert guard.reply(err) == bytes.fromhex("08 32 06 0a 04 62 6f 6f 6d")


def test_init_reply_matches_the_golden_frame():
    (start,) = drive(session(mirror), [init()])
    assert start.reply == bytes.fromhex("04 12 02 08 01")


def test_outliers_refuses_a_scale_below_one():
    s = Session(outliers, max_batch_points=10)
    events = drive(s, [udf_pb2.Request(init=udf_pb2.InitRequest(options=[option("field", "v"), option("scale", 0.5)]))])
    (reply,) = [e for e in events if isinstance(e, Send)]
    init = FrameDecoder(udf_pb2.Response).feed(reply.frame)[0].init
    assert not init.success and "'scale': must be >= 1, got 0.5" in init.error
    assert s.options is None


# ---- passthrough (mirror): point runs go back as they came ----


def _run(*requests: udf_pb2.Request) -> PointRun:
    (run,) = FastFrameSplitter().feed(b"".join(encode_frame(r) for r in requests))
    return run


def test_a_point_run_before_init_is_a_protocol_error():
    s = session(mirror)
    (fail,) = s.receive_point_run(_run(point(1)), 0.0)
    assert isinstance(fail, Fail) and "before a successful Init" in fail.message


def test_a_point_run_is_sent_back_unchanged_after_init():
    s = session(mirror)
    drive(s, [init()])
    run = _run(point(1, "a"), point(2, "b"))
    assert s.receive_point_run(run, 0.0) == [Emit(run.frames, run.count)]
    assert s.pending_points() == 0


def test_mirror_points_one_by_one_are_sent_back_as_the_same_frames():
    s = session(mirror)
    drive(s, [init()])
    request = point(1, "a")
    assert drive(s, [request]) == [Emit(encode_frame(request))]


@pytest.mark.parametrize("points", [10, 60], ids=["a-group-a-point-or-so", "many-points-a-group"])
@pytest.mark.parametrize("max_batch_points", [1, 7, 1000])
def test_a_point_run_is_grouped_as_the_same_points_one_by_one(max_batch_points, points):
    # The compiled grouping (scan.group_points) against the reference path's, point by point.
    requests = [point(t, "abc"[t % 3], float(t)) for t in range(points)]
    one_by_one = session(moving_avg, max_batch_points=max_batch_points)
    drive(one_by_one, [init(*MOVING_AVG_OPTIONS)])
    expected = [e for r in requests for e in one_by_one.receive(r, 0.0)] + one_by_one.finish()
    as_run = session(moving_avg, max_batch_points=max_batch_points)
    drive(as_run, [init(*MOVING_AVG_OPTIONS)])
    got = as_run.receive_point_run(_run(*requests), 0.0) + as_run.finish()

    def groups(events):
        return [(g.keys, [g.points(i) for i in range(len(g))], list(g.counts)) for g in (e.batch.grouped() for e in events)]

    assert groups(got) == groups(expected) and len(got) == len(expected) > 0


def test_a_point_run_inside_a_batch_joins_the_batch():
    s = session(outliers)
    drive(s, [init(*OUTLIERS_OPTIONS), begin("g")])
    run = _run(*(point(t, "g", float(t), batch=True) for t in range(4)))
    assert s.receive_point_run(run, 0.0) == []
    assert s.pending_points() == 4


def test_passthrough_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="passthrough"):
        dataclasses.replace(mirror, name="batchy", wants="batch", provides="batch")


def test_group_points_groups_in_first_arrival_order_as_the_reference_does():
    from udf_agent.wire.grouped import group_points_by_key
    from udf_agent.wire.scanner import group_points

    requests = [point(t, "bca"[t % 3], float(t)) for t in range(60)] + [point(t, f"g{t}", 1.0) for t in range(8)]
    run = _run(*requests)
    grouped = group_points(run.frames, run.points, run.groups)
    assert grouped.keys[:3] == ["group=b", "group=c", "group=a"] and list(grouped.counts[:3]) == [20, 20, 20]
    # Each group's points, in arrival order, with their length varints.
    frames = [encode_frame(r) for r in requests]
    assert grouped.points(0) == b"".join(f[3:] for f in frames[0:60:3])
    reference = group_points_by_key(run.frames, run.points, run.groups)
    assert grouped.keys == reference.keys and list(grouped.counts) == list(reference.counts)
    assert [grouped.points(i) for i in range(len(grouped))] == [reference.points(i) for i in range(len(reference))]
    assert list(grouped.arrival) == list(reference.arrival)  # where output goes back in arrival order


def test_the_compiled_kernels_group_a_few_points_with_their_twin_and_more_themselves():
    from udf_agent.wire import hotpath

    hotpath.load_scanner()
    compiled = hotpath.CompiledWireKernels()
    kernel = compiled._group_points
    by_kernel: list[int] = []
    compiled._group_points = lambda *args: by_kernel.append(len(args[1])) or kernel(*args)
    for count in (1, hotpath.FEW_POINTS, hotpath.FEW_POINTS + 1, 200):
        run = _run(*[point(t, "bca"[t % 3] + str(t % 7), float(t)) for t in range(count)])
        grouped = compiled.group_points(run.frames, run.points, run.groups)
        reference = hotpath.REFERENCE.group_points(run.frames, run.points, run.groups)
        assert grouped.keys == reference.keys and list(grouped.counts) == list(reference.counts), count
        assert list(grouped.arrival) == list(reference.arrival), count
        assert [grouped.points(i) for i in range(len(grouped))] == [reference.points(i) for i in range(len(reference))], count
    assert by_kernel == [hotpath.FEW_POINTS + 1, 200]  # a few points never set up the compiled kernel


def test_a_point_run_is_accepted_up_to_a_group_that_is_not_utf8():
    requests = [point(t, "a", float(t)) for t in range(5)]
    requests[3].point.group = "cafe!"  # made invalid below, at the same length
    raw = b"".join(encode_frame(r) for r in requests).replace(b"cafe!", b"caf\xff!")
    run = FastFrameSplitter(1 << 20).feed(bytearray(raw))[0]
    s = session(moving_avg)
    drive(s, [init(*MOVING_AVG_OPTIONS)])
    events = s.receive_point_run(run, 0.0, frames_before=10)
    assert kinds(events) == ["Compute", "Fail"]
    assert events[0].batch.count == 3
    assert events[1].message == "frame 14: Point.group is not valid UTF-8"


# ---- bytes in, events out (receive_data / next_events / receive_eof) ----


def _summary(events: list[Any]) -> list[Any]:
    """Events as comparable values: frames as bytes, micro-batches as their groups' points."""
    out: list[Any] = []
    for e in events:
        if isinstance(e, Compute):
            g = e.batch.grouped()
            out.append(("Compute", g.keys, [g.points(i) for i in range(len(g))]))
        elif isinstance(e, Started):
            out.append(("Started", e.reply))
        else:
            out.append(e)
    return out


def _feed(s: Session, chunks: Iterable[bytes], *, eof: bool = True, truncated_ok: bool = False) -> list[Any]:
    events: list[Any] = []
    for chunk in chunks:
        s.receive_data(chunk)
        while s.frames_waiting:
            events += s.next_events(0.0)
        if s.input_broken:
            events += s.next_events(0.0)
    if eof:
        events += s.receive_eof(0.0, truncated_ok=truncated_ok)
    return events


def _wire(*requests: udf_pb2.Request) -> bytes:
    return b"".join(encode_frame(r) for r in requests)


_STREAM_REQUESTS = (
    init(*MOVING_AVG_OPTIONS),
    *(point(t, "abc"[t % 3], float(t)) for t in range(6)),
    keepalive(7),
    *(point(t, "abc"[t % 3], float(t)) for t in range(6, 13)),
)
_STREAM = _wire(*_STREAM_REQUESTS)


def test_bytes_fed_whole_split_anywhere_or_a_byte_at_a_time_give_the_same_events():
    whole = _summary(_feed(session(max_batch_points=4), [_STREAM]))
    assert [e[0] if isinstance(e, tuple) else type(e).__name__ for e in whole] == ["Started", "Compute", "Send", "Compute", "Compute", "Compute"]
    for cut in range(1, len(_STREAM)):
        assert _summary(_feed(session(max_batch_points=4), [_STREAM[:cut], _STREAM[cut:]])) == whole, cut
    assert _summary(_feed(session(max_batch_points=4), [_STREAM[i : i + 1] for i in range(len(_STREAM))])) == whole


def test_the_compiled_splitter_takes_over_mid_frame_and_changes_no_event():
    reference = _summary(_feed(session(max_batch_points=4), [_STREAM]))
    init_end = len(encode_frame(init(*MOVING_AVG_OPTIONS)))
    for cut in (init_end, init_end + 1, init_end + 17, len(_STREAM) - 3):
        s = session(max_batch_points=4)
        events = _feed(s, [_STREAM[:cut]], eof=False)
        s.use_compiled_splitter(FastFrameSplitter.continuing)
        events += _feed(s, [_STREAM[cut:]])
        assert _summary(events) == reference, cut


@pytest.mark.parametrize("compiled", [False, True], ids=["python splitter", "compiled scanner"])
def test_a_checkpoint_counts_the_bytes_of_the_frames_acted_on_wherever_the_input_was_cut(compiled):
    """What a relay trims from the input it keeps: every whole frame acted on, length prefix
    included, and not a byte of a frame still being read."""
    frame_ends: list[int] = []
    for frame in (encode_frame(r) for r in _STREAM_REQUESTS):
        frame_ends.append((frame_ends[-1] if frame_ends else 0) + len(frame))
    assert frame_ends[-1] == len(_STREAM)
    for cut in range(1, len(_STREAM)):
        s = session(max_batch_points=4)
        if compiled:
            s.use_compiled_splitter(FastFrameSplitter.continuing)
        _feed(s, [_STREAM[:cut]], eof=False)
        whole = max([end for end in frame_ends if end <= cut], default=0)
        assert s.bytes_acted_on == whole, cut
        checkpoints = [e.input_bytes for e in s.checkpoint() if isinstance(e, TakeCheckpoint)]
        assert checkpoints == ([whole] if cut >= frame_ends[0] else []), cut  # none before Init


def test_the_compiled_splitter_keeps_counting_frames_for_error_messages():
    requests = [point(t, "a", float(t)) for t in range(5)]
    requests[3].point.group = "cafe!"
    raw = _wire(init(*MOVING_AVG_OPTIONS), *requests).replace(b"cafe!", b"caf\xff!")
    s = session()
    events = _feed(s, [raw[:10]], eof=False)
    s.use_compiled_splitter(FastFrameSplitter.continuing)
    events += _feed(s, [raw[10:]], eof=False)
    assert events[-1] == Fail("frame 5: Point.group is not valid UTF-8")


def test_before_the_udf_is_known_keepalives_are_answered_and_everything_else_waits():
    s = Session(None, max_batch_points=10)
    events = _feed(s, [_wire(info(), keepalive(42), init(*MOVING_AVG_OPTIONS), keepalive(43))], eof=False)
    assert [(type(e), decode(e.frame).keepalive.time, e.urgent) for e in events] == [(Send, 42, True), (Send, 43, True)]
    with pytest.raises(RuntimeError, match="not known yet"):
        s.spec  # noqa: B018
    adopted = s.adopt(moving_avg, 0.0)
    assert kinds(adopted) == ["Send", "Started"]
    assert reply_of(adopted[0], "info").options["size"].valueTypes == [udf_pb2.INT]


def test_a_framing_error_before_the_udf_is_known_fails_the_session_once_it_is():
    s = Session(None, max_batch_points=10)
    assert _feed(s, [_wire(info()) + b"\x80" * 11], eof=False) == []
    assert s.input_broken and not s.failed
    events = s.adopt(moving_avg, 0.0)
    assert kinds(events) == ["Send", "Fail"] and "malformed varint length" in events[1].message


def test_points_read_before_a_framing_error_are_still_computed():
    s = session()
    events = _feed(s, [_wire(init(*MOVING_AVG_OPTIONS), point(1), point(2)) + b"\x80" * 11], eof=False)
    assert kinds(events) == ["Started", "Compute", "Fail"]
    assert events[1].batch.count == 2 and events[2].message == "frame 4 starts with a malformed varint length"
    assert s.next_events(0.0) == []  # reported once


def test_input_ending_inside_a_frame_fails_unless_the_runtime_cut_it_short():
    frames = _wire(init(*MOVING_AVG_OPTIONS), point(1))
    events = _feed(session(), [frames[:-1]])
    assert kinds(events) == ["Started", "Fail"] and "input ended inside a frame" in events[-1].message
    assert kinds(_feed(session(), [frames[:-1]], truncated_ok=True)) == ["Started"]


def test_frames_are_acted_on_a_slice_at_a_time():
    s = session()
    s.receive_data(_wire(*(keepalive(t) for t in range(2500))))
    assert len(s.next_events(0.0, max_frames=1024)) == 1024 and s.frames_waiting
    assert len(s.next_events(0.0)) == 1024 and len(s.next_events(0.0)) == 452 and not s.frames_waiting


# ---- stream_fn and batch_fn: which modules .fn() may import ----

FUNCTION_MODULE = """
import pathlib

pathlib.Path(__file__).with_suffix(".imported").touch()  # this module's code ran

from udf_agent import stream_udf


@stream_udf(compute=False)
def scale(df, ctx):
    return df
"""


@pytest.fixture
def places(tmp_path, monkeypatch):
    """Where .fn()'s modules may be: 'pythonpath' (on PYTHONPATH, so on sys.path), 'installed'
    (on sys.path only, as site-packages is) and 'work', the working directory."""
    directories = {name: tmp_path / name for name in ("pythonpath", "installed", "work")}
    for directory in directories.values():
        directory.mkdir()
    monkeypatch.setenv("PYTHONPATH", str(directories["pythonpath"]))
    monkeypatch.syspath_prepend(str(directories["installed"]))
    monkeypatch.syspath_prepend(str(directories["pythonpath"]))
    monkeypatch.chdir(directories["work"])
    yield directories
    for name, module in list(sys.modules.items()):
        if str(tmp_path) in f"{getattr(module, '__file__', None)} {getattr(module, '__path__', None)}":
            del sys.modules[name]


def write_module(directory: pathlib.Path, name: str, package_files: bool = True) -> pathlib.Path:
    """FUNCTION_MODULE as the module NAME under DIRECTORY; returns the marker its import creates."""
    *packages, leaf = name.split(".")
    for depth in range(len(packages)):
        package = directory.joinpath(*packages[: depth + 1])
        package.mkdir(exist_ok=True)
        if package_files:
            (package / "__init__.py").touch()
    path = directory.joinpath(*packages, f"{leaf}.py")
    path.write_text(FUNCTION_MODULE)
    importlib.invalidate_caches()
    return path.with_suffix(".imported")


def fn_init(fn: str, *allow_modules: str, edge: str = "stream") -> udf_pb2.InitResponse:
    """The InitResponse of {edge}_fn, given --allow-module ALLOW_MODULES, to .fn(FN) in real frames."""
    s = session(FUNCTION_TARGETS[f"{edge}_fn"], allow_modules=allow_modules)
    (event,) = _feed(s, [_wire(init(option("fn", fn)))], eof=False)
    return reply_of(event, "init")


@pytest.mark.parametrize("edge", ["stream", "batch"])
def test_fn_imports_a_module_found_in_a_pythonpath_directory(places, edge):
    imported = write_module(places["pythonpath"], f"{edge}_fns.functions")
    answer = fn_init(f"{edge}_fns.functions:scale", edge=edge)
    if edge == "stream":
        assert answer.success, answer.error
    else:  # allowed and imported; refused only for its edges
        assert "is a stream -> stream UDF; batch_fn runs batch -> batch UDFs" in answer.error
    assert imported.exists()


def test_fn_refuses_the_standard_library_and_says_which_option_allows_it(places):
    answer = fn_init("json:dumps")
    assert not answer.success
    assert "fn 'json:dumps': module 'json' is not under PYTHONPATH (it is in Python's standard library)" in answer.error
    assert f"PYTHONPATH={places['pythonpath']}" in answer.error
    assert "add --allow-module json to udf-agent's arguments" in answer.error
    # Allowed, it imports, and is refused as what it is.
    allowed = fn_init("json:dumps", "json")
    assert not allowed.success and "'json:dumps' is not a UDF" in allowed.error


def test_fn_refuses_a_standard_library_name_even_from_a_pythonpath_directory_before_importing_it(places):
    imported = write_module(places["pythonpath"], "this")  # the Zen of Python's name
    answer = fn_init("this:scale")
    assert not answer.success and "it is in Python's standard library" in answer.error
    assert not imported.exists()


@pytest.mark.parametrize("on_sys_path", [True, False], ids=["working-directory-on-sys.path", "not-on-sys.path"])
def test_fn_never_imports_from_the_working_directory(places, monkeypatch, on_sys_path):
    # A namespace package: the working directory holds sub/x.py, nothing more.
    imported = write_module(places["work"], "sub.x", package_files=False)
    working_directory = str(places["work"])
    if on_sys_path:  # as `python -m` puts it in the shared server's
        monkeypatch.syspath_prepend(working_directory)
    else:
        monkeypatch.setattr(sys, "path", [entry for entry in sys.path if entry not in ("", ".", working_directory)])
    for allow in ((), ("sub",)):
        answer = fn_init("sub.x:scale", *allow)
        assert not answer.success
        if on_sys_path:
            assert f"module 'sub' is in the working directory ({working_directory})" in answer.error
            assert "put the directory that holds it on PYTHONPATH" in answer.error
        elif not allow:
            assert "module 'sub' is found in no directory on PYTHONPATH" in answer.error
        else:
            assert "cannot import module 'sub.x'" in answer.error
        assert not imported.exists()
    assert (working_directory in sys.path) == on_sys_path
    # The operator may put it on PYTHONPATH.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(places["pythonpath"]), working_directory]))
    if not on_sys_path:
        monkeypatch.syspath_prepend(working_directory)
    assert fn_init("sub.x:scale").success
    assert imported.exists()


def test_an_empty_pythonpath_entry_does_not_name_the_working_directory(places, monkeypatch):
    imported = write_module(places["work"], "stray")
    monkeypatch.syspath_prepend(str(places["work"]))
    monkeypatch.setenv("PYTHONPATH", f"{places['pythonpath']}{os.pathsep}")  # as from PYTHONPATH=DIR:$PYTHONPATH
    assert "is in the working directory" in fn_init("stray:scale").error
    assert not imported.exists()


def test_allow_module_allows_a_prefix_and_its_submodules_only(places):
    imported = write_module(places["installed"], "mypkg.mod")
    imported_x = write_module(places["installed"], "mypkgx")
    refused = fn_init("mypkg.mod:scale")
    assert not refused.success
    assert f"module 'mypkg.mod' is not under PYTHONPATH (Python finds it in {places['installed']})" in refused.error
    assert "add --allow-module mypkg.mod to" in refused.error
    assert not imported.exists()
    assert fn_init("mypkg.mod:scale", "mypkg").success
    assert imported.exists()
    boundary = fn_init("mypkgx:scale", "mypkg")
    assert not boundary.success and "add --allow-module mypkgx to" in boundary.error
    assert not imported_x.exists()
    assert fn_init("mypkgx:scale", "mypkg", "mypkgx").success


def test_a_module_name_that_is_not_one_is_refused(places):
    answer = fn_init("my-pkg:scale", "my-pkg")
    assert not answer.success and "'my-pkg' is not a module name" in answer.error
