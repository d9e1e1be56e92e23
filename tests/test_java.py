"""Without a usable Java, Spark's start fails with what to do, not with PySpark's gateway error."""

import os
import stat

import pytest

from spark_backend.java import JavaError, check_java
from udf_agent.testing import option


def fake_java(directory, version_line):
    """A `java` whose -version prints VERSION_LINE, as a JDK does (on stderr)."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True)
    java = bin_dir / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n")
    java.chmod(java.stat().st_mode | stat.S_IEXEC)
    return java


def test_java_home_wins_and_its_version_is_read(tmp_path, monkeypatch):
    java = fake_java(tmp_path, 'openjdk version "21.0.2" 2024-01-16')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    assert check_java() == (str(java), 21)


def test_a_java_too_old_for_spark_is_refused_with_the_fix(tmp_path, monkeypatch):
    fake_java(tmp_path, 'java version "1.8.0_292"')
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaError, match=r"is Java 8; Spark needs Java 17 or later: install .*openjdk-17-jre-headless"):
        check_java()


def test_no_java_anywhere_says_so_and_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaError, match=r"Java not found .* install Java 17 or later .* or set JAVA_HOME"):
        check_java()


@pytest.mark.integration
def test_without_java_kapacitor_gets_an_error_response_saying_so_and_the_log_no_traceback(drivers, tmp_path):
    # No JAVA_HOME and a PATH without java: what a fresh machine without a JDK looks like.
    # Micro-batches wait for Spark: computed in the agent while Spark was still failing to start
    # (its first 0.2 s), the point gave output and no error (seen in CI).
    driver = drivers("run", "moving_avg", "--no-local-while-starting", env={"JAVA_HOME": "", "PATH": str(tmp_path)})
    assert driver.init(option("field", "value"), option("size", 3)).success
    driver.point(time=1, name="cpu", fieldsDouble={"value": 1.0})
    [error] = driver.responses.wait_for("error", 1, timeout=60)
    assert "Java not found" in error.error and "openjdk-17-jre-headless" in error.error
    assert driver.process.wait(60) != 0
    log = driver.log()
    assert "Java not found" in log
    assert "Traceback" not in log
    assert os.environ.get("PATH")  # the test's own environment is untouched
