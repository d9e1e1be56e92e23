"""The shared server's chunks of whole frames to a task's relay, cut and put back together."""

from __future__ import annotations

import socket
import time

import pytest

from udf_agent import udf_pb2
from udf_agent.runtime.connection import WriteTimeout
from udf_agent.runtime.relay_link import HEADER, ChunkSplitter, RelayedConnection
from udf_agent.wire.frames import encode_frame
from udf_agent.wire.guard import error_frame


def point_frames(count: int, first: int = 0) -> bytes:
    return b"".join(encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=t, name="m"))) for t in range(first, first + count))


CHUNKS = [point_frames(3), point_frames(1, 3), error_frame("it failed")]
STREAM = b"".join(HEADER.pack(len(chunk)) + chunk for chunk in CHUNKS)


def test_whole_chunks_come_out_as_their_frames_and_the_last_one_is_kept():
    splitter = ChunkSplitter()
    assert splitter.feed(STREAM) == b"".join(CHUNKS)
    assert splitter.buffered == 0
    assert splitter.last_chunk == CHUNKS[-1]


def test_a_stream_fed_one_byte_at_a_time_gives_each_chunk_once_it_is_whole():
    splitter = ChunkSplitter()
    out = []
    for i in range(len(STREAM)):
        whole = splitter.feed(STREAM[i : i + 1])
        if whole:
            out.append(whole)
    assert out == CHUNKS


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_stream_split_anywhere_gives_only_whole_chunks(cut):
    splitter = ChunkSplitter()
    first = splitter.feed(STREAM[:cut])
    # Never a piece of a chunk: what comes out ends where a chunk ends.
    ends = [sum(HEADER.size + len(c) for c in CHUNKS[: n + 1]) for n in range(len(CHUNKS))]
    done = max((n + 1 for n, end in enumerate(ends) if end <= cut), default=0)
    assert first == b"".join(CHUNKS[:done])
    assert splitter.buffered == cut - (ends[done - 1] if done else 0)
    assert first + splitter.feed(STREAM[cut:]) == b"".join(CHUNKS)
    assert splitter.buffered == 0


def test_a_chunk_cut_short_stays_buffered_and_is_never_passed_on():
    splitter = ChunkSplitter()
    assert splitter.feed(STREAM[: HEADER.size + len(CHUNKS[0]) + 5]) == CHUNKS[0]
    assert splitter.buffered == 5
    assert splitter.last_chunk == CHUNKS[0]


def test_a_relayed_connection_sends_each_write_as_one_chunk_over_a_real_socket():
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        connection = RelayedConnection(ours)
        for chunk in CHUNKS:
            connection.write(chunk)
        connection.close_write()
        received = b""
        while data := relay.recv(65536):
            received += data
    assert received == STREAM


def test_a_write_cut_by_its_deadline_counts_frame_bytes_not_the_header():
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        connection = RelayedConnection(ours)
        big = point_frames(20_000)
        with pytest.raises(WriteTimeout) as cut:
            connection.write(big, lambda: time.monotonic() + 0.2)  # nobody reads the relay's end
        queued = 0
        relay.setblocking(False)
        try:
            while data := relay.recv(1 << 20):
                queued += len(data)
        except BlockingIOError:
            pass
    assert 0 < cut.value.written < len(big)
    assert cut.value.written == queued - HEADER.size
