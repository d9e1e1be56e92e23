"""Values as people write them: TICKscript literals, typed as Kapacitor types them, and the
command line's durations.

A leaf (it needs only the protocol's types): ``options`` parses ``Duration("10s")`` with it
and ``tools.tickscript`` parses and writes TICKscript calls with it, so the duration units
are written once, here.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from udf_agent import udf_pb2

# TICKscript duration units in nanoseconds (tick/ast/lex.go): u and µ are microseconds, no ns.
DURATION_UNITS = {"u": 1_000, "µ": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000, "w": 604_800_000_000_000}
_DURATION = re.compile(rf"^(-?\d+)({'|'.join(DURATION_UNITS)})$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(\d+\.\d*|\.\d+)$")

# The command line's durations (--flush-interval 500ms) take a decimal count and Go's
# spelling of the small units (ns, us, µs), but no days or weeks: a syntax of their own.
_COMMAND_LINE_UNITS = {"ns": 1, "us": DURATION_UNITS["u"], "µs": DURATION_UNITS["µ"], **{unit: DURATION_UNITS[unit] for unit in ("ms", "s", "m", "h")}}
_COMMAND_LINE_DURATION = re.compile(rf"^\s*(\d+(?:\.\d+)?)\s*({'|'.join(_COMMAND_LINE_UNITS)})\s*$")


class TickError(ValueError):
    """An option that is not a TICKscript call, or one Kapacitor would refuse."""


def literal(text: str) -> udf_pb2.OptionValue:
    """One TICKscript literal as Kapacitor types it."""
    from udf_agent import udf_pb2  # here: the command line of a relaying task needs no protobuf

    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=text[1:-1].replace("\\'", "'"))
    if text in ("true", "TRUE", "false", "FALSE"):
        return udf_pb2.OptionValue(type=udf_pb2.BOOL, boolValue=text.lower() == "true")
    if _INT.match(text):
        return udf_pb2.OptionValue(type=udf_pb2.INT, intValue=int(text))
    if _FLOAT.match(text):
        return udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=float(text))
    duration = _DURATION.match(text)
    if duration:
        return udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=int(duration.group(1)) * DURATION_UNITS[duration.group(2)])
    if not text:
        raise TickError("an empty value: write '' for an empty string")
    return udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=text)


def command_line_seconds(text: str) -> float | None:
    """A command-line duration (250ms, 1.5s, 2m) in seconds; None when TEXT is not one."""
    match = _COMMAND_LINE_DURATION.match(text)
    if not match:
        return None
    # Nanoseconds / 1e9 is exactly the float of the unit in seconds (1e-3 for ms and so on).
    return float(match.group(1)) * (_COMMAND_LINE_UNITS[match.group(2)] / 1e9)
