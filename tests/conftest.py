import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


@pytest.fixture(scope="session")
def spark_engine():
    """One real SparkSession for every in-process test: the JVM is slow to start."""
    from spark_backend import SparkEngine, SparkSettings

    engine = SparkEngine(SparkSettings(master="local[2]"))
    engine.start()
    engine.wait_ready()
    yield engine
    engine.stop()


@pytest.fixture(scope="session")
def engines(spark_engine):
    from udf_agent.engine import Engines

    return Engines(lambda: spark_engine)
