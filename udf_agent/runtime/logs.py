"""Logging to stderr only, in lines Kapacitor can carry, as text or one JSON object a line.

Kapacitor logs a process UDF's stderr line by line, and a single line over
64 KiB stops its reader (the UDF then blocks on stderr): long lines are cut.

A line logged on behalf of a task (by its agent's threads) names the task: Kapacitor's task and
node IDs from its InitRequest, and the UDF. A server with many tasks (``serve``, the shared
server) would otherwise log lines no one can attribute.
"""

from __future__ import annotations

import contextvars
import logging
import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

MAX_LINE = 8 * 1024
LOG_FORMATS = ("text", "json")

T = TypeVar("T")


class TaskLabels:  # not a dataclass: a relay (which logs through here) starts sooner without
    """Who a task is, as its log lines say: filled in as the agent learns it."""

    __slots__ = ("udf", "task_id", "node_id")

    def __init__(self, udf: str = "", task_id: str = "", node_id: str = ""):
        self.udf, self.task_id, self.node_id = udf, task_id, node_id

    def text(self) -> str:
        named = " ".join(f"{key}={value}" for key, value in (("task", self.task_id), ("node", self.node_id), ("udf", self.udf)) if value)
        return f"[{named}] " if named else ""


_current_task: contextvars.ContextVar[TaskLabels | None] = contextvars.ContextVar("udf_agent_task", default=None)


def label_thread(labels: TaskLabels) -> None:
    """Lines this thread logs from now on name the task of ``labels``."""
    _current_task.set(labels)


def in_task(labels: TaskLabels, target: Callable[..., T]) -> Callable[..., T]:
    """``target``, for a thread of the task of ``labels``: its lines name the task."""

    def labelled(*args: Any, **kwargs: Any) -> T:
        label_thread(labels)
        return target(*args, **kwargs)

    return labelled


_NO_TASK = TaskLabels()


class _TaskFilter(logging.Filter):
    """Gives every record the labels of the task whose thread logs it (empty otherwise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.task = _current_task.get() or _NO_TASK
        return True


def _cut(line: str) -> str:
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + " [line cut]"


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record.task_text = record.task.text()  # type: ignore[attr-defined]
        return "\n".join(_cut(line) for line in super().format(record).split("\n"))


class _JsonFormatter(logging.Formatter):
    """One JSON object a line: a traceback travels inside it, never on lines of its own."""

    def format(self, record: logging.LogRecord) -> str:
        import datetime
        import json

        task: TaskLabels = record.task  # type: ignore[attr-defined]
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "pid": record.process,
            "logger": record.name,
            "taskID": task.task_id,
            "nodeID": task.node_id,
            "udf": task.udf,
            "message": _cut(record.getMessage()),
        }
        if record.exc_info:
            entry["exception"] = _cut(self.formatException(record.exc_info))
        return json.dumps(entry, ensure_ascii=False)


def _not_py4j_chatter(record: logging.LogRecord) -> bool:
    # py4j also logs through the root logger, at INFO with tracebacks, whenever a
    # connection to a JVM breaks (a JVM being replaced, Spark stopping).
    return record.levelno >= logging.WARNING or f"{os.sep}py4j{os.sep}" not in record.pathname


_format = "text"


def log_format() -> str:
    """The format this process logs in ('text' or 'json'): what Spark's JVM is told to log in too."""
    return _format


def foreign_line(line: str, logger: logging.Logger) -> None:
    """A line another program (Spark's JVM, its Python workers) wrote to our stderr, in the
    process's format: in JSON a line that is a JSON object already passes as it is, and any
    other becomes a warning of ``logger``. Nothing else may break a log of one JSON object a line."""
    line = line.rstrip("\n")
    if not line:
        return
    if line.startswith("{") and line.endswith("}"):
        import json

        try:
            entry = json.loads(line)
        except ValueError:
            entry = None
        if isinstance(entry, dict):
            if len(line) > MAX_LINE:
                line = json.dumps({key: _cut(value) if isinstance(value, str) else value for key, value in entry.items()}, ensure_ascii=False)
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            return
    logger.warning("%s", line)


def configure_logging(level: str, log_format: str = "text") -> None:
    global _format
    _format = log_format
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter(f"udf-agent[{os.getpid()}] %(levelname)s %(name)s: %(task_text)s%(message)s"))
    handler.addFilter(_TaskFilter())
    handler.addFilter(_not_py4j_chatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Spark's py4j client is chatty at INFO.
    logging.getLogger("py4j").setLevel(max(logging.WARNING, root.level))
