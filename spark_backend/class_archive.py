"""The class-data archive of Spark's driver JVM (Java's AppCDS): the classes a Spark start loads,
parsed and laid out once by ``udf-agent prepare`` and mapped by every later start, which then
takes about half as long (a session and its first job 11.2 → 5.5 s on a 2-core host).

An archive belongs to one Java and one PySpark install (``archive_path``): another Java, or
other jars, make another key, and a start without its archive goes on as before. A truncated
archive crashes the JVM that maps it (SIGBUS), so one is never written in place: it is built
under a temporary name, checked by a Spark start that must map it, and renamed whole, its size
recorded beside it; a start maps it only if that size still holds.

Building starts two agents of ours (``udf-agent replay`` of moving_avg on an embedded Spark:
the JVM, its resident workers and their micro-batches, as a task starts them). ``BUILD_STEP``
in their environment tells ``java_option`` what to give their JVM instead: write the archive
at exit (``dump:PATH``), or map it and fail if it cannot (``check:PATH``).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CACHE_DIR_ENV = "UDF_AGENT_CACHE_DIR"
BUILD_STEP = "UDF_AGENT_CLASS_ARCHIVE_STEP"
# How long one build step (a Spark start, a few micro-batches, a stop) may take.
STEP_TIMEOUT = 600.0


class ArchiveError(RuntimeError):
    """The archive could not be built: the message says which step failed and its output."""


@dataclass(frozen=True)
class Archive:
    path: Path
    size: int


def cache_dir() -> Path:
    """Where archives live: $UDF_AGENT_CACHE_DIR, else $XDG_CACHE_HOME/udf-agent, else
    ~/.cache/udf-agent (for tasks Kapacitor starts: the kapacitor user's home)."""
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "udf-agent"


def archive_path(java: str) -> Path:
    """The archive of ``java`` and this PySpark: named by what the JVM checks it against (the
    Java install, Spark's jars), so that an upgrade of either finds none rather than a stale one."""
    import pyspark

    java_bin = os.path.realpath(java)
    java_home = os.path.dirname(os.path.dirname(java_bin))
    jvm_files = [java_bin, *(os.path.join(java_home, "lib", "server", name) for name in ("libjvm.so", "classes.jsa"))]
    jars = os.path.join(os.path.dirname(os.path.abspath(pyspark.__file__)), "jars")
    identity = {
        "java": [(path, *_stat(path)) for path in jvm_files],
        "pyspark": pyspark.__version__,
        "jars": [(name, *_stat(os.path.join(jars, name))) for name in sorted(os.listdir(jars))] if os.path.isdir(jars) else [],
    }
    key = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:20]
    return cache_dir() / f"spark-classes-{key}.jsa"


def _stat(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def _manifest(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def usable_archive(java: str) -> Archive | None:
    """The archive a start of ``java`` may map: built whole for this Java and these jars."""
    path = archive_path(java)
    try:
        recorded = json.loads(_manifest(path).read_text())
        size = path.stat().st_size
    except (OSError, ValueError):
        return None
    if not isinstance(recorded, dict) or recorded.get("size") != size:
        return None  # truncated or replaced since it was built: mapping it could crash the JVM
    return Archive(path, size)


def java_option(java: str) -> str:
    """The option that has the driver JVM map its class archive ('' without one)."""
    step = os.environ.get(BUILD_STEP, "")
    if step.startswith("dump:"):
        return f"-XX:ArchiveClassesAtExit={step[5:]}"
    if step.startswith("check:"):
        return f"-XX:SharedArchiveFile={step[6:]} -Xshare:on"
    archive = usable_archive(java)
    return "" if archive is None else f"-XX:SharedArchiveFile={archive.path}"


def build(java: str, say: Callable[[str], None] = lambda line: None) -> Archive:
    """Builds the archive of ``java`` and this PySpark in place of any earlier one: a Spark
    start that writes it at exit, then one that must map it; ArchiveError if either fails."""
    final = archive_path(java)
    final.parent.mkdir(parents=True, exist_ok=True)
    pending = final.with_name(f"{final.name}.{os.getpid()}.tmp")
    try:
        with tempfile.TemporaryDirectory(prefix="udf-agent-prepare-") as scratch:
            points = os.path.join(scratch, "points.lp")
            with open(points, "w") as out:
                out.writelines(f"cpu,host=h{i % 3} v={i}.5 {(i + 1) * 1_000_000_000}\n" for i in range(300))
            started = time.monotonic()
            say("starting Spark to record the classes it loads (its JVM writes them as it exits)")
            _run_step(f"dump:{pending}", points, scratch)
            if not pending.exists():
                raise ArchiveError(f"the JVM exited without writing {pending}")
            say(f"recorded in {time.monotonic() - started:.0f} s ({pending.stat().st_size / 2**20:.0f} MiB); starting Spark on it to check it")
            _run_step(f"check:{pending}", points, scratch)
        size = pending.stat().st_size
        manifest = {"size": size, "java": os.path.realpath(java), "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.replace(pending, final)
        record = _manifest(final)
        written = record.with_name(f"{record.name}.{os.getpid()}.tmp")
        written.write_text(json.dumps(manifest))
        os.replace(written, record)
        return Archive(final, size)
    finally:
        pending.unlink(missing_ok=True)


def _run_step(step: str, points: str, scratch: str) -> None:
    env = {**os.environ, BUILD_STEP: step, "UDF_AGENT_OWN_SPARK": "1"}
    command = [sys.executable, "-m", "udf_agent", "replay", "moving_avg", "--input", points, "--output", os.path.join(scratch, "out.lp"), "-o", "field=v", "-o", "size=2", "--group-by", "host", "--master", "local[1]", "--log-level", "warning"]
    try:
        done = subprocess.run(command, env=env, cwd=scratch, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STEP_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise ArchiveError(f"Spark did not start and stop within {STEP_TIMEOUT:.0f} s ({step.split(':')[0]} step)") from None
    if done.returncode != 0:
        raise ArchiveError(f"the {step.split(':')[0]} step's Spark failed (exit {done.returncode}): {(done.stderr or done.stdout).strip()[-2000:]}")
