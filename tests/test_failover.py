"""What a relay keeps to carry its task over to a new server (serve/failover.py), sans-IO."""

from __future__ import annotations

import pytest

from udf_agent import udf_pb2
from udf_agent.serve.failover import CarryOver, CarryOverError
from udf_agent.serve.relay_link import Checkpoint
from udf_agent.wire.frames import KEEPALIVE_KEY, count_frames, encode_frame


def point(n: int) -> bytes:
    return encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=n, name="m")))


def request(n: int) -> bytes:
    return encode_frame(udf_pb2.Request(point=udf_pb2.Point(time=n, name="m")))


def keepalive_reply(n: int) -> bytes:
    return encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=n)))


def keepalive_request(n: int) -> bytes:
    return encode_frame(udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=n)))


INIT = encode_frame(udf_pb2.Request(init=udf_pb2.InitRequest(taskID="t")))
INIT_OK = encode_frame(udf_pb2.Response(init=udf_pb2.InitResponse(success=True)))
RESTORE_OK = encode_frame(udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=True)))
RESTORE_REFUSED = encode_frame(udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=False, error="bad snapshot")))
ERROR = encode_frame(udf_pb2.Response(error=udf_pb2.ErrorResponse(error="boom")))
RESTORE = b"<restore frame>"


def passed(carry: CarryOver, frames: bytes) -> bytes:
    """What the relay does with output the server counted (``RelayedConnection.write``)."""
    return carry.passed(frames, count_frames(frames, KEEPALIVE_KEY))


def test_what_the_server_counted_is_what_kapacitor_saw_and_what_a_carry_over_drops():
    carry = CarryOver()
    carry.sent(request(1) + request(2) + request(3))
    # Counted by the server: the relay takes its word, and never walks the frames.
    assert carry.passed(point(1) + point(2), 2) == point(1) + point(2)
    carry.replay(b"")
    assert passed(carry, point(1) + point(2) + point(3)) == point(3)


def test_a_replay_without_a_checkpoint_is_all_the_input_and_drops_every_reply_kapacitor_saw():
    carry = CarryOver()
    carry.sent(request(1) + request(2))
    assert passed(carry, point(1) + keepalive_reply(9) + point(2)) == point(1) + keepalive_reply(9) + point(2)
    assert carry.replay(b"") == request(1) + request(2)
    assert carry.catching_up
    # The recomputed two are dropped; a keepalive reply passes; what is new goes on.
    assert passed(carry, point(1) + keepalive_reply(10)) == keepalive_reply(10)
    assert passed(carry, point(2) + point(3)) == point(3)
    assert not carry.catching_up


def test_a_checkpoint_trims_the_input_kept_and_the_replay_starts_with_init_and_restore():
    carry = CarryOver()
    carry.sent(request(1) + request(2))
    passed(carry, point(1) + point(2))
    carry.checkpointed(Checkpoint(len(request(1) + request(2)), INIT, b"state"))
    carry.sent(request(3))
    passed(carry, point(3))
    assert carry.kept_input == len(request(3)) and carry.snapshot == b"state"
    replay = carry.replay(RESTORE)
    assert replay == INIT + RESTORE + request(3)
    carry.sent(request(4))
    # Replies to the made-up Init and Restore come in any order, among the data.
    assert passed(carry, RESTORE_OK + point(3) + INIT_OK + point(4)) == point(4)
    # The new server's checkpoint is counted in its own input: Init and Restore first.
    carry.sent(request(5))
    carry.checkpointed(Checkpoint(len(replay) + len(request(4)), INIT, b"later"))
    passed(carry, point(5))  # the output after a checkpoint answers input after it
    assert carry.kept_input == len(request(5))
    assert carry.replay(RESTORE) == INIT + RESTORE + request(5)
    assert passed(carry, INIT_OK + RESTORE_OK + point(5) + point(6)) == point(6)


def test_a_carry_over_during_a_catch_up_drops_only_what_kapacitor_saw():
    carry = CarryOver()
    carry.sent(request(1) + request(2) + request(3))
    passed(carry, point(1) + point(2) + point(3))
    carry.replay(b"")
    assert passed(carry, point(1)) == b""  # the new server dies here
    carry.replay(b"")
    assert passed(carry, point(1) + point(2) + point(3) + point(4)) == point(4)


def test_a_checkpoint_during_a_catch_up_counts_what_is_still_to_drop_as_seen():
    carry = CarryOver()
    carry.sent(request(1) + request(2))
    passed(carry, point(1) + point(2))
    replay = carry.replay(b"")
    passed(carry, point(1))
    carry.checkpointed(Checkpoint(len(replay[: len(request(1))]), INIT, b"s"))  # after point 1, before 2
    assert carry.replay(RESTORE) == INIT + RESTORE + request(2)
    assert passed(carry, INIT_OK + RESTORE_OK + point(2) + point(3)) == point(3)


def test_an_error_reply_is_never_dropped():
    carry = CarryOver()
    carry.sent(request(1))
    passed(carry, point(1))
    carry.replay(b"")
    assert passed(carry, ERROR) == ERROR


def test_a_refused_restore_ends_the_carry_over_saying_why():
    carry = CarryOver()
    carry.sent(request(1))
    carry.checkpointed(Checkpoint(len(request(1)), INIT, b"state"))
    carry.replay(RESTORE)
    with pytest.raises(CarryOverError, match="refused the task's restore: bad snapshot"):
        passed(carry, INIT_OK + RESTORE_REFUSED)


def test_a_checkpoint_outside_what_was_sent_is_refused():
    carry = CarryOver()
    carry.sent(request(1))
    with pytest.raises(CarryOverError):
        carry.checkpointed(Checkpoint(10_000, INIT, b""))


@pytest.mark.parametrize("cut", range(0, len(keepalive_request(123_456_789) + request(2) + keepalive_request(7)) + 1))
def test_keepalive_requests_are_found_in_whole_frames_wherever_the_input_was_cut(cut):
    stream = keepalive_request(123_456_789) + request(2) + keepalive_request(7)
    carry = CarryOver()
    carry.sent(stream[:cut])
    first, scanned = carry.keepalive_requests(0)
    carry.sent(stream[cut:])
    rest, end = carry.keepalive_requests(scanned)
    assert first + rest == [123_456_789, 7] and end == len(stream)


def test_keeping_more_input_never_copies_what_is_kept():
    """The relay's input thread keeps each chunk it forwards. Kept in one growing buffer, the
    first append after a checkpoint trimmed its front copied everything kept (up to 256 MiB)
    while holding the GIL: tens of milliseconds in which the relay forwarded nothing, a
    KeepaliveRequest included."""
    import tracemalloc

    chunk = request(1) * (64 * 1024 // len(request(1)))
    carry = CarryOver()
    for _ in range(512):  # 32 MiB kept, each chunk its own object as os.read gives them
        carry.sent(bytes(bytearray(chunk)))
    carry.checkpointed(Checkpoint(len(chunk) * 256 + len(request(1)) * 7, INIT, b"state"))  # mid-chunk
    more = [bytes(bytearray(chunk)) for _ in range(64)]  # 4 MiB more, read before it is kept
    tracemalloc.start()
    try:
        for data in more:
            carry.sent(data)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024, f"keeping 4 MiB more allocated {peak / 2**20:.1f} MiB besides"
    assert carry.kept_input == len(chunk) * (256 + 64) - len(request(1)) * 7
    assert carry.replay(RESTORE)[len(INIT + RESTORE) :] == (chunk * (256 + 64))[len(request(1)) * 7 :]


def test_the_input_kept_reads_the_same_however_it_was_cut_and_trimmed():
    from udf_agent.serve.failover import KeptInput

    data = bytes(range(256)) * 4
    for cut in (1, 7, 100, 1024):
        kept = KeptInput()
        for start in range(0, len(data), cut):
            kept.append(data[start : start + cut])
        assert len(kept) == len(data) and kept.tail(0) == data and kept.tail(333) == data[333:]
        kept.drop_front(150)
        assert len(kept) == len(data) - 150 and kept.tail(0) == data[150:] and kept.tail(10) == data[160:]
        kept.drop_front(len(data) - 150)
        assert len(kept) == 0 and kept.tail(0) == b""
