"""``udf-agent doctor``: is this machine ready to run UDFs? One check per line, each OK or
what is wrong and what to do."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spark_backend import SparkEngine


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    version: int | None = None  # what was found, where a later check needs it (Java's major)


def run_checks(make_spark: Callable[[], SparkEngine], socket_dir: str, uses_java: bool) -> Iterator[Check]:
    """Every check in order; Spark is started only when what it needs is there."""
    yield Check("python", True, f"{sys.version.split()[0]} at {sys.executable}")
    java = check_java() if uses_java else Check("java", True, "not needed: Spark Connect computes elsewhere")
    yield java
    if uses_java and java.ok:
        yield check_class_archive()
    libraries = check_libraries()
    yield libraries
    yield check_versions(java.version)
    yield check_compiled()
    if java.ok and libraries.ok:
        yield check_spark(make_spark)
    else:
        yield Check("spark", False, "not started: fix the lines above first")
    yield check_socket_dir(socket_dir)
    yield check_kapacitor_agent()


def check_kapacitor_agent() -> Check:
    """Which ``kapacitor.udf.agent`` a Kapacitor Handler script started here would import:
    Kapacitor's own, on PYTHONPATH, wins over udf-agent's."""
    from udf_agent.compute.handlers import kapacitor_agent_origin

    name = "kapacitor.udf.agent"
    origin, ours = kapacitor_agent_origin()
    if origin == ours:
        return Check(name, True, f"udf-agent's ({origin}): Kapacitor's Python scripts (python -u script.py, or udf-agent run script.py) run on udf-agent")
    return Check(
        name, False,
        f"a script would import {origin}, not udf-agent's ({ours}): take Kapacitor's agent directory off PYTHONPATH (in kapacitor.conf, [udf.functions.NAME.env]) to run scripts on udf-agent",
    )


def check_class_archive() -> Check:
    """Whether Spark's JVM starts on a class archive (``udf-agent prepare``): never a failure,
    a start without one only takes longer."""
    from spark_backend.class_archive import archive_path, usable_archive
    from spark_backend.java import find_java

    java = find_java()
    archive = usable_archive(java)
    if archive is None:
        return Check("spark classes", True, f"no archive for this Java and PySpark (none at {archive_path(java)}): 'udf-agent prepare' builds one, and Spark then starts in about half the time")
    return Check("spark classes", True, f"{archive.path} ({archive.size / 2**20:.0f} MiB): Spark's JVM maps it as it starts")


def check_java() -> Check:
    from spark_backend.java import JavaError
    from spark_backend.java import check_java as find_usable_java

    try:
        path, version = find_usable_java()
    except JavaError as exc:
        return Check("java", False, str(exc))
    return Check("java", True, f"Java {version} at {path}", version)


def check_libraries() -> Check:
    try:
        import pandas
        import pyarrow
        import pyspark
    except ImportError as exc:
        return Check("pyspark", False, f"{exc}: install versions that fit together (the versions line says which), or reinstall udf-agent (pip install udf-agent) in this environment")
    return Check("pyspark", True, f"pyspark {pyspark.__version__}, pyarrow {pyarrow.__version__}, pandas {pandas.__version__}")


def check_versions(java: int | None) -> Check:
    """Whether the Spark, Java and libraries installed fit together: udf-agent's own
    requirements (protobuf's range among them), those pyspark's SQL and Connect sides declare
    (Spark 3.5 takes numpy below 2, and pyarrow 26 needs numpy 2), and the Java this Spark
    line runs on. ``java`` is the major version check_java found, None when none is used."""
    from udf_agent.versions import SUPPORTED_SPARK, installed, java_fits, pyspark_version, spark_line, undeclared_conflicts, unmet

    spark = pyspark_version()
    protobuf = installed("protobuf")
    found = f"Spark {spark} (pyspark), protobuf {protobuf}" + (f", Java {java}" if java else "")
    if spark is None:
        return Check("versions", False, f"{found}: pyspark is not installed: pip install udf-agent")
    problems = []
    low, high = SUPPORTED_SPARK
    if not low <= spark_line(spark) < high:
        problems.append(f"Spark {spark} is outside 3.5 to 4.x, the lines udf-agent runs on")
    problems += unmet("udf-agent") + unmet("pyspark", ("sql", "connect") if installed("grpcio") else ("sql",)) + undeclared_conflicts()
    if java and not java_fits(spark, java):
        problems.append(f"Spark {spark} does not run on Java {java} (Spark 3.5: Java 17; Spark 4: Java 17 or later): set JAVA_HOME to one it runs on")
    if problems:
        return Check("versions", False, f"{found}: " + "; ".join(problems) + ": install versions that fit (docs/deployment.md, \"Spark versions\")")
    return Check("versions", True, f"{found}: they fit together; a cluster or Spark Connect server must run Spark {'.'.join(map(str, spark_line(spark)))} (Connect: that or newer)")


def check_compiled() -> Check:
    """Loads the compiled frame scanner and point codec (compiling them on a first run)."""
    started = time.monotonic()
    try:
        from udf_agent.wire import hotpath

        hotpath.load_scanner()
        hotpath.load_point_codec()
        import numba
    except Exception as exc:
        return Check(
            "compiled code", False,
            f"cannot load ({type(exc).__name__}: {exc}): every UDF that computes needs it (only mirror runs without); reinstall numba in this environment (pip install --force-reinstall numba)",
        )
    return Check("compiled code", True, f"numba {numba.__version__}: frame scanner and point codec loaded in {time.monotonic() - started:.1f} s")


def check_spark(make_spark: Callable[[], SparkEngine]) -> Check:
    """Starts Spark the way ``run`` does (resident workers included), times it, stops it; says
    which Spark it runs, and fails on a Spark Connect server older than this pyspark."""
    started = time.monotonic()
    engine = make_spark()
    try:
        engine.wait_ready()
        session = engine.session
        assert session is not None  # ready
        version = str(session.dataframes.version)
    except Exception as exc:
        return Check("spark", False, f"did not start after {time.monotonic() - started:.1f} s: {exc}")
    finally:
        engine.stop()
    took = time.monotonic() - started
    return spark_found(version, engine.settings.remote is not None, took, engine.name)


def spark_found(version: str, connect: bool, took: float, runs: str) -> Check:
    """The spark line once it started: the Spark version it reported (a Connect server's own), and
    Spark's rule that a Connect client may be older than its server, never newer."""
    from udf_agent.versions import connect_client_warning, pyspark_version

    if connect:
        warning = connect_client_warning(pyspark_version() or "0", version)
        if warning is not None:
            return Check("spark", False, f"started in {took:.1f} s, but {warning}")
        return Check("spark", True, f"started in {took:.1f} s, the Spark Connect server runs Spark {version}, micro-batches run {runs}")
    return Check("spark", True, f"started in {took:.1f} s, Spark {version}, micro-batches run {runs}")


def check_socket_dir(directory: str) -> Check:
    name = "socket dir"
    if not os.path.isdir(directory):
        return Check(name, False, f"{directory} does not exist: create it for the user kapacitord runs as, e.g. sudo install -d -o kapacitor -g kapacitor -m 0750 {directory} (or pass --socket-dir)")
    if not os.access(directory, os.W_OK | os.X_OK):
        return Check(name, False, f"{directory} is not writable by this user (uid {os.getuid()}): chown it to the user that runs udf-agent serve, or pass --socket-dir")
    return Check(name, True, f"{directory} is writable: udf-agent serve --socket {os.path.join(directory, 'NAME.sock')} TARGET")
