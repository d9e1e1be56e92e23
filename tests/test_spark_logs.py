"""What Spark writes to the UDF log: warnings and worse, everything with --log-level debug,
and how long its start took."""

import json

import pytest

from udf_agent.testing import option


def run_one_point_on_spark(drivers, *args):
    driver = drivers("run", "moving_avg", "--no-local-while-starting", *args)
    assert driver.init(option("field", "value"), option("size", 2)).success
    driver.point(time=1, name="cpu", fieldsDouble={"value": 1.0})
    driver.responses.wait_for("point", 1, timeout=180)
    assert driver.close() == 0
    return driver.log()


@pytest.mark.integration
@pytest.mark.spark
def test_spark_logs_only_warnings_by_default_and_the_log_says_how_long_it_took_to_start(drivers):
    log = run_one_point_on_spark(drivers)
    assert "compute engine ready in " in log
    assert "spark INFO" not in log
    # PySpark's own start-up chatter about its default logging is gone too.
    assert "default log4j profile" not in log and "Setting default log level" not in log


@pytest.mark.integration
@pytest.mark.spark
def test_with_log_format_json_what_spark_writes_is_one_json_object_a_line_too(drivers):
    lines = [json.loads(line) for line in run_one_point_on_spark(drivers, "--log-format", "json", "--log-level", "debug").splitlines()]
    loggers = {line["logger"] for line in lines}
    assert "spark_backend.engine" in loggers
    # Spark's log4j lines (and whatever its JVM writes on its own) as objects.
    assert "spark.org.apache.spark.SparkContext" in loggers, loggers
    assert all(line["level"] in ("debug", "info", "warning", "error", "critical", "fatal") for line in lines)


@pytest.mark.integration
@pytest.mark.spark
def test_with_log_level_debug_spark_logs_everything(drivers):
    log = run_one_point_on_spark(drivers, "--log-level", "debug")
    assert "spark INFO SparkContext: " in log


def test_while_spark_starts_the_log_says_how_long_it_has_taken_so_far(monkeypatch, caplog):
    import logging
    import threading
    import time

    from spark_backend import engine as spark_engine

    monkeypatch.setattr(spark_engine, "START_REPORT_INTERVAL", 0.05)
    starting = spark_engine.SparkEngine(spark_engine.SparkSettings())
    caplog.set_level(logging.INFO, logger="spark_backend.engine")
    clock = threading.Thread(target=starting._report_start, args=(time.monotonic(),))
    clock.start()
    time.sleep(0.3)
    starting._ready.set()
    clock.join(5)
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for Spark to start: ")]
    assert len(reports) >= 3
    assert not clock.is_alive()
