"""How the agent's Spark is set up: the settings a user gives and the conf they become."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field

from udf_agent.logs import log_format

# Chosen for a driver that mostly moves bytes: quick JVM start-up (C1 only, serial GC, no UI),
# Arrow on, Python workers reused between jobs. An idle task must cost next to no CPU, and an
# idle JVM wakes up tens of times a second: no perf-data sampling (20/s), no guaranteed
# safepoint each second, monitor deflation looked at every 10 s instead of 4 times a second,
# and, with resident workers (``agent_conf``), no ContextCleaner; an embedded Spark's executor
# heartbeats once a minute. Together: an idle JVM from 0.33 to under 0.1 % of a core.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.execution.arrow.pyspark.fallback.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
    # A Python worker that crashes (SIGSEGV, SIGABRT, ...) leaves Spark the fatal signal and the
    # frame it died in: the resident workers' loss report names them.
    "spark.python.worker.faulthandler.enabled": "true",
    "spark.driver.memory": "512m",
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Xshare:auto -XX:ReservedCodeCacheSize=64m -XX:MaxMetaspaceSize=256m -XX:-UsePerfData -XX:+UnlockDiagnosticVMOptions -XX:GuaranteedSafepointInterval=0 -XX:AsyncDeflationInterval=10000",
}


DISPATCHES = ("resident", "jobs")

# A process UDF on a standalone cluster takes a share of it that follows its load, and gives
# its cores back when idle, so that other tasks and applications get theirs: one-core
# executors, each released 10 s after its resident worker is (dynamic allocation; no shuffle
# service needed, micro-batches shuffle nothing). With resident workers its cores grow from
# one (``growth.py``) up to --max-cores (spark.cores.max), else what the cluster has free;
# with Spark jobs a micro-batch, or slots given by hand, spark.cores.max is 1. The
# executor's JVM only passes micro-batches to its Python workers, which live outside its
# heap: 512m, half Spark's default, fits twice in a 1 GB worker. --conf overrides any of them.
CLUSTER_SHARE_CONF = {
    "spark.executor.cores": "1",
    "spark.executor.memory": "512m",
    "spark.dynamicAllocation.enabled": "true",
    "spark.dynamicAllocation.shuffleTracking.enabled": "true",
    "spark.dynamicAllocation.executorIdleTimeout": "10s",
}


@dataclass
class SparkSettings:
    master: str = "local[*]"
    conf: dict[str, str] = field(default_factory=dict)
    app_name: str = "udf-agent"
    dispatch: str = "resident"
    # A micro-batch computing longer is abandoned, and retried once on fresh workers.
    batch_timeout: float = 60.0
    # Resident tasks to launch (default: the cores the application has, see SparkSession.cores).
    resident_slots: int | None = None
    # Resident workers with no micro-batch for this long end, giving their cores back (None: never).
    resident_idle: float | None = 30.0
    # A Spark Connect server (sc://host:port): used instead of ``master``; no JVM here.
    remote: str | None = None
    # The resident memory a resident Python worker may reach while computing, in bytes
    # (None: WORKER_MEMORY_SHARE of the host's memory over the slots; 0: no limit).
    worker_memory: int | None = None
    # The most cores a growing engine takes (None: what the cluster grants; see ``grows``).
    max_cores: int | None = None

    def grows(self) -> bool:
        """Whether the resident slots follow the load, from one up to ``max_cores``: on a
        standalone cluster, unless the slots (--resident-slots) or the cores
        (spark.cores.max) are given by hand."""
        return self.dispatch == "resident" and self.remote is None and self.master.startswith("spark://") and self.resident_slots is None and "spark.cores.max" not in self.conf

    def worker_memory_bytes(self, slots: int) -> int | None:
        """The memory limit of each of ``slots`` resident workers (None: unlimited)."""
        if self.worker_memory is not None:
            return self.worker_memory or None
        return default_worker_memory(slots)

    @property
    def url(self) -> str:
        return self.remote or self.master


# By default the resident workers may together use this share of the host's memory: a UDF
# that allocates without bound fails its micro-batch long before the host's out-of-memory
# killer would pick the JVM or a shared server.
WORKER_MEMORY_SHARE = 0.5
MIN_WORKER_MEMORY = 1 << 30


def host_memory() -> int:
    """The host's physical memory in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def default_worker_memory(slots: int) -> int:
    return max(MIN_WORKER_MEMORY, int(host_memory() * WORKER_MEMORY_SHARE / max(1, slots)))


def agent_conf(settings: SparkSettings, java: str | None = None) -> dict[str, str]:
    """Spark's configuration for this agent, as Spark conf (nothing set in our environment):
    the defaults, what its Python workers need, then the user's ``--conf``, which wins.
    With ``java``, the JVM that will run: its class archive, if built, is mapped."""
    needs = {}
    # Workers run this interpreter (it has pyarrow and the UDF's module) and import what the
    # agent can: the UDF's module may live next to the current directory only. A PYSPARK_PYTHON
    # the user set is theirs to keep.
    if "PYSPARK_PYTHON" not in os.environ:
        needs["spark.pyspark.python"] = sys.executable
    if "PYSPARK_DRIVER_PYTHON" not in os.environ:
        needs["spark.pyspark.driver.python"] = sys.executable
    paths = [os.path.abspath(p or os.curdir) for p in sys.path if os.path.isdir(p or os.curdir)]
    # An editable install finds this project through an import hook, not a path: named too.
    import udf_agent

    paths += [os.path.dirname(os.path.dirname(os.path.abspath(path))) for path in (udf_agent.__file__ or "", __file__)]
    needs["spark.executorEnv.PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    # Spark's log lines land in the UDF log: warnings and worse, everything with --log-level debug.
    level = "INFO" if logging.getLogger().getEffectiveLevel() <= logging.DEBUG else "WARN"
    log_config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2-json.properties" if log_format() == "json" else "log4j2.properties")
    java_options = DEFAULT_CONF["spark.driver.extraJavaOptions"]
    if java is not None:
        from spark_backend.class_archive import java_option

        java_options = f"{java_options} {java_option(java)}".rstrip()
    needs["spark.driver.extraJavaOptions"] = f"{java_options} -Dlog4j2.configurationFile=file:{log_config} -Dudf_agent.spark.level={level}"
    if settings.dispatch == "resident" and settings.master.startswith("local"):
        # The cleaner polls 10 times a second. On an embedded Spark with resident workers a job
        # is a launch of them, whose metadata (a few kilobytes) is all it would clean; Spark
        # jobs per micro-batch (--spark-dispatch jobs, or a cluster's while its workers start)
        # leave accumulators and broadcasts that need it.
        needs["spark.cleaner.referenceTracking"] = "false"
    if settings.master.startswith("spark://"):
        needs.update(CLUSTER_SHARE_CONF)
        if not settings.grows():
            needs["spark.cores.max"] = "1"
        elif settings.max_cores is not None:
            needs["spark.cores.max"] = str(settings.max_cores)
    if settings.master.startswith("local"):
        # An embedded Spark talks to itself over loopback only; a cluster's executors must
        # reach the driver at an address Spark (or the user's --conf) picks.
        needs["spark.driver.host"] = "127.0.0.1"
        needs["spark.driver.bindAddress"] = "127.0.0.1"
        # Its executor heartbeats to a driver in the same JVM, carrying metrics nothing here
        # reads: once a minute instead of every 10 s (two threads' wake-ups in an idle task).
        # Spark wants it below spark.network.timeout (120 s).
        needs["spark.executor.heartbeatInterval"] = "60s"
    return {**DEFAULT_CONF, **needs, **settings.conf}
