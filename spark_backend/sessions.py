"""The one boundary between the engine and Spark: a session, classic or Spark Connect.

``open_session`` picks the implementation from the URL: ``sc://host:port`` (``--remote``,
or ``SPARK_REMOTE``) is a Spark Connect server, reached by PySpark's light client (no
JVM in the agent); anything else is a ``--master`` for a classic session with its JVM in
this process. The engine and the resident workers use only what ``SparkSession`` declares:
the DataFrame API both sessions share, and the few things that differ.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

from spark_backend.settings import SparkSettings, agent_conf
from udf_agent.compute.engine import EngineStartError
from udf_agent.errors import first_line
from udf_agent.logs import foreign_line, log_format
from udf_agent.redaction import redacted_url, redacted_value

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
# While a micro-batch has run this long on a Connect session, the server is asked every as
# long whether the session still stands: a micro-batch that waits on the resident workers of a
# lost session is ended, to be computed again on a new one, instead of waiting for workers
# that cannot come.
WATCH_AFTER = 2.0
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

    def executor_cores(self) -> int | None:
        """The cores of the executors registered now (None: not known here)."""

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

    def in_use(self, on_lost: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
        """Around a micro-batch on the session. A Connect session stays alive until
        ``KEEPALIVE_AFTER_USE`` after the last one; found lost while one runs, it calls that
        micro-batch's ``on_lost``, which ends what it waits on."""

    def lost(self, ask: bool = True) -> str | None:
        """Why the session can no longer be used (a Connect server closed it, restarted, or
        cannot be reached), or None: asks the server unless ``ask`` is False (then only what
        is known already). A classic session's JVM is watched by ``jvm_exit_code`` instead."""

    def stop(self) -> None: ...


def open_session(settings: SparkSettings) -> SparkSession:
    """A session for ``settings.remote`` (Spark Connect) or else ``settings.master``."""
    if settings.remote:
        return ConnectSession.open(settings)
    return ClassicSession.open(settings)


def _limit_retries(client: Any, retries: int) -> None:
    """At most ``retries`` retries of a call the server does not answer: Spark 4's client takes
    retry policies, 3.5's one dict of settings (found by what the client has, not its version)."""
    if hasattr(client, "set_retry_policies"):
        from pyspark.sql.connect.client.retries import DefaultPolicy

        client.set_retry_policies([DefaultPolicy(max_retries=retries)])
    else:
        client._retry_policy["max_retries"] = retries


def _warn_if_client_newer(server: str) -> None:
    from udf_agent.versions import connect_client_warning, pyspark_version

    warning = connect_client_warning(pyspark_version() or "0", server)
    if warning is not None:
        log.warning("%s", warning)


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
    raise SparkStartError(f"cannot reach the {kind} {redacted_url(url)} ({'; '.join(causes)})")


def _host_port(url: str, address: str, default_port: int) -> tuple[str, int]:
    try:
        parts = urlsplit(f"//{address}")
        host, port = parts.hostname, parts.port or default_port
    except ValueError as exc:
        raise SparkStartError(f"cannot use {redacted_url(url)}: {exc}") from None
    if not host:
        raise SparkStartError(f"cannot use {redacted_url(url)}: {address!r} names no host")
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
        conf = agent_conf(settings, java)
        if log_format() == "json":
            _start_jvm_logging_through_us(settings, conf)
        builder = Builder.builder.master(settings.master).appName(settings.app_name)
        for key, value in conf.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        for key in settings.conf:
            # Read back from the live session: proof that the user's setting reached Spark.
            log.info("Spark conf %s=%s", key, redacted_value(key, session.sparkContext.getConf().get(key)))
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

    def executor_cores(self) -> int | None:
        return _executor_cores(self.dataframes.sparkContext)

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

    def in_use(self, on_lost: Callable[[], None] | None = None) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()  # the session lives as long as its JVM

    def lost(self, ask: bool = True) -> str | None:
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

    The server closes a session after its session timeout without a request, and forgets
    every session when it restarts. A thread of this session's asks the server something
    cheap (a conf) to keep the session alive while it is used, and to find out, while a
    micro-batch takes long, whether the session still stands."""

    def __init__(self, url: str, session: ConnectSparkSession, keepalive_interval: float):
        self.url = url
        self.dataframes = session
        self.keepalive_interval = keepalive_interval
        self._lock = threading.Lock()  # guards what follows, up to _wake
        now = time.monotonic()
        self._last_used = now
        self._last_asked = now
        self._running: dict[int, tuple[float, Callable[[], None] | None]] = {}  # micro-batches: start, on_lost
        self._keys = itertools.count()
        self._sleeping_long = False  # the thread would not see a micro-batch start unless woken
        self._wake = threading.Event()
        self._stopping = False
        self._lost: str | None = None

    @classmethod
    def open(cls, settings: SparkSettings) -> ConnectSession:
        from pyspark.sql.connect.session import SparkSession as Builder

        url = settings.remote or ""
        check_reachable(url)
        shown = redacted_url(url)  # its ;token= never written
        log.info("connecting to the Spark Connect server %s", shown)
        try:
            # A new session each time: a session the server closed is never handed back.
            session = Builder.builder.remote(url).create()
            _limit_retries(session.client, CONNECT_RETRIES)
            for key, value in settings.conf.items():
                session.conf.set(key, value)  # runtime settings only: the server owns the rest
            version = session.version
            _warn_if_client_newer(version)
            timeout = _session_timeout(session)
        except Exception as exc:
            raise SparkStartError(f"cannot use the Spark Connect server {shown}: {connect_failure(exc)}") from exc
        opened = cls(shown, session, keepalive_interval=max(1.0, timeout / 4))
        threading.Thread(target=opened._watch, name="spark-connect-session", daemon=True).start()
        log.info(
            "Spark %s ready (Spark Connect server %s, which ends a session after %g s without a request: kept alive every %g s while in use)",
            version, shown, timeout, opened.keepalive_interval,
        )
        return opened

    def cores(self) -> int:
        return CONNECT_SLOTS

    def executor_cores(self) -> int | None:
        return None  # the server's, shared with every client

    def agent_host(self) -> str:
        host, port = _host_port(self.url, self.url[len("sc://") :].partition("/")[0].partition(";")[0], CONNECT_DEFAULT_PORT)
        return _address_towards(host, port)

    def tag_jobs(self, tag: str) -> None:
        self.dataframes.addTag(tag)

    def untag_jobs(self, tag: str) -> None:
        self.dataframes.removeTag(tag)

    def cancel(self, tag: str) -> None:
        if self._lost is None and not self._stopping:  # a lost session's jobs ended with it, or cannot be reached
            self.dataframes.interruptTag(tag)

    def jvm_exit_code(self) -> int | None:
        return None  # the server's JVM is not ours to watch

    @contextlib.contextmanager
    def in_use(self, on_lost: Callable[[], None] | None = None) -> Iterator[None]:
        key = next(self._keys)
        with self._lock:
            now = time.monotonic()
            self._running[key] = (now, on_lost)
            self._last_used = now
            if self._sleeping_long:  # once a spell: micro-batches that follow find it awake
                self._sleeping_long = False
                self._wake.set()
        try:
            yield
        finally:
            with self._lock:
                del self._running[key]
                self._last_used = time.monotonic()

    def lost(self, ask: bool = True) -> str | None:
        if self._lost is not None or not ask:
            return self._lost
        if self.dataframes.is_stopped:
            # PySpark closes its client when the server answers with another server-side
            # session than the one it opened: the server restarted.
            self._lost = "the server no longer has it (it restarted)"
            return self._lost
        try:
            self._ask()
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

    def _ask(self) -> None:
        check_reachable(self.url)  # at once when nothing listens, rather than after PySpark's retries
        self.dataframes.conf.get("spark.sql.session.timeZone")

    def _watch(self) -> None:
        """Asks the server every ``keepalive_interval`` while the session was used within
        ``KEEPALIVE_AFTER_USE``, and every ``WATCH_AFTER`` while a micro-batch has run that
        long; when the session is found lost, the micro-batches running on it are ended
        (their ``on_lost``). Sleeps, costing nothing, when no question is due."""
        while not self._stopping:
            with self._lock:
                now = time.monotonic()
                due = self._next_question(now)
                pause = None if due is None else max(0.0, due - now)
                self._sleeping_long = pause is None or pause > WATCH_AFTER
            if pause != 0.0:
                if self._wake.wait(pause):
                    self._wake.clear()
                continue  # what is due is reckoned again
            try:
                self._ask()
            except Exception as exc:
                if self._stopping:
                    return
                self._lost = connect_failure(exc)
                with self._lock:
                    ending = [on_lost for _, on_lost in self._running.values() if on_lost is not None]
                log.warning("the Spark Connect session on %s was lost (%s): a new one is opened for the next micro-batch%s", self.url, self._lost, ", and the one running is ended and computed again there" if ending else "")
                for on_lost in ending:
                    on_lost()
                return
            self._last_asked = time.monotonic()

    def _next_question(self, now: float) -> float | None:
        """When the server is next to be asked (None: not until the session is used)."""
        due = []
        if self._running:
            due.append(max(min(start for start, _ in self._running.values()), self._last_asked) + WATCH_AFTER)
        if self._running or now - self._last_used < KEEPALIVE_AFTER_USE:
            due.append(self._last_asked + self.keepalive_interval)
        return min(due) if due else None


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
