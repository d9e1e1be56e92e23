"""Logging to stderr only, in lines Kapacitor can carry, as text or one JSON object a line.

Kapacitor logs a process UDF's stderr line by line, and a single line over
64 KiB stops its reader (the UDF then blocks on stderr): long lines are cut.

A line logged on behalf of a task (by its agent's threads) names the task: Kapacitor's task and
node IDs from its InitRequest, and the UDF. A server with many tasks (``serve``, the shared
server) would otherwise log lines no one can attribute.

The shared server also hands each relayed task's records to that task's relay
(``TaskLogRoutes``, ``forwarded_record``), which logs them on the task's own stderr
(``log_forwarded``), in the format and at the level of the task's own command line.
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
        if not hasattr(record, "task"):  # a record a shared server forwarded names its task already
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
        exception = _exception_text(record)
        if exception:
            entry["exception"] = _cut(exception)
        return json.dumps(entry, ensure_ascii=False)


def _exception_text(record: logging.LogRecord) -> str:
    """The traceback a record carries: formatted already (a forwarded record's), or from its exc_info."""
    if record.exc_text:
        return record.exc_text
    return logging.Formatter().formatException(record.exc_info) if record.exc_info else ""


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
        handler.setFormatter(_TextFormatter("udf-agent[%(process)d] %(levelname)s %(name)s: %(task_text)s%(message)s"))
    handler.addFilter(_TaskFilter())
    handler.addFilter(_not_py4j_chatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Spark's py4j client is chatty at INFO.
    logging.getLogger("py4j").setLevel(max(logging.WARNING, root.level))


class TaskLogRoutes(logging.Handler):
    """The shared server's handler that hands each record a task's thread logs to that
    task's route (its relay's link), as ``forwarded_record``. Records of no task's thread
    (Spark's JVM, the resident workers' common events) go to no route: the server's log has
    them, as it has every record."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(_not_py4j_chatter)
        self._routes: dict[TaskLabels, Callable[[bytes], None]] = {}

    def add(self, labels: TaskLabels, route: Callable[[bytes], None]) -> None:
        """Records logged by the threads of the task of ``labels`` go to ``route`` (which must not block)."""
        self._routes[labels] = route

    def remove(self, labels: TaskLabels) -> None:
        self._routes.pop(labels, None)

    def emit(self, record: logging.LogRecord) -> None:
        labels = _current_task.get()
        route = None if labels is None else self._routes.get(labels)
        if labels is None or route is None:
            return
        try:
            route(forwarded_record(record, labels))
        except Exception:
            self.handleError(record)


def forwarded_record(record: logging.LogRecord, labels: TaskLabels) -> bytes:
    """``record``, logged for the task of ``labels``, as the shared server sends it to that
    task's relay: one JSON object, formatted there (``log_forwarded``)."""
    import json

    return json.dumps(
        {
            "time": record.created,
            "levelno": record.levelno,
            "logger": record.name,
            "pid": record.process,
            "message": _cut(record.getMessage()),
            "exception": _cut(_exception_text(record)),
            "taskID": labels.task_id,
            "nodeID": labels.node_id,
            "udf": labels.udf,
        },
        ensure_ascii=False,
    ).encode()


def log_forwarded(data: bytes, labels: TaskLabels) -> None:
    """A record the shared server forwarded (``forwarded_record``), logged by this relay as
    its own would be: in this process's format, if its level is enabled here. ``labels`` (the
    relay's own lines') take the task's IDs from it, so those lines name the task once it has
    them (from Init on)."""
    import json

    entry = json.loads(data)
    labels.udf, labels.task_id, labels.node_id = entry["udf"], entry["taskID"], entry["nodeID"]
    root = logging.getLogger()
    if not root.isEnabledFor(entry["levelno"]):
        return
    record = logging.makeLogRecord(
        {
            "name": entry["logger"],
            "levelno": entry["levelno"],
            "levelname": logging.getLevelName(entry["levelno"]),
            "msg": entry["message"],
            "created": entry["time"],
            "process": entry["pid"],
            "exc_text": entry["exception"] or None,
            "task": TaskLabels(entry["udf"], entry["taskID"], entry["nodeID"]),
        }
    )
    root.handle(record)
