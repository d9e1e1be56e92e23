"""UDF options written as in a TICKscript call, typed and checked the way Kapacitor does.

``size=10`` is ``.size(10)``: ``10`` is INT, ``1.5`` DOUBLE, ``'avg'`` (or a bare
``avg``) STRING, ``true`` BOOL and ``10s`` DURATION; ``field='a','b'`` passes two
values. Kapacitor types each literal and never coerces, then checks the call
against the UDF's InfoResponse; the messages here are Kapacitor's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from udf_agent import udf_pb2

# TICKscript duration units (tick/ast/lex.go): u and µ are microseconds, no ns.
_DURATION_UNITS = {"u": 1_000, "µ": 1_000, "ms": 1_000_000, "s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000, "d": 86_400_000_000_000, "w": 604_800_000_000_000}
_DURATION = re.compile(r"^(-?\d+)(u|µ|ms|s|m|h|d|w)$")
_INT = re.compile(r"^-?\d+$")
_FLOAT = re.compile(r"^-?(\d+\.\d*|\.\d+)$")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class TickError(ValueError):
    """An option that is not a TICKscript call, or one Kapacitor would refuse."""


def literal(text: str) -> udf_pb2.OptionValue:
    """One TICKscript literal as Kapacitor types it."""
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
        return udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=int(duration.group(1)) * _DURATION_UNITS[duration.group(2)])
    if not text:
        raise TickError("an empty value: write '' for an empty string")
    return udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=text)


def parse_call(assignment: str) -> udf_pb2.Option:
    """``NAME=VALUE[,VALUE...]`` as the Option of the call ``.NAME(VALUE, ...)``."""
    name, sep, values = assignment.partition("=")
    name = name.strip().lstrip(".")
    if not sep or not _NAME.match(name):
        raise TickError(f"{assignment!r} is not NAME=VALUE (for example size=10, field='usage', period=10s)")
    return udf_pb2.Option(name=name, values=[literal(value) for value in _split_values(values)])


def _split_values(text: str) -> list[str]:
    """Splits at commas outside single quotes."""
    values: list[str] = []
    current: list[str] = []
    quoted = False
    for index, char in enumerate(text):
        if char == "'" and (index == 0 or text[index - 1] != "\\"):
            quoted = not quoted
        if char == "," and not quoted:
            values.append("".join(current))
            current = []
        else:
            current.append(char)
    if quoted:
        raise TickError(f"unterminated string in {text!r}")
    values.append("".join(current))
    return values


def check_call(udf: str, info: Mapping[str, udf_pb2.OptionInfo], call: udf_pb2.Option) -> None:
    """Refuses a call as Kapacitor does when it checks a TICKscript against the UDF's Info."""
    declared = info.get(call.name)
    if declared is None:
        raise TickError(f'no method or property "{call.name}" on UDF {udf} (its options: {", ".join(sorted(info)) or "none"})')
    expected = list(declared.valueTypes)
    if len(call.values) != len(expected):
        raise TickError(f"unexpected number of args to {call.name}, got {len(call.values)} expected {len(expected)}")
    for value, wanted in zip(call.values, expected):
        if value.type != wanted:
            raise TickError(f"unexpected arg to {call.name}, got {udf_pb2.ValueType.Name(value.type)} expected {udf_pb2.ValueType.Name(wanted)}")
