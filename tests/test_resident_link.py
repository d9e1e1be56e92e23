"""The resident link (``spark_backend.resident_protocol.Link``) over real sockets: messages
whole however the bytes arrive, deadlines on the agent's end, and a trickle's message taken in
one read with no timeout set per call."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from spark_backend.resident_protocol import MAX_GATHERED, RECEIVE_BUFFER, Link
from udf_agent.wire.links import HEADER


class CountingSocket(socket.socket):
    """A socket that counts its reads and its changes of timeout."""

    reads = 0
    timeouts_set = 0

    def recv_into(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.reads += 1
        return super().recv_into(*args, **kwargs)

    def settimeout(self, value):  # type: ignore[no-untyped-def]
        self.timeouts_set += 1
        super().settimeout(value)


def _send_later(sock: socket.socket, data: bytes) -> None:
    time.sleep(0.001)  # after the receiver has taken the first part
    sock.sendall(data)


def counting_pair() -> tuple[CountingSocket, socket.socket]:
    ours, theirs = socket.socketpair()
    counted = CountingSocket(fileno=ours.detach())
    return counted, theirs


@pytest.mark.parametrize("deadlines", [False, True], ids=["blocking", "deadlines"])
def test_a_message_of_many_parts_and_megabytes_arrives_whole_over_a_real_socket(deadlines):
    parts = [bytes([n % 251]) * (n % 7 + 1) for n in range(MAX_GATHERED * 2 + 3)] + [b"", os.urandom(4 << 20), bytearray(b"end")]
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sending, receiving = Link(ours, deadlines), Link(theirs, deadlines)
        deadline = time.monotonic() + 30 if deadlines else None
        sender = threading.Thread(target=lambda: sending.send(5, *parts, deadline=deadline))
        sender.start()  # the socket takes far less than 4 MiB at once: sends are partial
        assert receiving.receive(deadline) == (5, bytearray(b"".join(parts)))
        sender.join()


def test_messages_split_at_every_byte_arrive_whole_and_in_order():
    """Two messages, the second larger than the link's buffer, cut in two at every position
    of the first's bytes and of the start of the second's."""
    small = HEADER.pack(3, 5) + b"hello"
    large_payload = os.urandom(RECEIVE_BUFFER + 100)
    large = HEADER.pack(4, len(large_payload)) + large_payload
    stream = small + large
    for cut in range(len(small) + HEADER.size + 2):
        ours, theirs = socket.socketpair()
        with ours, theirs:
            link = Link(theirs, deadlines=True)
            ours.sendall(stream[:cut])

            sender = threading.Thread(target=_send_later, args=(ours, stream[cut:]))
            sender.start()
            deadline = time.monotonic() + 10
            assert link.receive(deadline) == (3, bytearray(b"hello")), cut
            assert link.receive(deadline) == (4, bytearray(large_payload)), cut
            sender.join()
            ours.close()
            assert link.receive(deadline) is None  # a clean end, between messages


def test_many_messages_in_one_read_come_out_one_by_one_each_its_own_copy():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(b"".join(HEADER.pack(kind, 3) + bytes([kind]) * 3 for kind in range(1, 40)))
        link = Link(theirs)
        received = [link.receive() for _ in range(39)]
        assert received == [(kind, bytearray([kind]) * 3) for kind in range(1, 40)]
        received[0][1][0] = 99  # a payload is the caller's own: the buffer is reused
        assert received[1][1] == bytearray([2]) * 3


def test_a_trickles_message_is_taken_in_one_read_and_no_timeout_is_set_per_call():
    """The header and payload that arrived together are one system call, not two; the
    agent's end sets no timeout on its socket per call (two system calls each, and a poll
    before every read and write)."""
    counted, theirs = counting_pair()
    with counted, theirs:
        link = Link(counted, deadlines=True)
        before = counted.timeouts_set
        for round_trip in range(20):
            Link(theirs).send(7, b"slice %d" % round_trip)
            assert link.receive(time.monotonic() + 10) == (7, bytearray(b"slice %d" % round_trip))
            link.send(8, b"answer", deadline=time.monotonic() + 10)
            assert theirs.recv(64) == HEADER.pack(8, 6) + b"answer"
        assert counted.reads == 20
        assert counted.timeouts_set == before


def test_a_peer_that_says_nothing_times_out_at_the_deadline():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        link = Link(theirs, deadlines=True)
        ours.sendall(HEADER.pack(1, 10) + b"half")  # and never the rest
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            link.receive(started + 0.2)
        assert 0.2 <= time.monotonic() - started < 5
        with pytest.raises(TimeoutError):
            link.receive(time.monotonic() - 1)  # a deadline already past: no wait at all


def test_a_peer_that_reads_nothing_times_a_large_send_out_at_the_deadline():
    ours, theirs = socket.socketpair()
    with ours, theirs:
        link = Link(ours, deadlines=True)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            link.send(1, bytes(64 << 20), deadline=started + 0.2)
        assert 0.2 <= time.monotonic() - started < 5


def test_an_end_of_stream_inside_a_message_is_an_error_and_an_oversized_one_is_refused():
    for cut in (HEADER.size - 1, HEADER.size + 2):
        ours, theirs = socket.socketpair()
        with theirs:
            with ours:
                ours.sendall((HEADER.pack(2, 5) + b"abcde")[:cut])
            with pytest.raises(ConnectionError, match="closed after"):
                Link(theirs).receive()
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(HEADER.pack(2, 2**62))
        with pytest.raises(ValueError, match="over the 4096 expected"):
            Link(theirs).receive(max_length=4096)
