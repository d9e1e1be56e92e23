"""What the agent writes to stderr: text or one JSON object a line, each line naming its task."""

import json
import logging
import os
import threading

import pytest

from udf_agent import logs


class Stderr:
    def __init__(self, capsys):
        self._capsys = capsys

    def getvalue(self) -> str:
        return self._capsys.readouterr().err


@pytest.fixture
def stderr(capsys):
    """What the test writes to stderr (the handler is made in the test, on the captured
    stream); the root logger and the process's log format restored afterwards."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield Stderr(capsys)
    logs.configure_logging(logging.getLevelName(level), "text")
    root.handlers[:] = handlers


def logged_in_a_task(labels, message, *args, raising=False):
    """Logs MESSAGE from a thread of the task of LABELS, as the agent's threads do (with
    ``raising``, as the exception it handles)."""

    def work():
        log = logging.getLogger("udf_agent.runtime.agent")
        if not raising:
            log.error(message, *args)
            return
        try:
            raise ValueError("boom")
        except ValueError:
            log.exception(message, *args)

    thread = threading.Thread(target=logs.in_task(labels, work))
    thread.start()
    thread.join()


def test_json_lines_carry_time_level_task_node_udf_and_message(stderr):
    logs.configure_logging("info", "json")
    labels = logs.TaskLabels(udf="moving_avg", task_id="cpu_alert", node_id="udf2")
    logged_in_a_task(labels, "UDF %s failed on group %r", "moving_avg", "host=a")
    logging.getLogger("udf_agent.serve.socket_server").info("listening")  # no task's thread
    first, second = (json.loads(line) for line in stderr.getvalue().splitlines())
    assert (first["level"], first["taskID"], first["nodeID"], first["udf"]) == ("error", "cpu_alert", "udf2", "moving_avg")
    assert first["message"] == "UDF moving_avg failed on group 'host=a'" and first["logger"] == "udf_agent.runtime.agent"
    assert first["time"].endswith("Z") and "T" in first["time"]
    assert (second["level"], second["taskID"], second["udf"], second["message"]) == ("info", "", "", "listening")


def test_a_json_line_holds_its_traceback_and_a_huge_message_is_cut(stderr):
    logs.configure_logging("info", "json")
    labels = logs.TaskLabels(udf="u", task_id="t", node_id="n")
    logged_in_a_task(labels, "failed", raising=True)
    logged_in_a_task(labels, "%s", "x" * (logs.MAX_LINE * 3))
    lines = stderr.getvalue().splitlines()
    assert len(lines) == 2
    failed, huge = (json.loads(line) for line in lines)
    assert "Traceback" in failed["exception"] and "ValueError: boom" in failed["exception"]
    assert huge["message"].endswith(" [line cut]") and len(huge["message"]) < logs.MAX_LINE + 20


def test_text_lines_name_the_task_once_it_is_known(stderr):
    logs.configure_logging("info", "text")
    labels = logs.TaskLabels()
    logged_in_a_task(labels, "before Init")
    labels.udf, labels.task_id, labels.node_id = "mirror", "t1", "n1"
    logged_in_a_task(labels, "after Init")
    before, after = stderr.getvalue().splitlines()
    assert before.endswith("ERROR udf_agent.runtime.agent: before Init")
    assert after.endswith("ERROR udf_agent.runtime.agent: [task=t1 node=n1 udf=mirror] after Init")


def test_foreign_lines_keep_a_json_log_one_object_a_line(stderr):
    logs.configure_logging("info", "json")
    output = logging.getLogger("spark.output")
    spark_line = json.dumps({"level": "warning", "logger": "spark.Utils", "message": "hostname resolves to a loopback address"})
    logs.foreign_line(spark_line + "\n", output)
    logs.foreign_line("WARNING: Using incubator modules: jdk.incubator.vector\n", output)
    logs.foreign_line("{not json}\n", output)
    logs.foreign_line(json.dumps({"message": "y" * (logs.MAX_LINE * 2)}), output)
    logs.foreign_line("\n", output)
    lines = [json.loads(line) for line in stderr.getvalue().splitlines()]
    assert lines[0] == json.loads(spark_line)
    assert (lines[1]["logger"], lines[1]["level"], lines[1]["message"]) == ("spark.output", "warning", "WARNING: Using incubator modules: jdk.incubator.vector")
    assert lines[2]["message"] == "{not json}"
    assert lines[3]["message"].endswith(" [line cut]")
    assert len(lines) == 4


def forwarded_from_a_task(labels, message, *args, raising=False):
    """What a shared server sends a task's relay when a thread of the task of LABELS logs
    MESSAGE (its routes take the records of that task only)."""
    routes = logs.TaskLogRoutes()
    sent = []
    routes.add(labels, sent.append)
    root = logging.getLogger()
    root.addHandler(routes)
    try:
        logged_in_a_task(logs.TaskLabels(udf="u", task_id="another", node_id="n"), "another task's")
        logging.getLogger("udf_agent.serve.socket_server").error("no task's")
        logged_in_a_task(labels, message, *args, raising=raising)
    finally:
        root.removeHandler(routes)
    return sent


def test_a_record_forwarded_to_a_relay_is_logged_there_in_its_own_format_naming_the_task(stderr):
    logs.configure_logging("info", "text")  # the server's format: not what the relay logs in
    server = logs.TaskLabels(udf="warns", task_id="cpu_alert", node_id="udf2")
    (failed,) = forwarded_from_a_task(server, "UDF %s failed", "warns", raising=True)
    (plain,) = forwarded_from_a_task(server, "dropped %d point(s) (100%% of them)", 3)
    stderr.getvalue()  # the server's own lines
    logs.configure_logging("info", "json")  # the task's --log-format
    relay = logs.TaskLabels()  # the labels of the relay's threads
    logged_in_a_task(relay, "the relay's own line, before Init")
    logs.log_forwarded(failed, relay)
    logs.log_forwarded(plain, relay)
    logged_in_a_task(relay, "the relay's own line, once the server named the task")
    before, first, second, after = (json.loads(line) for line in stderr.getvalue().splitlines())
    assert (first["level"], first["logger"], first["message"]) == ("error", "udf_agent.runtime.agent", "UDF warns failed")
    assert (first["taskID"], first["nodeID"], first["udf"]) == ("cpu_alert", "udf2", "warns")
    assert "Traceback" in first["exception"] and "ValueError: boom" in first["exception"]
    assert second["message"] == "dropped 3 point(s) (100% of them)" and "exception" not in second
    assert (before["taskID"], before["nodeID"]) == ("", "")
    assert (after["taskID"], after["nodeID"], after["udf"]) == ("cpu_alert", "udf2", "warns")


def test_a_forwarded_record_in_text_and_below_the_relays_level(stderr):
    labels = logs.TaskLabels(udf="warns", task_id="cpu_alert", node_id="udf2")
    (plain,) = forwarded_from_a_task(labels, "dropped %d point(s)", 3)
    logs.configure_logging("critical", "text")
    logs.log_forwarded(plain, logs.TaskLabels())
    assert stderr.getvalue() == ""
    logs.configure_logging("info", "text")
    logs.log_forwarded(plain, logs.TaskLabels())
    assert stderr.getvalue() == f"udf-agent[{os.getpid()}] ERROR udf_agent.runtime.agent: [task=cpu_alert node=udf2 udf=warns] dropped 3 point(s)\n"
