"""The shared server's messages to a task's relay, cut and put back together: chunks of whole
frames, and the task's log records."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

import pytest

from udf_agent import udf_pb2
from udf_agent.logs import TaskLabels, TaskLogRoutes, in_task
from udf_agent.runtime.connection import WriteTimeout
from udf_agent.runtime.writer import Writer
from udf_agent.serve.relay import restore_frame
from udf_agent.serve.relay_link import (
    CHECKPOINT,
    MAX_QUEUED_LOG_BYTES,
    OUTPUT,
    ChunkSplitter,
    LinkError,
    RelayedConnection,
    checkpoint_message,
    log_message,
    output_message,
)
from udf_agent.wire.frames import KEEPALIVE_KEY, count_frames, encode_frame
from udf_agent.wire.guard import error_frame
from udf_agent.wire.links import HEADER, LENGTH, message


def point_frames(count: int, first: int = 0) -> bytes:
    return b"".join(encode_frame(udf_pb2.Response(point=udf_pb2.Point(time=t, name="m"))) for t in range(first, first + count))


CHUNKS = [point_frames(3), point_frames(1, 3), error_frame("it failed")]
RECORDS = [b'{"message": "first"}', b'{"message": "second"}', b'{"message": "after the last chunk"}']
# Output and log records interleaved, as the server sends them: a record ahead of a write's chunk.
MESSAGES = [("record", RECORDS[0]), ("chunk", CHUNKS[0]), ("chunk", CHUNKS[1]), ("record", RECORDS[1]), ("chunk", CHUNKS[2]), ("record", RECORDS[2])]


def chunk_message(frames: bytes) -> bytes:
    return output_message(frames, count_frames(frames, KEEPALIVE_KEY))


WIRE = [chunk_message(body) if kind == "chunk" else log_message(body) for kind, body in MESSAGES]
STREAM = b"".join(WIRE)
ENDS = [sum(len(part) for part in WIRE[: n + 1]) for n in range(len(WIRE))]
COUNTED = [3, 1, 1]  # frames in each of CHUNKS


def of_kind(kind: str, messages: list[tuple[str, bytes]]) -> list[bytes]:
    return [body for their_kind, body in messages if their_kind == kind]


def test_whole_chunks_come_out_as_their_frames_records_apart_and_the_last_chunk_is_kept():
    splitter = ChunkSplitter()
    assert splitter.feed(STREAM) == (b"".join(CHUNKS), sum(COUNTED), RECORDS, None)
    assert splitter.buffered == 0
    assert splitter.last_chunk == CHUNKS[-1]  # a record after it does not hide how the task ended


def test_a_stream_fed_one_byte_at_a_time_gives_each_message_once_it_is_whole():
    splitter = ChunkSplitter()
    out: list[tuple[str, bytes]] = []
    for i in range(len(STREAM)):
        whole, _, records, _ = splitter.feed(STREAM[i : i + 1])
        assert not (whole and records)  # one byte completes one message at most
        if whole:
            out.append(("chunk", whole))
        out.extend(("record", record) for record in records)
        assert splitter.buffered == i + 1 - max((end for end in ENDS if end <= i + 1), default=0)
    assert out == MESSAGES


@pytest.mark.parametrize("cut", range(1, len(STREAM)))
def test_a_stream_split_anywhere_gives_only_whole_messages(cut):
    splitter = ChunkSplitter()
    first, first_counted, first_records, _ = splitter.feed(STREAM[:cut])
    # Never a piece of a message: what comes out ends where a message ends.
    done = sum(end <= cut for end in ENDS)
    assert first == b"".join(of_kind("chunk", MESSAGES[:done]))
    assert first_records == of_kind("record", MESSAGES[:done])
    assert splitter.buffered == cut - (ENDS[done - 1] if done else 0)
    assert first_counted == sum(COUNTED[: len(of_kind("chunk", MESSAGES[:done]))])
    rest, rest_counted, rest_records, _ = splitter.feed(STREAM[cut:])
    assert (first + rest, first_counted + rest_counted, first_records + rest_records) == (b"".join(CHUNKS), sum(COUNTED), RECORDS)
    assert splitter.buffered == 0


def test_a_chunk_cut_short_stays_buffered_and_is_never_passed_on():
    splitter = ChunkSplitter()
    assert splitter.feed(STREAM[: ENDS[1] + 5]) == (CHUNKS[0], COUNTED[0], RECORDS[:1], None)
    assert splitter.buffered == 5
    assert splitter.last_chunk == CHUNKS[0]


def test_a_message_of_an_unknown_kind_is_refused_saying_so():
    with pytest.raises(LinkError, match="unknown kind 7"):
        ChunkSplitter().feed(chunk_message(b"\x01\x00") + message(7, b"??"))


def test_an_output_chunk_too_short_to_hold_its_count_is_refused_saying_so():
    with pytest.raises(LinkError, match="an output chunk of 3 bytes, short of its count"):
        ChunkSplitter().feed(message(OUTPUT, b"\x01\x00\x00"))


def test_the_server_counts_every_frame_of_a_write_but_keepalive_replies():
    keepalive = encode_frame(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=7)))
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        RelayedConnection(ours).write(keepalive + point_frames(2) + keepalive + error_frame("it failed"))
        ours.shutdown(socket.SHUT_WR)
        _, counted, _, _ = ChunkSplitter().feed(relay.recv(1 << 20))
    assert counted == 3


def test_a_checkpoint_built_in_place_is_the_message_of_its_parts():
    init, state = encode_frame(udf_pb2.Request(init=udf_pb2.InitRequest(taskID="t"))), os.urandom(100_000)
    built = checkpoint_message(12_345, init, lambda out: out.extend(state))
    assert built == message(CHECKPOINT, LENGTH.pack(12_345), LENGTH.pack(len(init)), init, state)


def test_a_checkpoint_is_kept_as_it_came_without_a_copy_and_what_follows_it_comes_after():
    init, state = b"\x02\x12\x00", os.urandom(300_000)
    stream = chunk_message(CHUNKS[0]) + bytes(checkpoint_message(7, init, lambda out: out.extend(state))) + chunk_message(CHUNKS[1])
    splitter = ChunkSplitter()
    frames, counted, _, checkpoint = splitter.feed(stream)
    assert (frames, counted) == (CHUNKS[0], 3)  # what came before it, first
    assert checkpoint is not None and (checkpoint.input_bytes, checkpoint.init_frame) == (7, init)
    assert isinstance(checkpoint.snapshot, memoryview) and checkpoint.snapshot == state
    # A view of the buffer the message was received in, cut to it: no second copy of the state.
    assert checkpoint.snapshot.nbytes == len(state) and len(checkpoint.snapshot.obj) == 2 * LENGTH.size + len(init) + len(state)
    assert splitter.feed(b"")[:2] == (CHUNKS[1], 1)  # what follows it, once asked for
    assert splitter.buffered == 0 and checkpoint.snapshot == state  # the kept one is left alone


@pytest.mark.parametrize("size", [1, 127, 128, 16_383, 16_384, 300_000])  # never empty: a snapshot has its header
def test_the_relays_restore_request_is_protobufs_own_bytes(size):
    state = os.urandom(size)
    assert restore_frame(memoryview(state)) == encode_frame(udf_pb2.Request(restore=udf_pb2.RestoreRequest(snapshot=state)))


def test_a_message_is_its_kind_and_length_little_endian_then_its_payload():
    assert message(2, b"abc") == b"\x02" + (3).to_bytes(8, "little") + b"abc"


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
    assert received == b"".join(chunk_message(chunk) for chunk in CHUNKS)


def test_a_write_cut_by_its_deadline_counts_frame_bytes_not_the_header_and_count():
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
    assert cut.value.written == queued - HEADER.size - LENGTH.size


@pytest.fixture
def log_routes():
    """The shared server's routes of task records, on the root logger for the test."""
    routes = TaskLogRoutes()
    root = logging.getLogger()
    level = root.level
    root.addHandler(routes)
    root.setLevel(logging.WARNING)
    yield routes
    root.removeHandler(routes)
    root.setLevel(level)


def log_in_a_task(labels: TaskLabels, message: str, *args: object, times: int = 1) -> threading.Thread:
    """Logs a warning ``times`` times from a thread of the task of ``labels``, as the agent's
    threads do; the thread, joined for at most 10 s."""

    def work() -> None:
        for _ in range(times):
            logging.getLogger("tests.task").warning(message, *args)

    thread = threading.Thread(target=in_task(labels, work))
    thread.start()
    thread.join(10)
    return thread


def read_to_the_end(relay: socket.socket) -> tuple[bytes, list[dict]]:
    splitter = ChunkSplitter()
    frames, records = b"", []
    while data := relay.recv(1 << 20):
        whole, _, new, _ = splitter.feed(data)
        frames += whole
        records += [json.loads(record) for record in new]
    assert splitter.buffered == 0
    return frames, records


def test_a_tasks_log_records_reach_its_relay_while_no_output_flows_and_no_one_elses_do(log_routes):
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        link = RelayedConnection(ours)
        labels = TaskLabels(udf="warns", task_id="cpu_alert", node_id="udf2")
        writer = Writer(link, labels)
        link.forward_logs(log_routes, labels, writer)
        log_in_a_task(TaskLabels(udf="warns", task_id="mem_alert", node_id="udf7"), "another task's line")
        logging.getLogger("tests.server").warning("a line of no task")
        log_in_a_task(labels, "dropped %d point(s)", 3)
        # No output is under way: the record wakes the writer, and arrives on its own.
        relay.settimeout(10)
        whole, _, (record,), _ = ChunkSplitter().feed(relay.recv(1 << 20))
        assert whole == b""
        assert json.loads(record) == {
            "time": pytest.approx(time.time(), abs=10),
            "levelno": logging.WARNING,
            "logger": "tests.task",
            "pid": os.getpid(),
            "message": "dropped 3 point(s)",
            "exception": "",
            "taskID": "cpu_alert",
            "nodeID": "udf2",
            "udf": "warns",
        }
        writer.send(point_frames(2))
        writer.close()
        writer.join()
        assert read_to_the_end(relay) == (point_frames(2), [])


def test_output_written_at_once_never_goes_ahead_of_log_records_queued_before_it():
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        link = RelayedConnection(ours)
        relay.settimeout(10)
        assert link.write_now(CHUNKS[0])  # nothing queued: one chunk, at once
        link._queue_log_record(RECORDS[0])  # a record no writer has taken yet
        assert not link.write_now(CHUNKS[1])  # the record first: the writer's write takes both
        link.write(CHUNKS[1])
        link.close_write()
        received = bytearray()
        while data := relay.recv(1 << 16):
            received += data
    assert bytes(received) == WIRE[1] + WIRE[0] + WIRE[2]


def test_a_relay_that_does_not_keep_up_costs_log_records_never_a_wait_and_is_told_how_many(log_routes):
    ours, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with ours, relay:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        link = RelayedConnection(ours)
        labels = TaskLabels(udf="warns", task_id="cpu_alert", node_id="udf2")
        writer = Writer(link, labels)
        link.forward_logs(log_routes, labels, writer)
        writer.send(point_frames(20_000))  # more than the socket holds: the writer waits for the relay
        logged = 2 * MAX_QUEUED_LOG_BYTES // 1000
        started = time.monotonic()
        assert not log_in_a_task(labels, "%s", "x" * 1000, times=logged).is_alive(), "logging waited for the relay"
        assert time.monotonic() - started < 5
        writer.close()
        frames, records = read_to_the_end(relay)
    assert frames == point_frames(20_000)
    *sent, notice = records
    assert 0 < len(sent) < logged and all(record["message"] == "x" * 1000 for record in sent)
    assert notice["message"] == f"{logged - len(sent)} log record(s) of this task were not sent to its stderr: its relay did not keep up (the shared server's log has them)"
    assert (notice["taskID"], notice["levelno"]) == ("cpu_alert", logging.WARNING)


def test_the_relay_queues_little_of_kapacitors_input_ahead_of_a_server_that_is_not_reading():
    """A KeepaliveRequest waits behind whatever input sits between Kapacitor and the server's
    reader: while the reader waits for compute, the relay's socket takes only a few tens of
    KiB, and Kapacitor's writes wait in its pipe instead."""
    from udf_agent.serve.relay import SERVER_SEND_BUFFER, _input_link
    from udf_agent.serve.shared import Welcome

    relay, server = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with relay, server:
        sock = _input_link(Welcome(relay, 0, "", None, None, None))
        sock.setblocking(False)
        queued = 0
        try:
            while True:
                queued += sock.send(b"\x00" * 4096)
        except BlockingIOError:
            pass
    # Linux doubles the size asked for its own bookkeeping; unsized, a socket takes ~200 KiB.
    assert 0 < queued <= 2 * SERVER_SEND_BUFFER


def test_the_server_queues_little_of_a_tasks_output_ahead_of_a_relay_that_is_not_reading():
    """A keepalive reply jumps the writer's queue, not what the socket to the relay already
    holds: the server's end of a task's link takes a few tens of KiB of output, not ~200."""
    from udf_agent.serve.relay_link import OUTPUT_SEND_BUFFER

    server, relay = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with server, relay:
        link = RelayedConnection(server)
        link.sock.setblocking(False)
        queued = 0
        try:
            while True:
                queued += link.sock.send(b"\x00" * 4096)
        except BlockingIOError:
            pass
    assert 0 < queued <= 2 * OUTPUT_SEND_BUFFER


def test_the_relay_lets_kapacitors_full_output_pipe_drain_before_writing_again(monkeypatch):
    """Kapacitor reads a UDF's output 4 KiB at a time. A relay that wrote again as soon as its
    full pipe had room would wake (and write) once for each of those reads; it waits for the
    pipe to drain a while instead, and still delivers every byte in order."""
    import types

    from udf_agent.runtime.stdio import PIPE_SIZE, size_pipe
    from udf_agent.serve import relay_output as relay

    writes = 0

    def counted_write(fd: int, data: memoryview) -> int:
        nonlocal writes
        writes += 1
        return os.write(fd, data)

    monkeypatch.setattr(relay, "os", types.SimpleNamespace(write=counted_write))
    read_fd, write_fd = os.pipe()
    size_pipe(write_fd, PIPE_SIZE)
    os.set_blocking(write_fd, False)
    data = bytes(range(256)) * (8 * PIPE_SIZE // 256)
    received = bytearray()
    reads = 0

    def kapacitor_reading() -> None:
        nonlocal reads
        while len(received) < len(data):
            received.extend(os.read(read_fd, 4096))
            reads += 1
            time.sleep(0.0002)

    reader = threading.Thread(target=kapacitor_reading)
    reader.start()
    try:
        relay.write_to_kapacitor(write_fd, data, threading.Event())
        reader.join(timeout=30)
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert received == data
    # Past the first pipeful, a write for each of Kapacitor's reads would be ~450 of them.
    assert reads > 400
    assert writes < reads // 4
