"""Which engine computes a micro-batch (udf_agent.runtime.engines.Engines)."""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time

import pytest

from udf_agent.cli.engines import spark_engines
from udf_agent.compute.engine import LocalEngine
from udf_agent.library.builtins import BUILTINS
from udf_agent.runtime.engines import Engines


class StartingEngine:
    """An engine that is or is not ready yet; ``run`` is never reached in these tests."""

    name = "elsewhere"

    def __init__(self, ready: bool):
        self._ready = ready

    def start(self) -> None:
        pass

    def ready(self) -> bool:
        return self._ready

    def run(self, job, tasks):
        raise AssertionError("not run here")

    def stop(self) -> None:
        pass


MOVING_AVG = BUILTINS["moving_avg"]


def test_small_micro_batches_run_in_the_agent_and_big_ones_where_spark_is():
    spark = StartingEngine(ready=True)
    engines = Engines(lambda: spark, local_max_points=100, local_while_starting=True)
    assert isinstance(engines.engine_for(MOVING_AVG, 100), LocalEngine)
    assert engines.engine_for(MOVING_AVG, 101) is spark
    assert engines.engine_for(MOVING_AVG) is spark


def test_while_spark_starts_every_micro_batch_runs_in_the_agent():
    engines = Engines(lambda: StartingEngine(ready=False), local_while_starting=True)
    assert isinstance(engines.engine_for(MOVING_AVG, 50_000), LocalEngine)


def test_once_spark_is_up_every_micro_batch_runs_there_by_default():
    engines = Engines(lambda: StartingEngine(ready=True), local_while_starting=True)
    assert isinstance(engines.engine_for(MOVING_AVG, 1), StartingEngine)


def test_without_a_local_budget_everything_waits_for_spark():
    spark = StartingEngine(ready=False)
    engines = Engines(lambda: spark)
    assert engines.engine_for(MOVING_AVG, 1) is spark


def test_udfs_that_compute_nothing_never_reach_spark():
    engines = Engines(lambda: StartingEngine(ready=True))
    assert isinstance(engines.engine_for(dataclasses.replace(MOVING_AVG, compute=False), 10**6), LocalEngine)


def test_computing_while_spark_starts_defaults_on_for_embedded_spark_only():
    assert spark_engines("local[*]", ()).local_while_starting is True
    assert spark_engines("local[2]", (), local_while_starting=False).local_while_starting is False
    assert spark_engines("spark://10.0.0.1:7077", ()).local_while_starting is False
    assert spark_engines("spark://10.0.0.1:7077", (), local_while_starting=True).local_while_starting is True
    assert spark_engines("local[*]", ()).local_max_points == 0


def test_spark_gets_what_the_agent_needs_as_conf_and_a_cluster_no_loopback_address(monkeypatch):
    from spark_backend.settings import SparkSettings, agent_conf

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    local = agent_conf(SparkSettings(master="local[2]"))
    assert local["spark.driver.host"] == local["spark.driver.bindAddress"] == "127.0.0.1"
    assert local["spark.pyspark.python"] == sys.executable
    assert os.path.abspath(os.curdir) in local["spark.executorEnv.PYTHONPATH"].split(os.pathsep)
    cluster = agent_conf(SparkSettings(master="spark://10.0.0.1:7077", conf={"spark.driver.memory": "1g"}))
    assert "spark.driver.host" not in cluster and "spark.driver.bindAddress" not in cluster
    assert cluster["spark.driver.memory"] == "1g"  # the user's --conf wins
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    assert "spark.pyspark.python" not in agent_conf(SparkSettings())  # the user's interpreter stays


def test_only_an_embedded_spark_with_resident_workers_runs_without_the_context_cleaner():
    """The cleaner polls 10 times a second, an idle task's largest JVM cost; Spark jobs per
    micro-batch leave accumulators and broadcasts that only it removes."""
    from spark_backend.settings import SparkSettings, agent_conf

    assert agent_conf(SparkSettings(master="local[2]"))["spark.cleaner.referenceTracking"] == "false"
    assert "spark.cleaner.referenceTracking" not in agent_conf(SparkSettings(master="local[2]", dispatch="jobs"))
    assert "spark.cleaner.referenceTracking" not in agent_conf(SparkSettings(master="spark://10.0.0.1:7077"))
    java = agent_conf(SparkSettings(master="local[2]"))["spark.driver.extraJavaOptions"].split()
    assert {"-XX:-UsePerfData", "-XX:GuaranteedSafepointInterval=0"} <= set(java)
    keep = agent_conf(SparkSettings(master="local[2]", conf={"spark.cleaner.referenceTracking": "true"}))
    assert keep["spark.cleaner.referenceTracking"] == "true"  # the user's --conf wins


def test_an_embedded_spark_heartbeats_once_a_minute_and_a_cluster_as_spark_does(spark_engine):
    """Heartbeats to a driver in the same JVM wake two threads of an idle task; a cluster's
    driver needs them to know its executors are alive."""
    from spark_backend.settings import SparkSettings, agent_conf

    assert agent_conf(SparkSettings(master="local[2]"))["spark.executor.heartbeatInterval"] == "60s"
    assert "spark.executor.heartbeatInterval" not in agent_conf(SparkSettings(master="spark://10.0.0.1:7077"))
    # Spark accepted it (it must stay below spark.network.timeout).
    assert spark_engine.session.dataframes.conf.get("spark.executor.heartbeatInterval") == "60s"


def test_an_unreachable_standalone_master_is_named_with_the_cause_at_once():
    from spark_backend.sessions import SparkStartError, check_reachable

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(SparkStartError, match=rf"cannot reach the Spark master spark://127.0.0.1:{port},127.0.0.1:{port} \(127.0.0.1:{port}: Connection refused; "):
        check_reachable(f"spark://127.0.0.1:{port},127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        check_reachable(f"spark://127.0.0.1:{port},127.0.0.1:{listening.getsockname()[1]}")  # a standby master answers
    check_reachable("local[*]")


def test_a_udf_module_outside_site_packages_travels_inside_the_pickled_job(tmp_path, monkeypatch):
    import subprocess
    import textwrap

    from pyspark import cloudpickle

    from spark_backend.engine import ship_by_value
    from udf_agent.compute.contract import Job
    from udf_agent.targets import resolve_target

    (tmp_path / "travelling_udfs.py").write_text(
        textwrap.dedent(
            """
            from udf_agent import stream_udf


            def helper(values):
                return values + 1


            @stream_udf()
            def plus_one(df, ctx):
                return df.assign(v=helper(df["v"]))
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    spec = resolve_target("travelling_udfs:plus_one")
    ship_by_value(spec)
    pickled = cloudpickle.dumps(Job(spec, {}))
    # Unpickled where the module cannot be imported: it came inside the job.
    check = "import pickle, sys; import pandas as pd; job = pickle.loads(sys.stdin.buffer.read()); print(list(job.spec.function(pd.DataFrame({'v': [1.0]}), None)['v']))"
    done = subprocess.run([sys.executable, "-c", check], input=pickled, capture_output=True, cwd="/", env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, timeout=60)
    assert done.returncode == 0 and done.stdout.decode().strip() == "[2.0]", done.stderr.decode()[-2000:]


def test_a_standalone_cluster_task_takes_a_share_that_grows_up_to_max_cores_or_is_fixed_by_hand():
    from spark_backend.settings import CLUSTER_SHARE_CONF, SparkSettings, agent_conf

    master = "spark://10.0.0.1:7077"
    growing = SparkSettings(master=master)
    cluster = agent_conf(growing)
    assert {name: cluster[name] for name in CLUSTER_SHARE_CONF} == CLUSTER_SHARE_CONF
    assert growing.grows() and cluster["spark.dynamicAllocation.enabled"] == "true" and cluster["spark.executor.cores"] == "1"
    assert "spark.cores.max" not in cluster  # what the cluster has free bounds it
    capped = SparkSettings(master=master, max_cores=3)
    assert capped.grows() and agent_conf(capped)["spark.cores.max"] == "3"
    # Cores given by hand are fixed; so is a task of Spark jobs, or of slots given by hand, at one core.
    by_hand = SparkSettings(master=master, conf={"spark.cores.max": "4", "spark.executor.cores": "2"})
    assert not by_hand.grows() and (agent_conf(by_hand)["spark.cores.max"], agent_conf(by_hand)["spark.executor.cores"]) == ("4", "2")
    for fixed in (SparkSettings(master=master, dispatch="jobs"), SparkSettings(master=master, resident_slots=2)):
        assert not fixed.grows() and agent_conf(fixed)["spark.cores.max"] == "1"
    assert not SparkSettings(master="local[2]").grows()
    assert "spark.cores.max" not in agent_conf(SparkSettings(master="local[2]"))  # its own cores are all its own


def test_resident_slots_are_the_cores_of_the_local_master(spark_engine):
    from spark_backend.sessions import ClassicSession

    assert spark_engine.session.cores() == 3  # local[3], not defaultParallelism
    running = spark_engine.session.dataframes
    cores = {url: ClassicSession(url, running).cores() for url in ("local", "local[*]", "local[4,2]", "local[1]")}
    assert cores == {"local": 1, "local[*]": os.cpu_count(), "local[4,2]": 4, "local[1]": 1}
