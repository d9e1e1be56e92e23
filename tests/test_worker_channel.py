"""The resident workers' channel (spark_backend.worker_channel, WorkerDoor): only a worker that
proves it holds the agent's token joins, the agent proves it too, the token never crosses,
a recorded handshake proves nothing, and the port speaks only TLS pinned to the agent's
certificate. Real sockets and real TLS throughout; the last test runs real Spark workers."""

from __future__ import annotations

import json
import logging
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator

import pytest
from test_compute import decode, rich_points, stream_tasks

from spark_backend.resident_protocol import HEADER, HELLO, PROOF, WELCOME, Link, WorkerAddress
from spark_backend.resident_slots import START_TIMEOUT, Greeting, WorkerDoor
from spark_backend.resident_worker import _join_agent
from spark_backend.worker_channel import NONCE_BYTES, agent_proof, new_nonce, proven, worker_proof


@pytest.fixture
def door() -> Iterator[tuple[WorkerDoor, list[Greeting]]]:
    """An open door, admitting in the background as the agent's does; what it greeted."""
    opened = WorkerDoor()
    opened.open("127.0.0.1")
    greetings: list[Greeting] = []
    admitting = threading.Thread(target=lambda: greetings.extend(opened.greetings()), daemon=True)
    admitting.start()
    yield opened, greetings
    opened.close()
    admitting.join(10)
    assert not admitting.is_alive()  # closing the door ends the admitting loop


def _way_in(address: WorkerAddress, way_in: str) -> WorkerAddress:
    return address._replace(path=None) if way_in == "port" else address


def _greeted(greetings: list[Greeting], count: int) -> list[tuple[int, int, int, str | None]]:
    deadline = time.monotonic() + 10
    while len(greetings) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return [(g.slot, g.launch, g.pid, g.clock) for g in greetings]


@pytest.mark.parametrize("way_in", ["port", "unix socket"])
def test_the_door_greets_only_a_worker_that_proves_the_token_and_proves_it_back(door, way_in, caplog):
    opened, greetings = door
    address = _way_in(opened.address, way_in)
    token = opened.token

    def hello(details: dict | bytes) -> tuple[Link, bytes, tuple[int, bytearray] | None]:
        link = Link(address.connect(), deadlines=True)
        said = details if isinstance(details, bytes) else json.dumps(details).encode()
        link.send(HELLO, said, deadline=time.monotonic() + 10)
        return link, said, link.receive(time.monotonic() + 10)

    def refused(details: dict | bytes) -> bool:
        link, _, answer = hello(details)
        link.close()
        return answer is None  # closed, unanswered

    nonce = new_nonce().hex()
    assert refused(b"not json") and refused(b"[]")
    assert refused({"slot": 0, "nonce": nonce})  # no launch or pid: not a worker
    assert refused({"slot": None, "launch": 1, "pid": 7, "nonce": nonce})
    assert refused({"slot": 1e400, "launch": 1, "pid": 7, "nonce": nonce})  # JSON's Infinity
    assert refused({"slot": 0, "launch": 1, "pid": 7})  # no nonce: nothing to prove the agent by
    assert refused({"slot": 0, "launch": 1, "pid": 7, "nonce": "ab"})
    with address.connect() as sock:
        sock.sendall(HEADER.pack(HELLO, 2**62))  # a length no hello has; nothing after it
        assert Link(sock, deadlines=True).receive(time.monotonic() + 10) is None

    # A hello of the right shape is answered by the agent's nonce and its proof of the token:
    # a worker launched by another agent (another token) can tell.
    worker_nonce = new_nonce()
    link, said, welcome = hello({"slot": 0, "launch": 1, "pid": 7, "nonce": worker_nonce.hex()})
    assert welcome is not None and welcome[0] == WELCOME
    agent_nonce, told = bytes(welcome[1][:NONCE_BYTES]), bytes(welcome[1][NONCE_BYTES:])
    assert proven(agent_proof(token, worker_nonce, agent_nonce), told)
    assert not proven(agent_proof("guessed", worker_nonce, agent_nonce), told)
    # ... but whoever does not hold the token cannot answer it.
    link.send(PROOF, worker_proof("guessed", agent_nonce, said), deadline=time.monotonic() + 10)
    assert link.receive(time.monotonic() + 10) is None
    link.close()
    assert "wrong token" in caplog.text

    # Still open: the agent's own worker joins after all of them, twice, by the real handshake.
    joined = [_join_agent(address, token, slot, 3) for slot in (1, 2)]
    assert all(isinstance(j, Link) for j in joined)
    greeted = _greeted(greetings, 2)
    assert [(slot, launch) for slot, launch, _, _ in greeted] == [(1, 3), (2, 3)]
    assert all(pid == os.getpid() for _, _, pid, _ in greeted)
    for j in joined:
        j.close()

    # A worker that is told the wrong token (not this agent's) gives up before proving anything.
    with pytest.raises(ConnectionError, match="did not prove it holds this task's token"):
        _join_agent(address, "guessed", 4, 3)
    last = _join_agent(address, token, 5, 3)  # the door admits one connection after another
    assert last is not None
    assert [slot for slot, _, _, _ in _greeted(greetings, 3)] == [1, 2, 5]
    last.close()


def test_a_recorded_handshake_proves_nothing_and_the_token_never_crosses(door):
    """On the unix socket, where what crosses is readable: a worker's messages, recorded and
    played again in order, are refused (the agent's nonce is new), and no message of the
    handshake holds the token."""
    opened, greetings = door
    token = opened.token
    crossed: list[bytes] = []

    def handshake(recorded: tuple[bytes, bytes] | None = None) -> tuple[Link, bytes, bytes]:
        """A worker's side, or ``recorded``'s hello and proof played again; the link and what
        the worker said."""
        link = Link(opened.address.connect(), deadlines=True)
        said = recorded[0] if recorded else json.dumps({"slot": 0, "launch": 1, "pid": 9, "nonce": new_nonce().hex()}).encode()
        link.send(HELLO, said, deadline=time.monotonic() + 10)
        welcome = link.receive(time.monotonic() + 10)
        assert welcome is not None and welcome[0] == WELCOME
        proof = recorded[1] if recorded else worker_proof(token, bytes(welcome[1][:NONCE_BYTES]), said)
        link.send(PROOF, proof, deadline=time.monotonic() + 10)
        crossed.extend([said, bytes(welcome[1]), proof])
        return link, said, proof

    admitted, *recorded = handshake()
    assert len(_greeted(greetings, 1)) == 1
    replayed, _, _ = handshake((recorded[0], recorded[1]))
    assert replayed.receive(time.monotonic() + 10) is None  # refused: closed
    assert len(greetings) == 1
    admitted.close()
    replayed.close()
    everything = b"".join(crossed)
    assert token.encode() not in everything and bytes.fromhex(token) not in everything


def test_the_port_speaks_only_tls_with_the_agents_own_certificate(door, caplog):
    opened, greetings = door
    address = opened.address._replace(path=None)
    # Plain TCP, as the channel was: not even a hello is read.
    with socket.create_connection((address.host, address.port), timeout=10) as plain:
        Link(plain).send(HELLO, json.dumps({"slot": 0, "launch": 1, "pid": 7, "nonce": new_nonce().hex()}).encode())
        assert _closed(plain)
    # A port whose certificate is not the pinned one: the worker sends it nothing.
    with pytest.raises(ConnectionError, match="certificate other than the agent's"):
        address._replace(fingerprint="0" * 64).connect()
    # A whole TLS session recorded on the wire and played again: refused (TLS's own nonces).
    recorded = bytearray()
    with socket.create_server(("127.0.0.1", 0)) as tap:
        relaying = threading.Thread(target=_relay_recording, args=(tap, (address.host, address.port), recorded), daemon=True)
        relaying.start()
        joined = _join_agent(address._replace(port=tap.getsockname()[1]), opened.token, 5, 1)
        assert joined is not None
        assert len(_greeted(greetings, 1)) == 1
        joined.close()
        relaying.join(10)
    assert len(recorded) > 0 and opened.token.encode() not in recorded
    with socket.create_connection((address.host, address.port), timeout=10) as replay:
        replay.sendall(recorded)
        try:
            while replay.recv(65536):
                pass  # whatever the door says, until it closes
        except ConnectionResetError:
            pass
    time.sleep(0.2)
    assert len(greetings) == 1
    assert caplog.text.count("refused a connection on the resident workers' port") >= 2


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed ``sock`` without a byte (reset, if it left ours unread)."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def _relay_recording(tap: socket.socket, to: tuple[str, int], recorded: bytearray) -> None:
    """One connection from ``tap`` relayed to ``to`` both ways; what the client sent recorded."""
    client, _ = tap.accept()
    server = socket.create_connection(to)

    def pump(src: socket.socket, dst: socket.socket, record: bool) -> None:
        try:
            while data := src.recv(65536):
                if record:
                    recorded.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    back = threading.Thread(target=pump, args=(server, client, False), daemon=True)
    back.start()
    pump(client, server, True)
    back.join(10)
    client.close()
    server.close()


def test_a_tls_link_carries_a_large_message_and_a_run_of_small_ones_both_ways(door):
    opened, greetings = door
    worker = _join_agent(opened.address._replace(path=None), opened.token, 0, 1)
    assert worker is not None
    (greeting,) = _greeted_links(greetings, 1)
    agent = greeting.link
    parts = [os.urandom(size) for size in (3, 20_000, 1, 5_000_000, 16_384, 16_383, 7)]
    small = [os.urandom(size % 300) for size in range(200)]
    for sender, receiver, deadline in ((agent, worker, None), (worker, agent, 30.0)):
        sending = threading.Thread(target=lambda s=sender: [s.send(9, *parts), *(s.send(8, blob) for blob in small)], daemon=True)
        sending.start()
        until = None if deadline is None else time.monotonic() + deadline
        assert receiver.receive(until) == (9, bytearray(b"".join(parts)))
        assert [receiver.receive(until) for _ in small] == [(8, bytearray(blob)) for blob in small]
        sending.join(30)
    worker.close()


def _greeted_links(greetings: list[Greeting], count: int) -> list[Greeting]:
    _greeted(greetings, count)
    assert len(greetings) == count
    return greetings


def test_the_doors_private_directory_holds_only_its_socket(door):
    """The certificate's key is in memory only: the 0700 directory holds the socket alone."""
    opened, _ = door
    directory = os.path.dirname(opened.address.path)
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert os.listdir(directory) == ["door"]


def test_a_door_whose_unix_socket_cannot_be_made_opens_its_port_alone(tmp_path, monkeypatch):
    """A socket's path may take 107 bytes: under a longer $TMPDIR the workers take the port."""
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    closing = WorkerDoor()
    closing.open("127.0.0.1")
    directory = closing._local_dir
    try:
        assert closing.address is not None and closing.address.path is None
        with socket.create_connection((closing.address.host, closing.address.port), timeout=10):
            pass
    finally:
        closing.close()
    assert directory is not None and not os.path.exists(directory)  # nothing left behind


@pytest.mark.spark
def test_spark_workers_over_the_tls_port_compute_what_they_compute_over_the_unix_socket(spark_engine, tmp_path, monkeypatch, caplog):
    from spark_backend.resident import ResidentWorkers
    from udf_agent.compute.contract import Job
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.library.builtins import moving_avg

    deep = tmp_path / ("d" * 100)  # no unix socket: the workers take the port
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    session = spark_engine.session
    resident = ResidentWorkers(session, 1, session.agent_host(), batch_timeout=60, first_worker_wait=START_TIMEOUT)
    caplog.set_level(logging.WARNING)
    resident.start()
    try:
        assert resident.wait_for_workers(1, START_TIMEOUT)
        job = Job(moving_avg, {"field": "i", "size": 3, "as": "avg"})
        for points in (8, 3_000):
            tasks = stream_tasks(rich_points(points))
            expected = [decode(o) for o in LocalEngine().run(job, tasks).to_pandas()["output"]]
            assert [decode(o) for o in resident.run(job, tasks).to_pandas()["output"]] == expected
        assert resident.launches == 1 and resident.worker_losses == 0
    finally:
        resident.stop()
    assert "refused a connection" not in caplog.text
