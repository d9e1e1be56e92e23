"""``udf-agent status``: the live tasks of a server (``serve``'s socket, or this user's shared
Spark servers), asked over the server's own socket (``socket_server.STATUS_REQUEST``)."""

from __future__ import annotations

import glob
import json
import os
import socket
import time
from typing import Any

from udf_agent.serve.socket_server import STATUS_REQUEST

# The answer is a few hundred bytes a task; anything past this is not one.
MAX_ANSWER = 64 * 1024 * 1024


class StatusError(Exception):
    """The server cannot be asked; the message says why."""


def ask(socket_path: str, timeout: float) -> dict[str, Any]:
    """The status of the server listening on ``socket_path``."""
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        try:
            sock.connect(socket_path)
        except FileNotFoundError:
            raise StatusError(f"no socket at {socket_path}") from None
        except ConnectionRefusedError:
            raise StatusError(f"nothing listens on {socket_path} (a server that stopped without removing it?)") from None
        except OSError as exc:
            raise StatusError(f"cannot connect to {socket_path}: {exc.strerror or exc}") from None
        answer = bytearray()
        try:
            sock.sendall(STATUS_REQUEST)
            while len(answer) <= MAX_ANSWER:
                sock.settimeout(max(0.001, deadline - time.monotonic()))
                data = sock.recv(1 << 16)
                if not data:
                    break
                answer += data
        except TimeoutError:
            raise StatusError(f"{socket_path} did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise StatusError(f"{socket_path} closed the connection: {exc.strerror or exc}") from None
    finally:
        sock.close()
    try:
        status: dict[str, Any] = json.loads(answer)
    except ValueError:
        raise StatusError(f"{socket_path} is not a udf-agent server of this version (it answered {bytes(answer[:60])!r})") from None
    return status


def shared_sockets(directory: str) -> list[str]:
    """The sockets of the shared servers in ``directory``."""
    return sorted(glob.glob(os.path.join(directory, "*.sock")))


def table(statuses: list[dict[str, Any]]) -> str:
    """Each server's line, then a row per live task."""
    out: list[str] = []
    for status in statuses:
        spark = status.get("spark", "")
        workers = f", {status['resident_workers']} resident worker(s)" if "resident_workers" in status else ""
        if "resident_slots" in status:
            cores = f", {status['spark_cores']} core(s) of executors" if "spark_cores" in status else ""
            workers += f" of {status['resident_slots']} slot(s){cores} ({status['resident_slots_why']})"
        tasks = status.get("tasks", [])
        out.append(
            f"{status.get('kind', 'server')} pid {status['pid']} on {status['socket']}, up {_duration(status['uptime_s'])}, "
            f"Spark {spark}{workers}: {len(tasks)} task(s)"
        )
        if not tasks:
            continue
        rows = [("TASK", "NODE", "UDF", "UPTIME", "POINTS IN", "POINTS OUT", "IN/S", "GROUPS", "SLOTS", "KEEPING UP", "MICRO-BATCHES RUN", "LAST ERROR")]
        for task in tasks:
            rows.append(
                (
                    task["taskID"] or "-",
                    task["nodeID"] or "-",
                    task["udf"] or "-",
                    _duration(task["uptime_s"]),
                    f"{task['points_in']:,}",
                    f"{task['points_out']:,}",
                    f"{task['rate_in_per_s']:,.0f}",
                    f"{task['groups']:,}",
                    str(task.get("slots_held", 0)),
                    f"falling behind ({task.get('input_lag_s', 0):.1f} s)" if task.get("falling_behind") else "yes",
                    task["computed"] or "-",
                    _one_line(task["last_error"]) if task["last_error"] else "-",
                )
            )
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        out += ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
    return "\n".join(out)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _one_line(text: str, width: int = 80) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first if len(first) <= width else first[: width - 1] + "…"
