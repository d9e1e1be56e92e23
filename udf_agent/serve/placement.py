"""Where a ``run`` task computes: relayed to the host's shared server, or in its own process.

Decided twice: by entry.py before anything else loads (``relays_for_sure``: the relay's input
then starts at once), and by the ``run`` command once click has parsed the command line
(``relays``). Imports nothing of the package: entry.py decides in the process's first moment.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from udf_agent.serve.relay_input import RelayInput

# Built-ins declared compute=False (tests keep the two in step), which have no Spark to share:
# relaying one would only add a hop. Named here so that neither entry.py nor a relay need
# import the built-ins.
SPARK_FREE_BUILTINS = frozenset({"mirror"})
# Words on a ``run`` command line that may keep it in its own process, or print to stdout.
_MAY_NOT_RELAY = frozenset({"--own-spark", "-h", "--help", *SPARK_FREE_BUILTINS})
# UDF_AGENT_OWN_SPARK values that leave --own-spark off (click's false words, and empty).
_OWN_SPARK_OFF = frozenset({"", "0", "false", "f", "no", "n", "off"})


class Invocation(NamedTuple):
    """What entry.py hands the click command: the raw command line, and the task's input if
    the relay started reading it already."""

    argv: list[str]
    relay_input: RelayInput | None


def relays(target: str, own_spark: bool) -> bool:
    """Whether a parsed ``run`` of ``target`` computes on the shared server."""
    return not own_spark and target not in SPARK_FREE_BUILTINS


def relays_for_sure(argv: list[str], environ: Mapping[str, str]) -> bool:
    """Whether ``argv`` is a ``run`` that relays, whatever its options say: none of the words
    that could keep it in its own process (or print help) appear anywhere in it. A command
    line this calls False may still relay; its relay then starts once the command is parsed."""
    return (
        argv[:1] == ["run"] and len(argv) > 1 and _MAY_NOT_RELAY.isdisjoint(argv) and environ.get("UDF_AGENT_OWN_SPARK", "").strip().lower() in _OWN_SPARK_OFF
    )
