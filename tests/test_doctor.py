"""``udf-agent doctor``: one line per check, OK or what to do; exit 1 if any fails."""

import os
import subprocess
import sys

import pytest

from udf_agent.tools.doctor import check_socket_dir, spark_found


def doctor(*args, env=None):
    return subprocess.run([sys.executable, "-m", "udf_agent", "doctor", *args], capture_output=True, text=True, timeout=300, env={**os.environ, **(env or {})})


@pytest.mark.integration
@pytest.mark.spark
def test_a_healthy_machine_passes_every_check_and_spark_is_started_and_timed(tmp_path):
    done = doctor("--master", "local[1]", "--socket-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["OK   python", "OK   java", "OK   spark classes", "OK   pyspark", "OK   versions", "OK   compiled code", "OK   spark", "OK   socket dir", "OK   kapacitor.udf.agent"]
    assert "'udf-agent prepare' builds one" in lines[2] or "Spark's JVM maps it as it starts" in lines[2]
    assert lines[4].startswith("OK   versions: Spark ") and ", protobuf " in lines[4] and ", Java " in lines[4] and "they fit together" in lines[4]
    assert "frame scanner and point codec loaded in " in lines[5]
    import pyspark

    assert "started in " in lines[6] and f" s, Spark {pyspark.__version__}, micro-batches run on Spark" in lines[6]


def test_a_spark_connect_server_older_than_this_pyspark_fails_the_spark_line_saying_what_to_install(monkeypatch):
    from udf_agent import versions

    monkeypatch.setattr(versions, "pyspark_version", lambda: "4.1.0")
    older = spark_found("3.5.6", connect=True, took=2.0, runs="on Spark's resident workers")
    assert not older.ok and "newer than the Spark Connect server's Spark 3.5.6" in older.detail and "pyspark[connect]==3.5.*" in older.detail
    same = spark_found("4.1.2", connect=True, took=2.0, runs="on Spark's resident workers")
    assert same.ok and same.detail == "started in 2.0 s, the Spark Connect server runs Spark 4.1.2, micro-batches run on Spark's resident workers"
    assert spark_found("4.2.0", connect=True, took=2.0, runs="x").ok  # a client may be older than its server
    # A classic driver runs its own Spark: there is no server version to hold it to.
    assert spark_found("3.5.6", connect=False, took=2.0, runs="x").ok


@pytest.mark.integration
def test_without_java_doctor_says_what_to_install_and_does_not_try_spark(tmp_path):
    done = doctor("--socket-dir", str(tmp_path), env={"JAVA_HOME": "", "PATH": str(tmp_path)})
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1].startswith("FAIL java: Java not found") and "openjdk-17-jre-headless" in lines[1]
    assert lines[3].startswith("OK   versions: Spark ") and "Java" not in lines[3]  # no Java to name
    assert lines[5] == "FAIL spark: not started: fix the lines above first"
    assert "2 check(s) failed" in done.stderr


def test_a_missing_socket_directory_says_how_to_create_it(tmp_path):
    check = check_socket_dir(str(tmp_path / "missing"))
    assert not check.ok
    assert "does not exist: create it" in check.detail and "install -d" in check.detail


def test_an_unwritable_socket_directory_is_named(tmp_path, monkeypatch):
    from udf_agent.tools import doctor as doctor_module

    # Root may write anywhere: the permission answer is the kernel's, stood in for here.
    monkeypatch.setattr(doctor_module.os, "access", lambda path, mode: False)
    check = check_socket_dir(str(tmp_path))
    assert not check.ok and "is not writable by this user" in check.detail


def test_compiled_code_that_cannot_load_fails_its_check_saying_what_needs_it():
    # A fresh interpreter where numba does not import, as on a machine where it broke.
    probe = "import sys; sys.modules['numba'] = None\nfrom udf_agent.tools.doctor import check_compiled\nc = check_compiled(); print(c.ok, c.detail)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.stdout.startswith("False cannot load (ModuleNotFoundError: import of numba halted"), done.stdout + done.stderr
    assert "every UDF that computes needs it (only mirror runs without)" in done.stdout
