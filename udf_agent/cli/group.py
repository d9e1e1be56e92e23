"""The ``udf-agent`` group, and loading a command's TARGET."""

from __future__ import annotations

import contextlib
import sys
from typing import TYPE_CHECKING

import click

from udf_agent import __version__

if TYPE_CHECKING:
    from udf_agent.api import UDFSpec


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="udf-agent")
def main() -> None:
    """Kapacitor UDFs written in pandas, computed on Spark."""


def load_target(target: str, script_args: tuple[str, ...] = ()) -> UDFSpec:
    from udf_agent.targets import TargetError, resolve_target

    try:
        # A UDF module that prints on import must not pollute our output.
        with contextlib.redirect_stdout(sys.stderr):
            return resolve_target(target, script_args)
    except TargetError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None
