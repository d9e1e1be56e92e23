"""Tests for udf_agent.options: typed option declarations checked against an InitRequest."""

from __future__ import annotations

import pickle
import re
import subprocess
import sys

import pandas as pd
import pytest

from udf_agent import udf_pb2
from udf_agent.options import (
    Duration,
    Option,
    OptionsError,
    OptionValues,
    option_info,
    parse_options,
)

SECOND = 1_000_000_000
# The wording of the "called twice" problem is not fixed; its meaning is.
GIVEN_TWICE = re.compile(r"more than once|twice|\b\d+ times")

# ---------------------------------------------------------------------------
# helpers: build what Kapacitor sends


def v_bool(x: bool) -> udf_pb2.OptionValue:
    return udf_pb2.OptionValue(type=udf_pb2.BOOL, boolValue=x)


def v_int(x: int) -> udf_pb2.OptionValue:
    return udf_pb2.OptionValue(type=udf_pb2.INT, intValue=x)


def v_double(x: float) -> udf_pb2.OptionValue:
    return udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=x)


def v_str(x: str) -> udf_pb2.OptionValue:
    return udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=x)


def v_dur(ns: int) -> udf_pb2.OptionValue:
    return udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=ns)


def opt(name: str, *values: udf_pb2.OptionValue) -> udf_pb2.Option:
    return udf_pb2.Option(name=name, values=list(values))


def init(*options: udf_pb2.Option) -> udf_pb2.InitRequest:
    """Options as they arrive: through a real serialised InitRequest."""
    req = udf_pb2.InitRequest(options=list(options), taskID="task", nodeID="customFunc4")
    return udf_pb2.InitRequest.FromString(req.SerializeToString())


def problems_of(declared, *given) -> list[str]:
    with pytest.raises(OptionsError) as info:
        parse_options(declared, init(*given).options)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == "; ".join(info.value.problems)
    return info.value.problems


# ---------------------------------------------------------------------------
# the five types


@pytest.mark.parametrize(
    "pytype, wire, expected",
    [
        (bool, v_bool(True), True),
        (bool, v_bool(False), False),
        (int, v_int(-42), -42),
        (int, v_int(2**62), 2**62),
        (float, v_double(1.5), 1.5),
        (float, v_double(-0.25), -0.25),
        (str, v_str("usage"), "usage"),
        (str, v_str(""), ""),
        (str, v_str("é☃"), "é☃"),
    ],
)
def test_scalar_types(pytype, wire, expected):
    opts = parse_options([Option("x", pytype)], init(opt("x", wire)).options)
    assert opts["x"] == expected
    assert type(opts["x"]) is pytype
    assert opts.x == expected
    assert opts.raw() == {"x": expected}


def test_duration_reads_as_timedelta_and_raw_keeps_ns():
    opts = parse_options([Option("every", Duration)], init(opt("every", v_dur(1_500_000_000))).options)
    value = opts["every"]
    assert isinstance(value, pd.Timedelta)
    assert value == pd.Timedelta(seconds=1.5)
    assert opts.every == pd.Timedelta("1500ms")
    raw = opts.raw()
    assert raw == {"every": 1_500_000_000}
    assert type(raw["every"]) is int
    # raw() is a copy
    raw["every"] = 0
    assert opts.raw()["every"] == 1_500_000_000


def test_the_info_and_init_path_imports_nothing_heavy():
    # Info must come within 1 s of process start: no pandas, numpy, pyarrow or pyspark before it.
    code = (
        "import sys\n"
        "import udf_agent.runtime.agent, udf_agent.cli, udf_agent.runtime.transports\n"
        "from udf_agent import udf_pb2\n"
        "from udf_agent.runtime.session import Session\n"
        "from udf_agent.targets import resolve_target\n"
        "from udf_agent.options import Option, Duration, parse_options\n"
        "session = Session(resolve_target('moving_avg'), max_batch_points=10)\n"
        "session.receive(udf_pb2.Request(info=udf_pb2.InfoRequest()), 0.0)\n"
        "v = udf_pb2.OptionValue(type=udf_pb2.DURATION, durationValue=5)\n"
        "o = parse_options([Option('d', Duration), Option('n', int, default=1)],"
        " [udf_pb2.Option(name='d', values=[v])])\n"
        "assert o.raw() == {'d': 5, 'n': 1}\n"
        "print(sorted(m for m in ('pandas', 'numpy', 'pyarrow', 'pyspark') if m in sys.modules))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_multi_value_option_gives_a_tuple():
    opts = parse_options(
        [Option("range", [int, float, str])],
        init(opt("range", v_int(3), v_double(0.5), v_str("x"))).options,
    )
    assert opts.range == (3, 0.5, "x")
    assert isinstance(opts.range, tuple)


# ---------------------------------------------------------------------------
# Kapacitor's reference call: .opt1('count').opt2(FALSE, 1, 1.0, '1.0', 1s)

REFERENCE_DECLARED = [Option("opt1", str), Option("opt2", [bool, int, float, str, Duration])]


def reference_given():
    return init(
        opt("opt1", v_str("count")),
        opt("opt2", v_bool(False), v_int(1), v_double(1.0), v_str("1.0"), v_dur(SECOND)),
    ).options


def test_reference_call_parses_and_raw_values():
    opts = parse_options(REFERENCE_DECLARED, reference_given())
    assert opts["opt1"] == "count"
    assert opts.opt1 == "count"
    raw = opts.raw()
    assert raw == {"opt1": "count", "opt2": (False, 1, 1.0, "1.0", SECOND)}
    assert [type(x) for x in raw["opt2"]] == [bool, int, float, str, int]


def test_reference_call_reads_back_typed_values():
    opts = parse_options(REFERENCE_DECLARED, reference_given())
    opt2 = opts["opt2"]
    assert opt2 == (False, 1, 1.0, "1.0", pd.Timedelta(seconds=1))
    assert [type(x) for x in opt2] == [bool, int, float, str, pd.Timedelta]


def test_int_next_to_duration_stays_int():
    opts = parse_options([Option("w", [int, Duration])], init(opt("w", v_int(1), v_dur(SECOND))).options)
    assert opts.w == (1, pd.Timedelta(seconds=1))
    assert type(opts.w[0]) is int


def test_validator_of_mixed_option_sees_declared_types():
    seen = []

    def check(value):
        seen.append(value)
        return isinstance(value[0], bool) and isinstance(value[1], pd.Timedelta)

    parse_options(
        [Option("p", [bool, Duration], validate=check)],
        init(opt("p", v_bool(True), v_dur(SECOND))).options,
    )
    assert seen == [(True, pd.Timedelta(seconds=1))]


def test_reference_call_order_and_types_from_option_info():
    info = option_info(REFERENCE_DECLARED)
    assert list(info) == ["opt1", "opt2"]
    assert list(info["opt1"].valueTypes) == [udf_pb2.STRING]
    assert list(info["opt2"].valueTypes) == [
        udf_pb2.BOOL,
        udf_pb2.INT,
        udf_pb2.DOUBLE,
        udf_pb2.STRING,
        udf_pb2.DURATION,
    ]


# ---------------------------------------------------------------------------
# given twice / multiple


def test_option_given_twice_is_an_error():
    problems = problems_of([Option("field", str)], opt("field", v_str("a")), opt("field", v_str("b")))
    assert len(problems) == 1
    assert "'field'" in problems[0] and GIVEN_TWICE.search(problems[0])


def test_multiple_option_collects_a_list_in_call_order():
    declared = [Option("field", str, multiple=True)]
    opts = parse_options(declared, init(opt("field", v_str("a")), opt("field", v_str("b")), opt("field", v_str("c"))).options)
    assert opts.field == ["a", "b", "c"]
    opts = parse_options(declared, init(opt("field", v_str("only"))).options)
    assert opts.field == ["only"]


def test_multiple_option_not_given_is_an_empty_list_not_missing():
    decl = Option("field", str, multiple=True)
    assert not decl.required
    opts = parse_options([decl], init().options)
    assert opts.field == []


def test_multiple_tuple_option_gives_a_list_of_tuples():
    opts = parse_options(
        [Option("map", [str, str], multiple=True)],
        init(opt("map", v_str("a"), v_str("b")), opt("map", v_str("c"), v_str("d"))).options,
    )
    assert opts.map == [("a", "b"), ("c", "d")]


def test_multiple_duration_option_gives_timedeltas():
    opts = parse_options(
        [Option("every", Duration, multiple=True)],
        init(opt("every", v_dur(SECOND)), opt("every", v_dur(60 * SECOND))).options,
    )
    assert opts.every == [pd.Timedelta(seconds=1), pd.Timedelta(minutes=1)]
    assert opts.raw()["every"] == [SECOND, 60 * SECOND]


# ---------------------------------------------------------------------------
# wrong types: no coercion


@pytest.mark.parametrize(
    "pytype, wire, expected_name, got_name",
    [
        (float, v_int(2), "DOUBLE", "INT"),
        (int, v_double(2.0), "INT", "DOUBLE"),
        (bool, v_int(1), "BOOL", "INT"),
        (str, v_bool(True), "STRING", "BOOL"),
        (Duration, v_int(SECOND), "DURATION", "INT"),
        (int, v_dur(5), "INT", "DURATION"),
    ],
)
def test_wrong_type_is_an_error_naming_both_types(pytype, wire, expected_name, got_name):
    problems = problems_of([Option("scale", pytype, default=None)], opt("scale", wire))
    assert len(problems) == 1
    assert "'scale'" in problems[0]
    assert expected_name in problems[0]
    assert f"got {got_name}" in problems[0]


def test_wrong_type_in_a_tuple_names_the_position():
    problems = problems_of([Option("r", [int, float], default=None)], opt("r", v_int(1), v_int(2)))
    assert len(problems) == 1
    assert "value 2" in problems[0]
    assert "DOUBLE" in problems[0] and "INT" in problems[0]


@pytest.mark.parametrize("n", [0, 1, 3])
def test_wrong_number_of_values(n):
    values = [v_int(i) for i in range(n)]
    problems = problems_of([Option("pair", [int, int], default=None)], opt("pair", *values))
    assert len(problems) == 1
    assert "'pair'" in problems[0]
    assert "takes 2" in problems[0]
    assert f"got {n}" in problems[0]


def test_required_option_with_wrong_type_is_not_also_reported_missing():
    problems = problems_of([Option("scale", float)], opt("scale", v_int(2)))
    assert len(problems) == 1, problems
    assert "missing" not in problems[0]


# ---------------------------------------------------------------------------
# unknown, missing, defaults


def test_unknown_option():
    problems = problems_of([Option("size", int), Option("as", str)], opt("size", v_int(1)), opt("as", v_str("a")), opt("sise", v_int(2)))
    assert len(problems) == 1
    assert "unknown option 'sise'" in problems[0]
    assert "as, size" in problems[0]


def test_unknown_option_when_none_declared():
    problems = problems_of([], opt("x", v_int(1)))
    assert problems == ["unknown option 'x' (known options: none)"]


def test_missing_required_option():
    problems = problems_of([Option("field", str), Option("size", int, default=10)])
    assert len(problems) == 1
    assert "missing required option 'field'" in problems[0]
    assert "STRING" in problems[0]


def test_defaults_applied_when_not_given():
    declared = [
        Option("size", int, default=10),
        Option("as", str, default="mean"),
        Option("scale", float, default=None),
        Option("strict", bool, default=False),
    ]
    opts = parse_options(declared, init().options)
    assert dict(opts) == {"size": 10, "as": "mean", "scale": None, "strict": False}
    opts = parse_options(declared, init(opt("size", v_int(3)), opt("strict", v_bool(True))).options)
    assert dict(opts) == {"size": 3, "as": "mean", "scale": None, "strict": True}


@pytest.mark.parametrize("default", [5 * SECOND, pd.Timedelta(seconds=5)])
def test_duration_default_reads_as_timedelta(default):
    opts = parse_options([Option("every", Duration, default=default)], init().options)
    assert opts.every == pd.Timedelta(seconds=5)
    assert isinstance(opts.every, pd.Timedelta)


def test_required_property():
    assert Option("a", int).required
    assert not Option("a", int, default=None).required
    assert not Option("a", int, default=0).required
    assert not Option("a", int, multiple=True).required


# ---------------------------------------------------------------------------
# validators


def test_validator_accepting():
    for verdict in (None, True):
        opts = parse_options(
            [Option("size", int, validate=lambda v, verdict=verdict: verdict)],
            init(opt("size", v_int(5))).options,
        )
        assert opts.size == 5


def test_validator_returning_false():
    problems = problems_of([Option("size", int, validate=lambda v: v > 0)], opt("size", v_int(-3)))
    assert len(problems) == 1
    assert "'size'" in problems[0] and "-3" in problems[0]


def test_validator_returning_a_message():
    problems = problems_of(
        [Option("size", int, validate=lambda v: None if v > 0 else "must be positive")],
        opt("size", v_int(0)),
    )
    assert problems == ["option 'size': must be positive"]


def test_validator_raising():
    def check(v):
        raise ValueError(f"{v} is not a known field")

    problems = problems_of([Option("field", str, validate=check)], opt("field", v_str("usgae")))
    assert len(problems) == 1
    assert "'field'" in problems[0] and "usgae is not a known field" in problems[0]


def test_validator_of_duration_gets_a_timedelta():
    seen = []
    parse_options(
        [Option("every", Duration, validate=lambda v: seen.append(v))],
        init(opt("every", v_dur(2 * SECOND))).options,
    )
    assert seen == [pd.Timedelta(seconds=2)]
    assert isinstance(seen[0], pd.Timedelta)


def test_validator_of_multiple_option_gets_the_list():
    seen = []
    parse_options(
        [Option("f", str, multiple=True, validate=lambda v: seen.append(list(v)))],
        init(opt("f", v_str("a")), opt("f", v_str("b"))).options,
    )
    assert seen == [["a", "b"]]


def test_validator_not_run_for_a_value_with_the_wrong_type():
    calls = []
    problems = problems_of(
        [Option("scale", float, default=1.0, validate=lambda v: calls.append(v))],
        opt("scale", v_int(2)),
    )
    assert calls == []
    assert len(problems) == 1


# ---------------------------------------------------------------------------
# all problems at once


def test_every_problem_of_one_init_request_is_reported():
    declared = [
        Option("field", str),  # missing
        Option("scale", float),  # given as INT
        Option("size", int, validate=lambda v: v > 0),  # fails validation
        Option("as", str),  # given twice
        Option("window", [int, int], default=None),  # wrong count
        Option("ok", bool, default=False),  # fine
    ]
    problems = problems_of(
        declared,
        opt("scale", v_int(2)),
        opt("size", v_int(-1)),
        opt("as", v_str("a")),
        opt("as", v_str("b")),
        opt("bogus", v_str("x")),
        opt("window", v_int(1)),
        opt("ok", v_bool(True)),
    )
    joined = "\n".join(problems)
    assert any("missing required option 'field'" in p for p in problems), joined
    assert any("'scale'" in p and "DOUBLE" in p and "INT" in p for p in problems), joined
    assert any("'size'" in p and "-1" in p for p in problems), joined
    assert any("'as'" in p and GIVEN_TWICE.search(p) for p in problems), joined
    assert any("unknown option 'bogus'" in p for p in problems), joined
    assert any("'window'" in p and "takes 2" in p for p in problems), joined
    assert not any("'ok'" in p for p in problems), joined
    assert len(problems) >= 6


# ---------------------------------------------------------------------------
# declarations


@pytest.mark.parametrize("bad", [list, dict, bytes, complex, "str", pd.Timedelta])
def test_unsupported_declared_type(bad):
    with pytest.raises(TypeError, match="unsupported type"):
        Option("x", bad)
    with pytest.raises(TypeError):
        Option("x", [int, bad])


def test_no_declared_type():
    with pytest.raises(TypeError, match="no value type"):
        Option("x", [])


def test_option_info_for_info_response():
    declared = [
        Option("field", str),
        Option("size", int, default=10),
        Option("scale", float, default=1.5),
        Option("on", bool, default=True),
        Option("every", Duration, default=SECOND),
        Option("range", [float, float], multiple=True),
    ]
    info = option_info(declared)
    assert {name: list(i.valueTypes) for name, i in info.items()} == {
        "field": [udf_pb2.STRING],
        "size": [udf_pb2.INT],
        "scale": [udf_pb2.DOUBLE],
        "on": [udf_pb2.BOOL],
        "every": [udf_pb2.DURATION],
        "range": [udf_pb2.DOUBLE, udf_pb2.DOUBLE],
    }
    response = udf_pb2.Response(
        info=udf_pb2.InfoResponse(wants=udf_pb2.STREAM, provides=udf_pb2.BATCH, options=info)
    )
    parsed = udf_pb2.Response.FromString(response.SerializeToString())
    assert list(parsed.info.options["every"].valueTypes) == [udf_pb2.DURATION]
    assert list(parsed.info.options["range"].valueTypes) == [udf_pb2.DOUBLE, udf_pb2.DOUBLE]
    assert set(parsed.info.options) == {"field", "size", "scale", "on", "every", "range"}


def test_type_names():
    assert Option("x", [bool, int, float, str, Duration]).type_names() == [
        "BOOL",
        "INT",
        "DOUBLE",
        "STRING",
        "DURATION",
    ]


# ---------------------------------------------------------------------------
# OptionValues


def test_attribute_and_item_access():
    opts = parse_options(
        [Option("size", int), Option("as", str), Option("field", str, default="value")],
        init(opt("size", v_int(10)), opt("as", v_str("avg"))).options,
    )
    assert opts.size == 10
    assert opts["as"] == "avg"
    assert getattr(opts, "as") == "avg"
    assert opts.field == "value"
    assert set(opts) == {"size", "as", "field"}
    assert len(opts) == 3
    assert "size" in opts and "nope" not in opts
    assert opts.get("nope", 7) == 7
    with pytest.raises(AttributeError):
        _ = opts.nope
    with pytest.raises(KeyError):
        opts["nope"]


def test_option_values_pickle_keeps_durations():
    values = OptionValues({"every": 3 * SECOND, "n": 3}, durations={"every": (0,)})
    copy = pickle.loads(pickle.dumps(values))
    assert copy.raw() == {"every": 3 * SECOND, "n": 3}
    assert copy.every == pd.Timedelta(seconds=3)
    assert copy.n == 3


def test_option_values_do_not_alias_the_input_dict():
    source = {"a": 1}
    values = OptionValues(source)
    source["a"] = 2
    assert values.a == 1


def test_binding_a_udf_parses_its_options_and_says_why_it_cannot_start():
    from udf_agent.api import BindError
    from udf_agent.library.builtins import BUILTINS

    def opt(name: str, value: int | str) -> udf_pb2.Option:
        typed = udf_pb2.OptionValue(type=udf_pb2.INT, intValue=value) if isinstance(value, int) else udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=value)
        return udf_pb2.Option(name=name, values=[typed])

    moving_avg = BUILTINS["moving_avg"]
    spec, options = moving_avg.bind([opt("field", "v"), opt("size", 3)])
    assert spec is moving_avg and options["size"] == 3
    with pytest.raises(BindError, match="^invalid options for UDF 'moving_avg': .*size"):
        moving_avg.bind([opt("field", "v"), opt("size", "three")])
