"""The ``udf-agent`` command.

Kapacitor starts a task's process and asks it for Info at once. A task started with the same
command line as an earlier one, whose shared server still listens, joins that server as the
earlier one did (``serve/shared.py``, "Remembered launches") without importing the command
line's machinery; anything else goes to the click command (``cli/``).
"""

from __future__ import annotations

import functools
import sys


def main() -> None:
    argv = sys.argv[1:]
    if argv[:1] == ["run"]:
        _rejoin_remembered(argv)  # returns only when there is nothing to rejoin
    from udf_agent.cli import main as cli

    cli(args=argv, prog_name="udf-agent", obj=argv)


def _rejoin_remembered(argv: list[str]) -> None:
    from udf_agent.serve.relay import relay_stdio
    from udf_agent.serve.shared import SharedServerError, recall_launch, rejoin

    try:
        launch = recall_launch(argv)
        welcome = None if launch is None else rejoin(launch)
    except SharedServerError:
        return  # the command line's own path meets the same fault and reports it
    if launch is not None and welcome is not None:
        start = launch.start
        carry_over = None if start is None else functools.partial(start.join, launch.server, launch.hello)
        relay_stdio(lambda: welcome, launch.log_level, launch.log_format, launch.asked_of_server, rejoin=carry_over)
