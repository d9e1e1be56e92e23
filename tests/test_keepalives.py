"""Keepalives by hand (``wire/keepalives``): byte for byte what protobuf makes and reads."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from udf_agent import udf_pb2
from udf_agent.wire.frames import ProtocolError, encode_frame
from udf_agent.wire.keepalives import keepalive_frame, keepalive_request_time

INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.mark.parametrize("time", [0, 1, -1, 42, 2**63 - 1, -(2**63), 1_700_000_000_000_000_000])
def test_a_keepalive_reply_is_protobufs_own_bytes(time):
    assert keepalive_frame(time) == encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=time)))


def test_a_keepalive_reply_of_time_zero_is_not_an_empty_response():
    # Kapacitor crashes on an empty Response: the oneof is set even when the time is left out.
    assert keepalive_frame(0) == b"\x02\x1a\x00"


@given(INT64)
def test_any_time_is_written_as_protobuf_writes_it_and_read_back(time):
    assert keepalive_frame(time) == encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=time)))
    body = udf_pb2.Request(keepalive=udf_pb2.KeepaliveRequest(time=time)).SerializeToString()
    assert keepalive_request_time(body) == time


def test_the_golden_keepalive_request_reads_42():
    # kapacitor-udf-facts.md: KeepaliveRequest(time=42) is 04 1a 02 08 2a.
    assert keepalive_request_time(bytes.fromhex("1a02082a")) == 42


def test_unknown_fields_of_a_keepalive_request_are_skipped_as_protobuf_skips_them():
    inner = b"".join([b"\x10\x05", b"\x1a\x03abc", b"\x21" + bytes(8), b"\x08\x2a", b"\x2d" + bytes(4)])
    body = b"\x1a" + bytes([len(inner)]) + inner
    parsed = udf_pb2.Request()
    parsed.ParseFromString(body)
    assert keepalive_request_time(body) == parsed.keepalive.time == 42


@pytest.mark.parametrize(
    "body",
    [
        b"",  # nothing
        b"\x12\x00",  # an InitRequest
        b"\x1a\x05\x08\x2a",  # longer than the frame
        b"\x1a\x02\x08\xff",  # the time's varint cut short
        b"\x1a\x02\x0b\x00",  # wire type 3 (a group): not in this protocol
        b"\x1a\x02\x12\x05",  # a field running past its message
    ],
)
def test_what_is_not_a_keepalive_request_is_a_protocol_error(body):
    with pytest.raises(ProtocolError):
        keepalive_request_time(body)
