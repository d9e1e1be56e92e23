"""The ``udf-agent`` command: click wiring only. Each command hands its work to the room
that does it (runtime, serve, tools)."""

from udf_agent.cli import tasks, tools  # noqa: F401 - each registers its commands on main
from udf_agent.cli.group import main

__all__ = ["main"]
