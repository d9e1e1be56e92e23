"""The one boundary between the engine and Spark: a session, classic or Spark Connect.

``open_session`` picks the implementation from the URL: ``sc://host:port`` (``--remote``,
or ``SPARK_REMOTE``) is a Spark Connect server, reached by PySpark's light client (no
JVM in the agent); anything else is a ``--master`` for a classic session with its JVM in
this process. The engine and the resident workers use only what ``SparkSession`` declares:
the DataFrame API both sessions share, and the few things that differ.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import time
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from spark_backend.settings import SparkSettings, agent_conf
from udf_agent.compute.engine import EngineStartError
from udf_agent.errors import first_line
from udf_agent.runtime.logs import foreign_line, log_format

if TYPE_CHECKING:
    from pyspark.sql import SparkSession as ClassicSparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSparkSession


log = logging.getLogger(__name__)

CONNECT_DEFAULT_PORT = 15002
STANDALONE_DEFAULT_PORT = 7077
# How long a cluster's master or a Connect server may take to accept a TCP connection
# before Spark is not even tried: Spark itself retries an unreachable master for a minute.
CONNECT_TIMEOUT = 5.0
# Resident tasks on a Spark Connect server: its cores are shared with every other client,
# and a task cannot know how many there are, so it takes one (--resident-slots for more).
CONNECT_SLOTS = 1
# A Connect server closes a session after this long without a request, unless its
# spark.connect.session.manager.defaultSessionTimeout says otherwise (Spark's default).
CONNECT_SESSION_TIMEOUT = 3600.0
# A Connect session is kept alive (a request every quarter of the server's session timeout)
# until this long after its last micro-batch; past it an idle host sends nothing, and the next
# micro-batch replaces a session the server closed meanwhile (SparkEngine.run).
KEEPALIVE_AFTER_USE = 3600.0
# Retries of a request to an unreachable Connect server: PySpark's backoff (50 ms, then x4)
# for about 4 s instead of its default 10 min, so that the engine decides how long a
# micro-batch waits for a server (--batch-timeout), checking between tries.
CONNECT_RETRIES = 4


class SparkStartError(EngineStartError):
    """Spark could not be started or reached; the message names the URL and the cause."""


class SparkSessionLost(SparkStartError):
    """A Spark Connect session that could not be replaced in time; the message says what was tried."""


class SparkSession(Protocol):
    """A started session, classic or Connect."""

    url: str
    dataframes: ClassicSparkSession | ConnectSparkSession  # the DataFrame API, the same in both

    def cores(self) -> int:
        """The cores this application has (or may take) for Python tasks: how many resident
        workers to launch, so that they never hold cores it was not given."""

    def agent_host(self) -> str:
        """The address at which Spark's executors reach this agent."""

    def tag_jobs(self, tag: str) -> None:
        """Jobs this thread starts from now on can be cancelled together as ``tag``."""

    def untag_jobs(self, tag: str) -> None:
        """Jobs this thread starts from now on are no longer tagged ``tag``."""

    def cancel(self, tag: str) -> None:
        """Cancels the running jobs tagged ``tag``, interrupting their Python workers."""

    def jvm_exit_code(self) -> int | None:
        """The exit code of this process's JVM if it has died; None while it runs (or there is none)."""

    def used(self) -> None:
        """A micro-batch is about to run on the session (a Connect session stays alive for
        ``KEEPALIVE_AFTER_USE`` after the last one)."""

    def lost(self) -> str | None:
        """Why the session can no longer be used (a Connect server closed it or restarted, or
        cannot be reached), or None if it answers. Asks the server; a classic session's JVM is
        watched by ``jvm_exit_code`` instead."""

    def stop(self) -> None: ...


def open_session(settings: SparkSettings) -> SparkSession:
    """A session for ``settings.remote`` (Spark Connect) or else ``settings.master``."""
    if settings.remote:
        return ConnectSession.open(settings)
    return ClassicSession.open(settings)


def check_reachable(url: str) -> None:
    """A ``spark://host:port[,host:port]`` master (standby masters too) or an ``sc://``
    server must accept a TCP connection (on one of its addresses); SparkStartError names
    the URL and why not. Other masters (local, yarn, k8s) are left to Spark."""
    if url.startswith("spark://"):
        addresses, default_port = url[len("spark://") :].split(","), STANDALONE_DEFAULT_PORT
    elif url.startswith("sc://"):
        addresses, default_port = [url[len("sc://") :].partition("/")[0].partition(";")[0]], CONNECT_DEFAULT_PORT
    else:
        return
    causes = []
    for address in addresses:
        host, port = _host_port(url, address, default_port)
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
            return
        except OSError as exc:
            causes.append(f"{host}:{port}: {exc.strerror or exc}")
    kind = "Spark Connect server" if url.startswith("sc://") else "Spark master"
    raise SparkStartError(f"cannot reach the {kind} {url} ({'; '.join(causes)})")


def _host_port(url: str, address: str, default_port: int) -> tuple[str, int]:
    try:
        parts = urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port or default_port
    except ValueError as exc:
        raise SparkStartError(f"cannot use {url}: {exc}") from None
    if not host:
        raise SparkStartError(f"cannot use {url}: {address!r} names no host")
    return host, port


def _address_towards(host: str, port: int) -> str:
    """This machine's address on the route to ``host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((host, port))
            return str(probe.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class ClassicSession:
    """A SparkSession with its JVM in this process (embedded, or the driver of a cluster)."""

    def __init__(self, url: str, session: ClassicSparkSession):
        self.url = url
        self.dataframes = session

    @classmethod
    def open(cls, settings: SparkSettings) -> ClassicSession:
        from pyspark.sql import SparkSession as Builder

        from spark_backend.java import JavaError, check_java

        try:
            java, version = check_java()
        except JavaError as exc:
            raise SparkStartError(str(exc)) from None
        check_reachable(settings.master)
        log.info("starting Spark (master %s, Java %d at %s)", settings.master, version, java)
        conf = agent_conf(settings)
        if log_format() == "json":
            _start_jvm_logging_through_us(settings, conf)
        builder = Builder.builder.master(settings.master).appName(settings.app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        for key in settings.conf:
            # Read back from the live session: proof that the user's setting reached Spark.
            log.info("Spark conf %s=%s", key, session.sparkContext.getConf().get(key))
        log.info("Spark %s ready (master %s)", session.version, settings.master)
        return cls(settings.master, session)

    def cores(self) -> int:
        context = self.dataframes.sparkContext
        local = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", self.url)
        if local:
            given = local.group(1)
            return (os.cpu_count() or 1) if given == "*" else int(given or 1)
        # Not defaultParallelism: on a cluster Spark floors it at 2, more than a 1-core share.
        bound = context.getConf().get("spark.cores.max")
        return max(1, int(bound)) if bound else max(1, _executor_cores(context))

    def agent_host(self) -> str:
        if self.url.startswith("local"):
            return "127.0.0.1"
        return str(self.dataframes.sparkContext.getConf().get("spark.driver.host"))

    def tag_jobs(self, tag: str) -> None:
        # A job group, not a session tag: only a group's cancellation interrupts (kills) a
        # Python worker that is stuck or stopped.
        self.dataframes.sparkContext.setJobGroup(tag, "udf-agent resident workers", interruptOnCancel=True)

    def untag_jobs(self, tag: str) -> None:
        self.dataframes.sparkContext.setLocalProperty("spark.jobGroup.id", None)

    def cancel(self, tag: str) -> None:
        self.dataframes.sparkContext.cancelJobGroup(tag)

    def jvm_exit_code(self) -> int | None:
        from pyspark import SparkContext

        process = getattr(SparkContext._gateway, "proc", None)
        return None if process is None else process.poll()

    def used(self) -> None:
        pass  # the session lives as long as its JVM

    def lost(self) -> str | None:
        return None

    def stop(self) -> None:
        self.dataframes.stop()


def _start_jvm_logging_through_us(settings: SparkSettings, conf: dict[str, str]) -> None:
    """Starts Spark's JVM with its stderr a pipe whose lines this process logs
    (``logs.foreign_line``): with --log-format json what the JVM and Spark's Python workers
    write there (the JVM's own start-up warnings, a worker's print) stays one JSON object a line.
    The SparkSession built next takes this JVM."""
    import subprocess
    import threading

    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    spark_conf = SparkConf().setMaster(settings.master).setAppName(settings.app_name).setAll(list(conf.items()))
    gateway = launch_gateway(spark_conf, popen_kwargs={"stderr": subprocess.PIPE})
    output = logging.getLogger("spark.output")

    def forward() -> None:
        for line in gateway.proc.stderr:
            foreign_line(line.decode(errors="replace"), output)

    threading.Thread(target=forward, name="spark-stderr", daemon=True).start()
    SparkContext(conf=spark_conf, gateway=gateway)


def _executor_cores(context: object) -> int:
    """Cores of the executors registered so far (the driver's own entry left out)."""
    executors = context._jsc.sc().statusStore().executorList(True)  # type: ignore[attr-defined]
    summaries = [executors.apply(i) for i in range(executors.size())]
    return sum(int(summary.totalCores()) for summary in summaries if summary.id() != "driver")


class ConnectSession:
    """A Spark Connect client session: the server runs the JVM, its executors the UDF.

    The server closes a session after its session timeout without a request: a thread keeps
    this one alive while micro-batches use it (see ``KEEPALIVE_AFTER_USE``)."""

    def __init__(self, url: str, session: ConnectSparkSession, keepalive_interval: float):
        self.url = url
        self.dataframes = session
        self.keepalive_interval = keepalive_interval
        self._last_used = time.monotonic()
        self._quiet = False  # the keepalive thread waits for the next use (guarded by _lock)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopping = False
        self._lost: str | None = None

    @classmethod
    def open(cls, settings: SparkSettings) -> ConnectSession:
        from pyspark.sql.connect.client.retries import DefaultPolicy
        from pyspark.sql.connect.session import SparkSession as Builder

        url = settings.remote or ""
        check_reachable(url)
        log.info("connecting to the Spark Connect server %s", url)
        try:
            # A new session each time: a session the server closed is never handed back.
            session = Builder.builder.remote(url).create()
            session.client.set_retry_policies([DefaultPolicy(max_retries=CONNECT_RETRIES)])
            for key, value in settings.conf.items():
                session.conf.set(key, value)  # runtime settings only: the server owns the rest
            version = session.version
            timeout = _session_timeout(session)
        except Exception as exc:
            raise SparkStartError(f"cannot use the Spark Connect server {url}: {connect_failure(exc)}") from exc
        opened = cls(url, session, keepalive_interval=max(1.0, timeout / 4))
        threading.Thread(target=opened._keep_alive, name="spark-connect-keepalive", daemon=True).start()
        log.info(
            "Spark %s ready (Spark Connect server %s, which ends a session after %g s without a request: kept alive every %g s while in use)",
            version, url, timeout, opened.keepalive_interval,
        )
        return opened

    def cores(self) -> int:
        return CONNECT_SLOTS

    def agent_host(self) -> str:
        host, port = _host_port(self.url, self.url[len("sc://") :].partition("/")[0].partition(";")[0], CONNECT_DEFAULT_PORT)
        return _address_towards(host, port)

    def tag_jobs(self, tag: str) -> None:
        self.dataframes.addTag(tag)

    def untag_jobs(self, tag: str) -> None:
        self.dataframes.removeTag(tag)

    def cancel(self, tag: str) -> None:
        self.dataframes.interruptTag(tag)

    def jvm_exit_code(self) -> int | None:
        return None  # the server's JVM is not ours to watch

    def used(self) -> None:
        with self._lock:
            self._last_used = time.monotonic()
            if self._quiet:
                self._quiet = False
                self._wake.set()

    def lost(self) -> str | None:
        if self.dataframes.is_stopped:
            # PySpark closes its client when the server answers with another server-side
            # session than the one it opened: the server restarted.
            self._lost = self._lost or "the server no longer has it (it restarted)"
            return self._lost
        try:
            check_reachable(self.url)
            self.dataframes.conf.get("spark.sql.session.timeZone")
            return None
        except Exception as exc:
            self._lost = connect_failure(exc)
            return self._lost

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self._lost is not None:
            self.dataframes.release_session_on_close = False  # the server has no such session, or cannot be reached
        self.dataframes.stop()

    def _keep_alive(self) -> None:
        """Asks the server something cheap every ``keepalive_interval`` while the session was
        used within ``KEEPALIVE_AFTER_USE``; then waits, costing nothing, for the next use."""
        while True:
            with self._lock:
                self._quiet = time.monotonic() - self._last_used >= KEEPALIVE_AFTER_USE
                pause = None if self._quiet else self.keepalive_interval
            if self._wake.wait(pause):  # the first use after a quiet spell, or a stop
                self._wake.clear()
                if self._stopping:
                    return
                continue
            try:
                self.dataframes.conf.get("spark.sql.session.timeZone")
            except Exception as exc:
                if not self._stopping:
                    log.warning("the Spark Connect session on %s no longer answers (%s): the next micro-batch opens a new one", self.url, connect_failure(exc))
                return


def connect_failure(exc: BaseException) -> str:
    """A Connect client's failure in one line: gRPC's text spans lines, and its details say
    what happened ("UNAVAILABLE: ... Connection refused")."""
    text = str(exc)
    details = re.search(r'details = "([^"]*)"', text)
    if details is None:
        return first_line(exc)
    status = re.search(r"status = StatusCode\.(\w+)", text)
    return f"{status.group(1)}: {details.group(1)}" if status else details.group(1)


# Spark's time units (JavaUtils.timeStringAs); a number alone is in the setting's own unit.
_SPARK_TIME_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def _session_timeout(session: ConnectSparkSession) -> float:
    """Seconds after which the server closes a session that sends no request."""
    value = session.conf.get("spark.connect.session.manager.defaultSessionTimeout", None)
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", (value or "").lower())
    if match is None or match.group(2) not in (*_SPARK_TIME_UNITS, ""):
        return CONNECT_SESSION_TIMEOUT  # not set on the server: Spark's default
    return int(match.group(1)) * _SPARK_TIME_UNITS[match.group(2) or "ms"]
