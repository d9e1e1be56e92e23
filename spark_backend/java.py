"""Finding the Java that Spark will run, before starting it: without one, PySpark fails
with a message about its gateway that names neither Java nor the fix."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

# Spark 4 runs on Java 17 and 21.
MIN_JAVA = 17
INSTALL_HINT = (
    f"install Java {MIN_JAVA} or later (Debian/Ubuntu: apt install openjdk-17-jre-headless) "
    "or set JAVA_HOME to a Java installation's directory"
)


class JavaError(RuntimeError):
    """No usable Java: the message says what was looked at and what to do."""


def find_java() -> str:
    """The java executable Spark will run: JAVA_HOME's if set, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    if home:
        candidate = os.path.join(home, "bin", "java")
        if os.access(candidate, os.X_OK):
            return candidate
        raise JavaError(f"JAVA_HOME={home} has no bin/java: {INSTALL_HINT}")
    found = shutil.which("java")
    if found is None:
        raise JavaError(f"Java not found (JAVA_HOME is not set and there is no java on PATH); Spark needs it: {INSTALL_HINT}")
    return found


def java_version(java: str) -> int:
    """The major version of JAVA (8 for 1.8), read from ``java -version``."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaError(f"{java} -version failed: {exc}: {INSTALL_HINT}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', done.stderr + done.stdout)
    if not match:
        raise JavaError(f"cannot read the version of {java} from: {(done.stderr or done.stdout).strip()[:200]!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_java() -> tuple[str, int]:
    """(path, major version) of a Java Spark can run on; JavaError saying what to do otherwise."""
    java = find_java()
    major = java_version(java)
    if major < MIN_JAVA:
        raise JavaError(f"{java} is Java {major}; Spark needs Java {MIN_JAVA} or later: {INSTALL_HINT}")
    return java, major
