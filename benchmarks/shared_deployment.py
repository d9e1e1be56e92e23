"""The default deployment in a benchmark: tasks that relay to a shared per-host server, kept in
a private directory of the benchmark's own so that no server outside it is joined or left behind."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

from benchmarks.deployment import wait_for_log
from benchmarks.driver import AgentCommand, AgentProcess, descendants
from benchmarks.workload import Workload
from udf_agent.serve.shared import shared_server_pids

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@contextmanager
def shared_directory(prefix: str) -> Iterator[str]:
    """A private shared-server directory; every server in it is killed on the way out."""
    directory = tempfile.mkdtemp(prefix=prefix)
    os.chmod(directory, 0o700)
    try:
        yield directory
    finally:
        kill_shared_servers(directory)
        shutil.rmtree(directory, ignore_errors=True)


def shared_env(directory: str) -> dict[str, str]:
    return {"UDF_AGENT_SHARED_DIR": directory, "UDF_AGENT_OWN_SPARK": "0"}


def kill_shared_servers(directory: str) -> None:
    for pid in shared_server_pids(directory):
        for member in [pid, *descendants(pid)]:
            try:
                os.kill(member, 9)
            except ProcessLookupError:
                pass


def server_logs(directory: str) -> str:
    return "".join(open(os.path.join(directory, name), errors="replace").read() for name in os.listdir(directory) if name.endswith(".log"))


def warm_shared_server(udf: str, directory: str, init: bytes) -> None:
    """A first task on the shared server: it starts the server and Spark, and computes; then
    the server's log says its compute engine is ready (the first micro-batches were computed
    in the server while Spark started)."""
    warmup = Workload(points=2_000, groups=10)
    command = AgentCommand(f"warm-up {udf}", [sys.executable, "-m", "udf_agent", "run", udf], cwd=REPO, env=shared_env(directory))
    deadline = time.monotonic() + 300
    agent = AgentProcess(command, deadline)
    try:
        agent.init(init, deadline)
        with open(warmup.path(), "rb") as source:
            agent.write(source.read())
        if not agent.wait_for(lambda: agent.tally.points >= warmup.points, deadline):
            raise RuntimeError(f"the warm-up task did not compute: {agent.failure('no output')}")
        agent.close_stdin()
        agent.process.wait(60)
    finally:
        agent.kill()
    wait_for_log(lambda: server_logs(directory))
