"""The executor side of the resident workers: the body of a long-running Spark task.

Runs inside Spark's Python worker, so it imports the compute code and nothing of the agent's
Spark session code.
"""

from __future__ import annotations

import json
import os
import pickle
import ssl
import threading
import time
from collections.abc import Iterator

import pandas as pd

from spark_backend.resident_protocol import (
    FAILURE,
    HANDLER,
    HELLO,
    JOB,
    JOB_KEY_BYTES,
    OVER_MEMORY,
    PROOF,
    RESULT,
    STREAM_RESULT,
    STREAM_TASKS,
    WELCOME,
    JobCache,
    Link,
    WorkerAddress,
    clock_id,
    describe_failure,
    handler_outcome_parts,
    read_handler_call,
    stream_result,
)
from spark_backend.worker_channel import NONCE_BYTES, agent_proof, new_nonce, proven, worker_proof
from udf_agent.collector import freeze_startup_objects
from udf_agent.compute import packed
from udf_agent.compute.contract import TASK_SCHEMA, Job
from udf_agent.compute.handlers import HandlerHosts
from udf_agent.compute.packed import StreamTasks
from udf_agent.compute.run import compute_stream, compute_tasks
from udf_agent.wire.columns import message_table, table_message

# While a part computes, the worker's resident memory is looked at this often.
MEMORY_CHECK_INTERVAL = 0.05
# The exit status of a worker that passed its memory limit.
OVER_MEMORY_EXIT = 70


def serve_slot(address: WorkerAddress, token: str, slot: int, launch: int, memory_limit: int | None, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The body of a resident task: computes micro-batches for the agent at ``address``
    as slot ``slot`` of its launch ``launch``, within ``memory_limit`` bytes if given."""
    from udf_agent.wire import pointcodec

    for _ in frames:  # the one row Spark gives the task says nothing the arguments don't
        pass
    pointcodec.warm_up()  # numba's compiled decoder, before the first micro-batch
    packed.warm_up()  # and the tasks' unpacking
    # A full collection would walk all of pandas, pyarrow, numba and PySpark: ~70 ms every few
    # thousand micro-batches, a stall of every point waiting on this worker (udf_agent.collector).
    freeze_startup_objects("resident worker ready")
    served = 0
    link = _join_agent(address, token, slot, launch)
    if link is None:
        yield pd.DataFrame({"slot": [slot], "served": [served]})
        return
    with link.sock:
        sending = threading.Lock()
        guard = _MemoryGuard(memory_limit, link, sending) if memory_limit else None
        jobs: JobCache[Job] = JobCache()
        handlers = HandlerHosts()  # the Kapacitor Handler scripts' tasks that live here
        while (message := link.receive()) is not None:
            took = time.monotonic_ns()
            kind, payload = message
            if kind == HANDLER:
                _call_handler(handlers, payload, link, sending, guard)
                served += 1
                continue
            key, body = bytes(payload[:JOB_KEY_BYTES]), memoryview(payload)[JOB_KEY_BYTES:]
            if kind == JOB:
                # Sent by the agent that launched this task, over the channel the token
                # authenticated: the same trust as Spark's own pickled UDFs.
                jobs.add(key, pickle.loads(body))
                continue
            if guard is not None:
                guard.computing.set()
            try:
                job = jobs.use(key)
                if kind == STREAM_TASKS:
                    answer, content = STREAM_RESULT, compute_stream(job, StreamTasks.unpack(body)).pack()
                else:
                    answer, content = RESULT, [table_message(compute_tasks(job, message_table(body, TASK_SCHEMA)))]
            except Exception as exc:
                answer, content = FAILURE, [describe_failure(exc).encode()]
            with sending:
                if guard is not None:
                    guard.computing.clear()
                if answer == STREAM_RESULT:  # the agent paces the slices it chains by these times
                    content = stream_result(took, time.monotonic_ns(), content)
                link.send(answer, *content)
            if not served:  # what the first micro-batch imported and built lives as long
                freeze_startup_objects("resident worker's first micro-batch")
            served += 1
    yield pd.DataFrame({"slot": [slot], "served": [served]})


def _call_handler(handlers: HandlerHosts, payload: bytearray, link: Link, sending: threading.Lock, guard: _MemoryGuard | None) -> None:
    if guard is not None:
        guard.computing.set()
    try:
        call, rebuild = read_handler_call(payload)
        answer, parts = RESULT, handler_outcome_parts(handlers.call(call, rebuild))
    except Exception as exc:
        answer, parts = FAILURE, [describe_failure(exc).encode()]
    with sending:
        if guard is not None:
            guard.computing.clear()
        link.send(answer, *parts)


class _MemoryGuard:
    """Ends the worker, saying so to the agent, once its resident memory passes the limit
    while a part computes: the UDF's micro-batch fails with a clear error instead of the
    host's out-of-memory killer picking the JVM or the server. Asleep between parts."""

    def __init__(self, limit: int, link: Link, sending: threading.Lock):
        self.limit = limit
        self.computing = threading.Event()
        self._link = link
        self._sending = sending
        self._page = os.sysconf("SC_PAGE_SIZE")
        threading.Thread(target=self._watch, name="udf-agent-memory-guard", daemon=True).start()

    def _watch(self) -> None:
        while True:
            self.computing.wait()
            used = self._resident_bytes()
            if used > self.limit:
                self._give_up(used)
            time.sleep(MEMORY_CHECK_INTERVAL)

    def _resident_bytes(self) -> int:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * self._page

    def _give_up(self, used: int) -> None:
        with self._sending:
            if self.computing.is_set():  # not if the part's answer went out meanwhile
                message = f"its resident Python worker (pid {os.getpid()}) used {used / 2**20:.0f} MiB, past --worker-memory {self.limit / 2**20:.0f} MiB: the micro-batch was abandoned and the worker replaced"
                try:
                    self._link.send(OVER_MEMORY, message.encode())
                finally:
                    os._exit(OVER_MEMORY_EXIT)


def _join_agent(address: WorkerAddress, token: str, slot: int, launch: int) -> Link | None:
    """The connection to the agent, once each proved to the other that it holds the token
    (``worker_channel``); None if the agent let this task go before it got a core (its listener
    closed: stopped, released when idle, relaunched)."""
    try:
        sock = address.connect()
    except ConnectionRefusedError:
        return None
    except (ConnectionResetError, ssl.SSLEOFError):  # in the backlog of a listener that closed
        return None
    nonce = new_nonce()
    hello = json.dumps({"slot": slot, "launch": launch, "pid": os.getpid(), "clock": clock_id(), "nonce": nonce.hex()}).encode()
    try:
        link = Link(sock)
        link.send(HELLO, hello)
        welcome = link.receive()
    except (ConnectionResetError, BrokenPipeError):  # in the backlog of a listener that closed
        welcome = None
    if welcome is None:
        sock.close()
        return None
    kind, challenge = welcome
    agent_nonce = bytes(challenge[:NONCE_BYTES])
    if kind != WELCOME or not proven(agent_proof(token, nonce, agent_nonce), challenge[NONCE_BYTES:]):
        sock.close()
        raise ConnectionError("the agent did not prove it holds this task's token")
    link.send(PROOF, worker_proof(token, agent_nonce, hello))
    return link
