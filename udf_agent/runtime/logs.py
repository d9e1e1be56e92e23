"""Logging to stderr only, in lines Kapacitor can carry.

Kapacitor logs a process UDF's stderr line by line, and a single line over
64 KiB stops its reader (the UDF then blocks on stderr): long lines are cut.
"""

from __future__ import annotations

import logging
import os
import sys

MAX_LINE = 8 * 1024


class _LineLimitFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return "\n".join(line if len(line) <= MAX_LINE else line[:MAX_LINE] + " [line cut]" for line in text.split("\n"))


def _not_py4j_chatter(record: logging.LogRecord) -> bool:
    # py4j also logs through the root logger, at INFO with tracebacks, whenever a
    # connection to a JVM breaks (a JVM being replaced, Spark stopping).
    return record.levelno >= logging.WARNING or f"{os.sep}py4j{os.sep}" not in record.pathname


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LineLimitFormatter(f"udf-agent[{os.getpid()}] %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(_not_py4j_chatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Spark's py4j client is chatty at INFO.
    logging.getLogger("py4j").setLevel(max(logging.WARNING, root.level))
