"""The round trip of a small message between two processes, over loopback TCP and over a unix
socket: what the link between the agent and a resident worker on its host costs per micro-batch
(``spark_backend/resident_slots.WorkerDoor``).

    python -m benchmarks.socket_round_trip [--messages 3000] [--size 600] [--repeat 3]

Prints, per transport, the median of the runs: the wall time of one round trip, the sender's
time in its send call, and its CPU per round trip (the echoing process's is alike).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import tempfile
import time


def _echo(sock: socket.socket, size: int) -> None:
    """Answers each whole message of ``size`` bytes with as many (as a worker answers a part)."""
    buffer = bytearray(size)
    while True:
        received = 0
        while received < size:
            count = sock.recv_into(memoryview(buffer)[received:])
            if count == 0:
                return
            received += count
        sock.sendall(buffer)


def _pair(transport: str, directory: str, size: int) -> tuple[socket.socket, int]:
    """A connected socket to a forked echoing process, and that process's pid."""
    if transport == "tcp":
        listener = socket.create_server(("127.0.0.1", 0))
        address: object = listener.getsockname()
        family = socket.AF_INET
    else:
        address = os.path.join(directory, "round-trip")
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(address)
        listener.listen()
        family = socket.AF_UNIX
    pid = os.fork()
    if pid == 0:
        listener.close()
        with socket.socket(family) as peer:
            peer.connect(address)
            if family == socket.AF_INET:
                peer.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _echo(peer, size)
        os._exit(0)
    sock, _ = listener.accept()
    listener.close()
    if family == socket.AF_INET:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock, pid


def measure(transport: str, messages: int, size: int) -> tuple[float, float, float]:
    """(round trip, send call, sender's CPU per round trip), in microseconds."""
    with tempfile.TemporaryDirectory() as directory:
        sock, pid = _pair(transport, directory, size)
        message, buffer = b"x" * size, bytearray(size)
        sending = 0.0
        started, cpu = time.perf_counter(), time.thread_time()
        for _ in range(messages):
            before = time.perf_counter()
            sock.sendall(message)
            sending += time.perf_counter() - before
            received = 0
            while received < size:
                received += sock.recv_into(memoryview(buffer)[received:])
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
        sock.close()
        os.waitpid(pid, 0)
    return wall / messages * 1e6, sending / messages * 1e6, cpu / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--size", type=int, default=600, help="bytes each way (a trickle's micro-batch is a few hundred)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[tuple[float, float, float]]] = {"tcp": [], "unix": []}
    for _ in range(args.repeat):
        for transport, results in runs.items():  # alternating, so both see the same machine
            results.append(measure(transport, args.messages, args.size))
    print(f"{args.messages:,} round trips of {args.size} bytes, median of {args.repeat} runs, {os.cpu_count()} CPUs")
    print("| transport | round trip µs | send call µs | sender's CPU µs |")
    print("| --- | --- | --- | --- |")
    medians = {transport: [statistics.median(run[i] for run in results) for i in range(3)] for transport, results in runs.items()}
    for transport, (wall, send, cpu) in medians.items():
        print(f"| {transport} | {wall:.0f} | {send:.0f} | {cpu:.0f} |")
    print(f"unix / tcp round trip: {medians['unix'][0] / medians['tcp'][0]:.2f}")


if __name__ == "__main__":
    main()
