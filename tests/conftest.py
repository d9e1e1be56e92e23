import os
import signal
import sys
import tempfile

import pytest

from udf_agent.serve.shared import shared_server_pids
from udf_agent.testing import KapacitorDriver

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session", autouse=True)
def shared_servers_directory():
    """The shared Spark servers that ``udf-agent run`` tasks start live in a directory of
    this test session's, and are stopped with it (a user's own are never touched)."""
    directory = tempfile.mkdtemp(prefix="udf-agent-shared-")
    os.environ["UDF_AGENT_SHARED_DIR"] = directory
    # Tests of the agent run it in the task's own process; test_shared.py and the
    # Kapacitor harness run tasks the default way, through the shared server.
    os.environ["UDF_AGENT_OWN_SPARK"] = "1"
    yield directory
    for pid in shared_server_pids(directory):
        try:
            os.killpg(pid, signal.SIGKILL)  # the server leads its own session, its JVM included
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def spark_engine():
    """One real SparkSession for every in-process test: the JVM is slow to start."""
    from spark_backend import SparkEngine, SparkSettings

    # Two resident workers, and a third slot left for tests of a job per micro-batch.
    # Never released when idle (tests count launches); test_resident.py tests the release.
    engine = SparkEngine(SparkSettings(master="local[3]", resident_slots=2, resident_idle=None))
    ours = ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "PYTHONPATH", "SPARK_LOCAL_IP")
    before = {name: os.environ.get(name) for name in ours}
    engine.start()
    engine.wait_ready()
    assert engine.resident is not None and engine.resident.wait_for_workers(2, timeout=120)
    # What the agent needs reaches Spark as conf: agent processes the tests start later see
    # the environment a user has (PySpark's own SPARK_* settings aside).
    assert {name: os.environ.get(name) for name in ours} == before
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def spark_jobs_engine(spark_engine):
    """The same SparkSession, one Spark job per micro-batch (``--spark-dispatch jobs``)."""
    from spark_backend import SparkEngine, SparkSettings

    return SparkEngine(SparkSettings(master="local[3]", dispatch="jobs"), session=spark_engine.session)


@pytest.fixture(scope="session")
def engines(spark_engine):
    from udf_agent.runtime.engines import Engines

    return Engines(lambda: spark_engine)


@pytest.fixture
def drivers():
    """Starts ``udf-agent ARGS`` processes (KapacitorDriver); each is killed after the test."""
    started = []

    def start(*args, **kwargs):
        driver = KapacitorDriver(*args, **kwargs)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.kill()


_MEASURED: list[str] = []


@pytest.fixture
def report(request):
    """Records a measured figure; all of them are printed in pytest's closing summary. They
    travel with the test's report, so that a test process of pytest-xdist's reaches it too."""
    return lambda line: request.node.user_properties.append(("measured", line))


def pytest_runtest_logreport(report):
    if report.when == "teardown":  # the last report of a test: every figure it recorded
        _MEASURED.extend(value for name, value in report.user_properties if name == "measured")


def pytest_terminal_summary(terminalreporter):
    if _MEASURED:
        terminalreporter.section("measured")
        for line in _MEASURED:
            terminalreporter.write_line(line)
