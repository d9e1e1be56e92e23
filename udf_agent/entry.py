"""The ``udf-agent`` command.

Kapacitor starts a task's process and asks it for Info at once, and its watchdog counts from
then. A ``run`` that is sure to relay to the shared server (``serve/placement.py``) starts the
relay's input (``serve/relay_input.py``) first, before the rest of the process loads: the
keepalives are answered from the interpreter's first moment. A task started with the same
command line as an earlier one, whose shared server still listens, then joins that server as
the earlier one did (``serve/shared.py``, "Remembered launches") without importing the command
line's machinery; anything else goes to the click command (``cli/``).
"""

from __future__ import annotations

import functools
import os
import sys
from typing import TYPE_CHECKING

from udf_agent.serve.placement import Invocation, relays_for_sure

if TYPE_CHECKING:
    from udf_agent.serve.relay_input import RelayInput


def main() -> None:
    argv = sys.argv[1:]
    relay_input = None
    if relays_for_sure(argv, os.environ):
        from udf_agent.serve.relay_input import RelayInput

        relay_input = RelayInput.from_stdio()
    if argv[:1] == ["run"]:
        _rejoin_remembered(argv, relay_input)  # returns only when there is nothing to rejoin
    from udf_agent.cli import main as cli

    cli(args=argv, prog_name="udf-agent", obj=Invocation(argv, relay_input))


def _rejoin_remembered(argv: list[str], relay_input: RelayInput | None) -> None:
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
        relay_stdio(lambda: welcome, launch.log_level, launch.log_format, launch.asked_of_server, rejoin=carry_over, started=relay_input)
