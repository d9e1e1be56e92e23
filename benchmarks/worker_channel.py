"""What TLS costs the resident workers' channel: the agent's door and a worker's end of it
(``spark_backend.resident_slots.WorkerDoor``, ``resident_worker._join_agent``), over the unix
socket a worker on the agent's host takes, and over the TLS port a worker on another host
takes (here on loopback, so the network costs nothing and TLS is all that differs).

    python -m benchmarks.worker_channel [--repeat 5]

Two exchanges, each as a micro-batch crosses: a trickle's slice (one message of ~600 bytes
each way, round trip) and a burst's (4 MiB out, 1 MiB back). For each, the median of the
repeats: wall time a round trip, and the CPU both ends spend (this process's CPU: both ends
run in it, each on its own thread); TLS's ratio to the unix socket's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

from spark_backend.resident_protocol import Link
from spark_backend.resident_slots import WorkerDoor
from spark_backend.resident_worker import _join_agent

EXCHANGES = {"trickle slice (600 B each way)": (600, 600, 2_000), "burst slice (4 MiB out, 1 MiB back)": (4 << 20, 1 << 20, 40)}


def _linked(door: WorkerDoor, way_in: str) -> tuple[Link, Link]:
    """The agent's end and a worker's end of one admitted connection."""
    assert door.address is not None
    address = door.address._replace(path=None) if way_in == "TLS port" else door.address
    greeted = []
    admitting = threading.Thread(target=lambda: greeted.append(next(door.greetings())), daemon=True)
    admitting.start()
    worker = _join_agent(address, door.token, 0, 1)
    admitting.join(10)
    assert worker is not None and greeted
    return greeted[0].link, worker


def _measure(agent: Link, worker: Link, out: int, back: int, rounds: int) -> tuple[float, float]:
    """Seconds and CPU seconds a round trip: ``out`` bytes to the worker, ``back`` bytes back."""
    payload, answer = os.urandom(out), os.urandom(back)

    def echo() -> None:
        for _ in range(rounds):
            worker.receive()
            worker.send(2, answer)

    echoing = threading.Thread(target=echo, daemon=True)
    started, cpu = time.perf_counter(), time.process_time()
    echoing.start()
    for _ in range(rounds):
        agent.send(1, payload, deadline=time.monotonic() + 60)
        agent.receive(time.monotonic() + 60)
    echoing.join()
    return (time.perf_counter() - started) / rounds, (time.process_time() - cpu) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    door = WorkerDoor()
    door.open("127.0.0.1")
    try:
        links = {way_in: _linked(door, way_in) for way_in in ("unix socket", "TLS port")}
        print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs; medians of {args.repeat}")
        print("| exchange | way in | round trip | CPU a round trip | TLS / unix (wall, CPU) |")
        print("| --- | --- | --- | --- | --- |")
        for name, (out, back, rounds) in EXCHANGES.items():
            figures = {}
            for way_in, (agent, worker) in links.items():
                runs = [_measure(agent, worker, out, back, rounds) for _ in range(args.repeat)]
                figures[way_in] = (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
            unix_wall, unix_cpu = figures["unix socket"]
            for way_in, (wall, cpu) in figures.items():
                ratio = f"{wall / unix_wall:.2f}x, {cpu / unix_cpu:.2f}x" if way_in == "TLS port" else ""
                print(f"| {name} | {way_in} | {wall * 1e6:,.0f} µs | {cpu * 1e6:,.0f} µs | {ratio} |")
    finally:
        door.close()


if __name__ == "__main__":
    main()
