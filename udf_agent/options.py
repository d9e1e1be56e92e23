"""Typed option declarations and their validation against an InitRequest.

Kapacitor sends options in TICKscript call order with every value typed and
never coerced. Validation here reports every problem of one InitRequest at
once, so a TICKscript author fixes them in one round. Nothing in this module
imports pandas: it runs on the Init path, where the reader must stay quick.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from udf_agent import udf_pb2
from udf_agent.literals import literal


class Duration:
    """Kapacitor's DURATION type.

    As an option's type, ``Option("every", Duration)``, it declares a DURATION option
    (a ``pandas.Timedelta`` for the UDF). As a value, ``Duration("10s")``,
    ``Duration(10_000_000_000)`` (nanoseconds) or ``Duration(timedelta(seconds=10))``,
    it is one such option's value, as in ``udf_agent.testing.option("every", Duration("10s"))``.
    """

    def __init__(self, value: int | str | _dt.timedelta):
        if isinstance(value, bool):
            raise TypeError(f"a duration, not {value!r}")
        if isinstance(value, int):
            self.ns = value
        elif isinstance(value, _dt.timedelta):
            self.ns = timedelta_ns(value)
        else:
            parsed = literal(str(value))
            if parsed.type != udf_pb2.DURATION:
                raise ValueError(f"{value!r} is not a TICKscript duration (examples: 500ms, 10s, 5m, 1h, 1d)")
            self.ns = parsed.durationValue

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Duration) and other.ns == self.ns

    def __hash__(self) -> int:
        return hash(self.ns)

    def __repr__(self) -> str:
        return f"Duration({self.ns})"


def timedelta_ns(value: _dt.timedelta) -> int:
    """Nanoseconds of a timedelta, exactly (a ``pandas.Timedelta`` keeps nanoseconds)."""
    if hasattr(value, "value"):
        return int(value.value)
    return (value.days * 86_400 + value.seconds) * 1_000_000_000 + value.microseconds * 1_000


_TYPE_TO_WIRE: dict[type, udf_pb2.ValueType] = {
    bool: udf_pb2.BOOL,
    int: udf_pb2.INT,
    float: udf_pb2.DOUBLE,
    str: udf_pb2.STRING,
    Duration: udf_pb2.DURATION,
}
_WIRE_NAMES: dict[int, str] = {number: name for name, number in udf_pb2.ValueType.items()}
_VALUE_FIELD = {
    udf_pb2.BOOL: "boolValue",
    udf_pb2.INT: "intValue",
    udf_pb2.DOUBLE: "doubleValue",
    udf_pb2.STRING: "stringValue",
    udf_pb2.DURATION: "durationValue",
}

_REQUIRED = object()

# A validator takes the option's value (of any declared type) and returns None (or True) when
# it is fine, else False or a message.
Validator = Callable[[Any], "bool | str | None"]
# One value type, or one for each value of an option that takes several.
OptionType = type | Sequence[type]


@dataclass(frozen=True)
class Option:
    """One option a TICKscript author sets as ``.name(value, ...)``.

    ``type`` is one of bool, int, float, str, Duration, or a sequence of them
    for an option that takes several values (the UDF then gets a tuple).
    Without a ``default`` the option is required. ``multiple=True`` lets the
    option be called more than once; the UDF then gets a list of its values.
    """

    name: str
    type: OptionType
    default: Any = _REQUIRED  # a value of ``type``, or a list of them with ``multiple``
    validate: Validator | None = None
    help: str = ""
    multiple: bool = False
    example: Any = None  # a value of ``type``, for `info`'s TICKscript example
    value_types: tuple[udf_pb2.ValueType, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        types = tuple(self.type) if isinstance(self.type, (list, tuple)) else (self.type,)
        if not types:
            raise TypeError(f"option {self.name!r} declares no value type")
        unknown = [t for t in types if t not in _TYPE_TO_WIRE]
        if unknown:
            raise TypeError(
                f"option {self.name!r}: unsupported type {unknown[0]!r} "
                "(use bool, int, float, str or udf_agent.Duration)"
            )
        object.__setattr__(self, "value_types", tuple(_TYPE_TO_WIRE[t] for t in types))

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED and not self.multiple

    def type_names(self) -> list[str]:
        return [_WIRE_NAMES[t] for t in self.value_types]

    def default_value(self) -> Any:
        if self.multiple and self.default is _REQUIRED:
            return []
        return self.default


def field_name(value: str) -> bool | str:
    """Validator: a field name, not empty."""
    return value.strip() != "" or "must be a field name, got an empty string"


def positive(value: float) -> bool | str:
    """Validator: greater than zero."""
    return value > 0 or f"must be > 0, got {value}"


def at_least(low: float) -> Validator:
    """Validator factory: at least LOW."""
    return lambda value: value >= low or f"must be >= {low:g}, got {value}"


class OptionValues(Mapping[str, Any]):
    """Options as the UDF sees them: ``opts["as"]`` or ``opts.size``.

    Durations are kept as int64 nanoseconds on the wire side and become
    ``pandas.Timedelta`` only when read, so validation never imports pandas.
    ``durations`` maps an option name to the value positions that are
    DURATIONs (position 0 for a single-value option).
    """

    def __init__(self, values: Mapping[str, Any], durations: Mapping[str, Sequence[int]] | None = None):
        self._values = dict(values)
        self._durations = {name: tuple(positions) for name, positions in (durations or {}).items()}

    def raw(self) -> dict[str, Any]:
        """Values with durations as nanoseconds, as they travel to workers and snapshots."""
        return dict(self._values)

    def __getitem__(self, name: str) -> Any:
        value = self._values[name]
        positions = self._durations.get(name)
        return _with_timedeltas(value, positions) if positions else value

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"OptionValues({self._values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (OptionValues, (self._values, self._durations))


def _with_timedeltas(value: Any, positions: Sequence[int]) -> Any:
    """Turns the DURATION positions of one option's value into Timedeltas."""
    import pandas as pd

    if isinstance(value, list):  # a `multiple` option: one value per call
        return [_with_timedeltas(v, positions) for v in value]
    if isinstance(value, tuple):
        return tuple(pd.Timedelta(v, unit="ns") if i in positions else v for i, v in enumerate(value))
    return pd.Timedelta(value, unit="ns")


def duration_positions(declared: Sequence[Option]) -> dict[str, tuple[int, ...]]:
    """For each option with DURATION values, the positions of those values."""
    positions = {}
    for option in declared:
        found = tuple(i for i, t in enumerate(option.value_types) if t == udf_pb2.DURATION)
        if found:
            positions[option.name] = found
    return positions


class OptionsError(ValueError):
    """All problems found in one InitRequest, one per line."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_options(declared: Sequence[Option], given: Sequence[udf_pb2.Option]) -> OptionValues:
    """Checks Kapacitor's options against the declarations; raises OptionsError listing every problem."""
    by_name = {o.name: o for o in declared}
    problems: list[str] = []
    values: dict[str, Any] = {}
    given_names = [option.name for option in given]
    for option in given:
        spec = by_name.get(option.name)
        if spec is None:
            known = ", ".join(sorted(by_name)) or "none"
            problems.append(f"unknown option {option.name!r} (known options: {known})")
            continue
        value = _option_value(spec, option, problems)
        times = given_names.count(spec.name)
        if times > 1 and not spec.multiple:
            if option is given[given_names.index(spec.name)]:
                problems.append(f"option {spec.name!r} is given {times} times but takes one call")
            continue
        if value is _REQUIRED:
            continue
        if spec.multiple:
            values.setdefault(spec.name, []).append(value)
        else:
            values[spec.name] = value
    for spec in declared:
        if spec.name in values or spec.name in given_names:
            continue
        if spec.required:
            problems.append(f"missing required option {spec.name!r} ({_signature(spec)})")
        else:
            values[spec.name] = spec.default_value()
    for spec in declared:
        if spec.validate is None or spec.name not in values or spec.name not in given_names:
            continue
        message = _run_validator(spec, values[spec.name])
        if message:
            problems.append(message)
    if problems:
        raise OptionsError(problems)
    return OptionValues(values, duration_positions(declared))


def _option_value(spec: Option, option: udf_pb2.Option, problems: list[str]) -> Any:
    if len(option.values) != len(spec.value_types):
        problems.append(
            f"option {spec.name!r} takes {len(spec.value_types)} value(s) ({_signature(spec)}), "
            f"got {len(option.values)}"
        )
        return _REQUIRED
    values = []
    for position, (wire_value, wanted) in enumerate(zip(option.values, spec.value_types), 1):
        if wire_value.type != wanted:
            where = f" value {position}" if len(spec.value_types) > 1 else ""
            problems.append(
                f"option {spec.name!r}{where} must be {_WIRE_NAMES[wanted]}, "
                f"got {_WIRE_NAMES.get(wire_value.type, wire_value.type)}"
            )
            return _REQUIRED
        values.append(getattr(wire_value, _VALUE_FIELD[wanted]))
    return values[0] if len(values) == 1 else tuple(values)


def _run_validator(spec: Option, value: Any) -> str | None:
    positions = duration_positions([spec]).get(spec.name)
    if spec.validate is None:
        return None
    try:
        verdict = spec.validate(_with_timedeltas(value, positions) if positions else value)
    except Exception as exc:  # a validator that raises is reporting a problem
        return f"option {spec.name!r}: {exc}"
    if verdict is None or verdict is True:
        return None
    if verdict is False:
        return f"option {spec.name!r}: invalid value {value!r}"
    return f"option {spec.name!r}: {verdict}"


def _signature(spec: Option) -> str:
    return ", ".join(spec.type_names())


def option_info(declared: Sequence[Option]) -> dict[str, udf_pb2.OptionInfo]:
    return {o.name: udf_pb2.OptionInfo(valueTypes=o.value_types) for o in declared}
