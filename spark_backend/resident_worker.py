"""The executor side of the resident workers: the body of a long-running Spark task.

Runs inside Spark's Python worker, so it imports the compute code and nothing of the agent's
Spark session code.
"""

from __future__ import annotations

import hmac
import json
import os
import pickle
import socket
from collections.abc import Iterator

import pandas as pd

from spark_backend.resident_protocol import FAILURE, HELLO, JOB, JOB_KEY_BYTES, RESULT, WELCOME, JobCache, describe_failure, receive_message, send_message
from udf_agent.compute.contract import Job
from udf_agent.compute.run import compute_tasks
from udf_agent.wire.columns import ipc_to_table, table_to_ipc_buffer


def serve_slot(address: tuple[str, int], token: str, frames: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The body of a resident task: computes micro-batches for the agent at ``address``."""
    from udf_agent.wire import pointcodec

    slot = next((int(v) for frame in frames for v in frame["id"]), -1)
    pointcodec.warm_up()  # numba's compiled decoder, before the first micro-batch
    served = 0
    sock = _join_agent(address, token, slot)
    if sock is None:
        yield pd.DataFrame({"slot": [slot], "served": [served]})
        return
    with sock:
        jobs: JobCache[Job] = JobCache()
        while (message := receive_message(sock)) is not None:
            kind, payload = message
            key, body = bytes(payload[:JOB_KEY_BYTES]), memoryview(payload)[JOB_KEY_BYTES:]
            if kind == JOB:
                # Sent by the agent that launched this task, over the channel the token
                # authenticated: the same trust as Spark's own pickled UDFs.
                jobs.add(key, pickle.loads(body))
                continue
            try:
                reply = table_to_ipc_buffer(compute_tasks(jobs.use(key), ipc_to_table(body)))
            except Exception as exc:
                send_message(sock, FAILURE, describe_failure(exc).encode())
            else:
                send_message(sock, RESULT, reply)
            served += 1
    yield pd.DataFrame({"slot": [slot], "served": [served]})


def _join_agent(address: tuple[str, int], token: str, slot: int) -> socket.socket | None:
    """The connection to the agent, past its welcome; None if the agent let this task go
    before it got a core (its listener closed: stopped, released when idle, relaunched)."""
    try:
        sock = socket.create_connection(address)
    except ConnectionRefusedError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_message(sock, HELLO, json.dumps({"token": token, "slot": slot, "pid": os.getpid()}).encode())
        welcome = receive_message(sock)
    except (ConnectionResetError, BrokenPipeError):  # in the backlog of a listener that closed
        welcome = None
    if welcome is None:
        sock.close()
        return None
    if welcome[0] != WELCOME or not hmac.compare_digest(welcome[1], token.encode()):
        sock.close()
        raise ConnectionError("the agent did not answer with this task's token")
    return sock
