"""TICKscript both ways: UDF options read from a TICKscript call, and options written as one.

Reading: ``size=10`` is ``.size(10)``: ``10`` is INT, ``1.5`` DOUBLE, ``'avg'`` (or a bare
``avg``) STRING, ``true`` BOOL and ``10s`` DURATION; ``field='a','b'`` passes two
values. Kapacitor types each literal and never coerces (``udf_agent.literals``), then
checks the call against the UDF's InfoResponse; the messages here are Kapacitor's own.

Writing: an option's default or example as the arguments of its call, for ``info``.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Mapping

from udf_agent import udf_pb2
from udf_agent.literals import DURATION_UNITS, TickError, literal
from udf_agent.options import Duration, Option, timedelta_ns

__all__ = ["TickError", "check_call", "literal", "parse_call", "render_arguments", "render_duration", "render_example", "render_literal"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# The units a duration is written in, largest first: days and weeks are written in hours.
_WRITTEN_UNITS = tuple((unit, DURATION_UNITS[unit]) for unit in ("h", "m", "s", "ms", "u"))
# An example for a required option that declares none, by type.
_SAMPLES = {udf_pb2.BOOL: "TRUE", udf_pb2.INT: "1", udf_pb2.DOUBLE: "1.0", udf_pb2.STRING: "'value'", udf_pb2.DURATION: "1s"}


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


def render_example(option: Option) -> str:
    """The arguments of a sample call of OPTION: its default, else its example, else a value of its type."""
    if not option.required:
        return render_arguments(option.default_value(), option)
    if option.example is not None:
        return render_arguments(option.example, option)
    return ", ".join(_SAMPLES[t] for t in option.value_types)


def render_arguments(value: object, option: Option) -> str:
    """An option's value as the arguments of its TICKscript call (a tuple for several values)."""
    if isinstance(value, tuple):
        return ", ".join(render_literal(v, t) for v, t in zip(value, option.value_types))
    return render_literal(value, option.value_types[0])


def render_literal(value: object, wire_type: int) -> str:
    """One value as a TICKscript literal; an int that is a DURATION counts nanoseconds."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, datetime.timedelta):
        return render_duration(timedelta_ns(value))
    if isinstance(value, Duration):
        return render_duration(value.ns)
    if isinstance(value, int) and wire_type == udf_pb2.DURATION:
        return render_duration(value)
    if isinstance(value, float):
        text = repr(value)
        return text if "e" not in text else f"{value:.20f}".rstrip("0")
    return repr(value)


def render_duration(ns: int) -> str:
    """Nanoseconds as a TICKscript duration, in the largest unit that divides them."""
    for unit, size in _WRITTEN_UNITS:
        if ns and ns % size == 0:
            return f"{ns // size}{unit}"
    return f"{ns}ns"
