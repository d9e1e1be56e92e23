"""The class archive of Spark's driver JVM: named by its Java and jars, mapped only whole, built
by ``udf-agent prepare`` and mapped by a task's Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.driver import java_descendants
from spark_backend import class_archive
from spark_backend.class_archive import BUILD_STEP, CACHE_DIR_ENV, archive_path, java_option, usable_archive
from spark_backend.settings import SparkSettings, agent_conf
from udf_agent.testing import KapacitorDriver, option

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _fake_java(home: Path, libjvm: bytes) -> str:
    (home / "bin").mkdir(parents=True)
    (home / "lib" / "server").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text("#!/bin/sh\n")
    java.chmod(0o755)
    (home / "lib" / "server" / "libjvm.so").write_bytes(libjvm)
    return str(java)


def _built(java: str, content: bytes = b"\0" * 4096) -> Path:
    """An archive as ``build`` leaves it: the file, and its size recorded beside it."""
    path = archive_path(java)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    path.with_name(path.name + ".json").write_text(json.dumps({"size": len(content)}))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(BUILD_STEP, raising=False)
    return tmp_path / "cache"


def test_an_archive_is_named_by_its_java_install(cache, tmp_path):
    one = _fake_java(tmp_path / "jdk-a", b"a" * 10)
    other = _fake_java(tmp_path / "jdk-b", b"a" * 10)
    assert archive_path(one).parent == cache
    assert archive_path(one) == archive_path(one)
    assert archive_path(one) != archive_path(other)  # another install
    before = archive_path(one)
    (tmp_path / "jdk-a" / "lib" / "server" / "libjvm.so").write_bytes(b"b" * 11)  # upgraded in place
    assert archive_path(one) != before


def test_the_cache_directory_defaults_to_the_users_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert class_archive.cache_dir() == tmp_path / "xdg" / "udf-agent"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert class_archive.cache_dir() == tmp_path / "home" / ".cache" / "udf-agent"


def test_a_start_maps_an_archive_only_while_it_is_whole(cache, tmp_path):
    """A truncated archive crashes the JVM that maps it (SIGBUS): one whose size is not the
    size recorded when it was built is left alone, as is one without a record."""
    java = _fake_java(tmp_path / "jdk", b"jvm")
    assert java_option(java) == ""  # none built
    path = _built(java)
    assert java_option(java) == f"-XX:SharedArchiveFile={path}"
    assert usable_archive(java) == class_archive.Archive(path, 4096)
    with open(path, "r+b") as archive:
        archive.truncate(1000)
    assert java_option(java) == ""
    _built(java)
    path.with_name(path.name + ".json").write_text("not json")
    assert java_option(java) == ""
    path.with_name(path.name + ".json").unlink()
    assert java_option(java) == ""


def test_the_build_steps_have_the_jvm_write_its_archive_then_map_it_or_fail(cache, tmp_path, monkeypatch):
    java = _fake_java(tmp_path / "jdk", b"jvm")
    _built(java)  # an earlier archive: the build's own starts never map it
    monkeypatch.setenv(BUILD_STEP, "dump:/tmp/x.jsa")
    assert java_option(java) == "-XX:ArchiveClassesAtExit=/tmp/x.jsa"
    monkeypatch.setenv(BUILD_STEP, "check:/tmp/x.jsa")
    assert java_option(java) == "-XX:SharedArchiveFile=/tmp/x.jsa -Xshare:on"


def test_the_driver_jvm_is_given_its_archive_and_a_users_java_options_still_win(cache, tmp_path):
    java = _fake_java(tmp_path / "jdk", b"jvm")
    path = _built(java)
    options = agent_conf(SparkSettings(master="local[2]"), java)["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={path}" in options.split()
    assert "-XX:SharedArchiveFile" not in agent_conf(SparkSettings(master="local[2]"))["spark.driver.extraJavaOptions"]
    mine = agent_conf(SparkSettings(master="local[2]", conf={"spark.driver.extraJavaOptions": "-Xss4m"}), java)
    assert mine["spark.driver.extraJavaOptions"] == "-Xss4m"


@pytest.mark.integration
def test_prepare_builds_the_archive_that_a_tasks_spark_then_maps(tmp_path):
    """Two Spark starts build it; a task started after maps it into its JVM."""
    env = {**os.environ, CACHE_DIR_ENV: str(tmp_path / "cache")}
    env.pop(BUILD_STEP, None)
    done = subprocess.run([sys.executable, "-m", "udf_agent", "prepare"], env=env, capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    [archive] = (tmp_path / "cache").glob("*.jsa")
    assert f"Spark's class archive: {archive}" in done.stdout
    assert "starting Spark on it to check it" in done.stderr
    assert not list((tmp_path / "cache").glob("*.tmp"))
    driver = KapacitorDriver("run", "moving_avg", "--no-local-while-starting", env={CACHE_DIR_ENV: str(tmp_path / "cache"), "UDF_AGENT_OWN_SPARK": "1"}, cwd=ROOT)
    try:
        assert driver.init(option("field", "v"), option("size", 2)).success
        driver.point(time=0, name="m", fieldsDouble={"v": 1.0})
        driver.responses.wait_for("point", 1, timeout=180)
        [jvm] = java_descendants(driver.process.pid)
        with open(f"/proc/{jvm}/maps") as maps:
            assert str(archive) in maps.read()
        assert "Unable to use shared archive" not in driver.log(), driver.log()[-3000:]
    finally:
        driver.kill()


def test_prepare_says_what_failed_when_the_archive_cannot_be_written(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    env = {**os.environ, CACHE_DIR_ENV: str(blocked / "cache")}
    done = subprocess.run([sys.executable, "-m", "udf_agent", "prepare"], env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1
    assert "Error: cannot write the archive:" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_doctor_says_whether_spark_starts_on_an_archive(cache, tmp_path, monkeypatch):
    from udf_agent.tools.doctor import check_class_archive

    java = _fake_java(tmp_path / "jdk", b"jvm")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    check = check_class_archive()
    assert check.ok and "'udf-agent prepare' builds one" in check.detail
    path = _built(java)
    check = check_class_archive()
    assert check.ok and f"{path} (0 MiB): Spark's JVM maps it as it starts" == check.detail
