"""Real Spark servers on 127.0.0.1, started from the installed pyspark: a standalone cluster
(a master and workers, ``spark-class``) and a Spark Connect server (``spark-submit`` of its
server class). Each runs in its own process group with its log in a work directory, and is
killed on the way out, also when the caller fails. Used by the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

from spark_backend.class_archive import java_option
from spark_backend.java import find_java


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# The Python environment whose pyspark runs the Spark Connect server, when not this one's: a
# Spark 3.5 client is tested against a 4.x server (pip's pyspark 3.5 has no Connect server; its
# jar comes from Maven Central). Its Python runs the server's executors' workers too.
CONNECT_SERVER_PYTHON = "UDF_AGENT_CONNECT_SERVER_PYTHON"


def _spark_home(python: str) -> str:
    if python == sys.executable:
        import pyspark

        return os.path.dirname(pyspark.__file__)
    found = subprocess.run([python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"], capture_output=True, text=True, check=True)
    return found.stdout.strip()


class Daemons:
    """Spark server processes, each in its own process group; ``stop`` kills every one. They
    run this environment's pyspark, or ``python``'s."""

    def __init__(self, work: Path, python: str = sys.executable):
        self.spark_home = _spark_home(python)
        self.work = work
        work.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "SPARK_HOME": self.spark_home, "SPARK_LOG_DIR": str(work), "PYSPARK_PYTHON": python}
        # Their JVMs run from the same jars as the agent's: they map its class archive, if
        # built (udf-agent prepare), as a host's own daemons can (docs/deployment.md).
        self.java_options = java_option(find_java()) if python == sys.executable else ""
        if self.java_options:
            self.env["SPARK_DAEMON_JAVA_OPTS"] = self.java_options
        self.started: list[subprocess.Popen[bytes]] = []
        self._named: dict[str, tuple[subprocess.Popen[bytes], tuple[str, ...]]] = {}
        self._placed: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {}  # each daemon's prefix and env (``start``)

    def start(self, name: str, program: str, *args: str, prefix: Sequence[str] = (), env: Mapping[str, str] | None = None) -> Path:
        """Starts ``program`` of Spark's bin/ with ``args``; its log's path. ``prefix`` goes
        before the command (say ``ip netns exec NAME``, which execs it: the process is still
        the daemon's), ``env`` over this object's environment."""
        log_path = self.work / f"{name}.log"
        with open(log_path, "ab") as log:  # a restarted daemon's log follows its first life's
            process = subprocess.Popen(
                [*prefix, os.path.join(self.spark_home, "bin", program), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env={**self.env, **(env or {})}, cwd=str(self.work), start_new_session=True,
            )
        self.started.append(process)
        self._named[name] = (process, (program, *args))
        self._placed[name] = (tuple(prefix), dict(env or {}))
        return log_path

    def restart(self, name: str) -> Path:
        """Kills the daemon ``name`` (SIGKILL to its process group, as a crash would) and
        starts it again with the same command line; its log path."""
        process, command = self._named[name]
        _kill_group(process, signal.SIGKILL)
        prefix, env = self._placed.get(name, ((), {}))
        return self.start(name, *command, prefix=prefix, env=env)

    def wait_for(self, what: str, check: Callable[[], bool], log_path: Path, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} within {timeout:g} s\n{log_path.read_text(errors='replace')[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        for daemon in self.started:
            if not _kill_group(daemon, signal.SIGTERM):
                _kill_group(daemon, signal.SIGKILL)


def _kill_group(process: subprocess.Popen[bytes], signum: int) -> bool:
    """Whether ``process`` is gone within 10 s of ``signum`` sent to its process group."""
    try:
        os.killpg(process.pid, signum)
        process.wait(10)
        return True
    except ProcessLookupError:
        return True
    except subprocess.TimeoutExpired:
        return False


@contextlib.contextmanager
def standalone_cluster(work: Path, workers: int = 1, cores: int = 2, memory: str = "1g", recovery: bool = False) -> Iterator[tuple[str, Daemons]]:
    """The master's URL once ``workers`` workers have registered with it. With ``recovery`` the
    master keeps its applications and workers on disk (Spark's FILESYSTEM recovery mode), so
    that, restarted (``daemons.restart("master")``), it takes them back."""
    daemons = Daemons(work)
    if recovery:
        daemons.env["SPARK_MASTER_OPTS"] = f"-Dspark.deploy.recoveryMode=FILESYSTEM -Dspark.deploy.recoveryDirectory={work / 'recovery'}"
    port = free_port()
    url = f"spark://127.0.0.1:{port}"
    try:
        master_log = daemons.start("master", "spark-class", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port()))
        daemons.wait_for("the master did not listen", lambda: accepts(port), master_log)
        for index in range(workers):
            worker_log = daemons.start(
                f"worker{index}", "spark-class", "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--cores", str(cores),
                "--memory", memory, "--webui-port", str(free_port()), "--work-dir", str(work / f"work{index}"),
            )
            daemons.wait_for("a worker did not register", lambda log=worker_log: "Successfully registered with master" in log.read_text(errors="replace"), worker_log)
        yield url, daemons
    finally:
        daemons.stop()


@contextlib.contextmanager
def connect_server(work: Path, master: str = "local[2]", conf: dict[str, str] | None = None) -> Iterator[tuple[str, Daemons]]:
    """The URL of a Spark Connect server (``master`` behind it, ``conf`` its own settings)
    once it listens, run by the pyspark of $UDF_AGENT_CONNECT_SERVER_PYTHON if set, else this
    environment's. ``restart_connect_server`` kills it and starts it again on its port."""
    daemons = Daemons(work, os.environ.get(CONNECT_SERVER_PYTHON) or sys.executable)
    port = free_port()
    settings = {"spark.connect.grpc.binding.port": str(port), "spark.connect.grpc.binding.address": "127.0.0.1", "spark.ui.enabled": "false", **(conf or {})}
    try:
        java_options = ("--driver-java-options", daemons.java_options) if daemons.java_options else ()
        log_path = daemons.start(
            "connect", "spark-submit", *java_options, "--class", "org.apache.spark.sql.connect.service.SparkConnectServer", "--master", master,
            *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")), "spark-internal",
        )
        daemons.wait_for("the Spark Connect server did not listen", lambda: accepts(port), log_path)
        yield f"sc://127.0.0.1:{port}", daemons
    finally:
        daemons.stop()


def restart_connect_server(url: str, daemons: Daemons) -> None:
    """Kills the Spark Connect server ``connect_server`` started (its executors and their
    Python workers with it) and starts it again on the same port; returns once it listens."""
    port = int(url.rsplit(":", 1)[1])
    log_path = daemons.restart("connect")
    daemons.wait_for("the restarted Spark Connect server did not listen", lambda: accepts(port), log_path)
