"""``udf-agent replay``, line protocol in and out, TICKscript typing, and ``testing.run_udf``."""

import gzip
import io
import os
import pty
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from udf_agent import udf_pb2
from udf_agent.cli import main
from udf_agent.library.builtins import moving_avg, outliers
from udf_agent.options import Duration
from udf_agent.testing import option, run_udf
from udf_agent.tools.lineproto import LineProtocolError, format_point, read_points
from udf_agent.tools.replay import ReplayError, batch_requests, in_process_engines, replay_points
from udf_agent.tools.tickscript import TickError, check_call, literal, parse_call

SECOND = 1_000_000_000


def lines(text):
    return io.BytesIO(text.encode())


def cpu_lines(hosts=("a", "b"), count=40, seed=7):
    rng = np.random.default_rng(seed)
    return [f"cpu,host={host} usage={rng.normal(10, 2)!r} {t * SECOND}" for t in range(count) for host in hosts]


def rolling_reference(text_lines, size):
    """Plain pandas: each host's mean of its last SIZE usage values."""
    rows = [p for p in read_points(lines("\n".join(text_lines)))]
    frame = pd.DataFrame({"host": [p.tags["host"] for p in rows], "time": [p.time for p in rows], "usage": [p.fields["usage"] for p in rows]})
    frame["avg"] = frame.groupby("host")["usage"].transform(lambda s: s.rolling(size, min_periods=1).mean())
    return frame


# --- line protocol ---------------------------------------------------------------------

AWKWARD = [
    # name, tags, fields
    ("cpu load", {"host name": "a,b", "k=v": "x=y"}, {"usage": 1.5}),
    ("m,x", {"t": "with space"}, {"f=g": 2.0, "text": 'he said "hi", then \\ left'}),
    ("m", {}, {"count": 3, "neg": -7, "ok": True, "bad": False, "empty": ""}),
]


@pytest.mark.parametrize("name, tags, fields", AWKWARD)
def test_awkward_names_tags_and_fields_survive_formatting_and_parsing(name, tags, fields):
    text = format_point(name, tags, fields, 5 * SECOND)
    [parsed] = read_points(lines(text))
    assert (parsed.name, parsed.tags, parsed.fields, parsed.time) == (name, tags, fields, 5 * SECOND)
    for key, value in fields.items():
        assert type(parsed.fields[key]) is type(value)


def test_integer_unsigned_bool_and_string_fields_are_typed_as_kapacitor_types_them():
    [point] = read_points(lines('m i=-3i,u=4u,b=t,B=FALSE,s="x",d=2 7'))
    assert point.fields == {"i": -3, "u": 4, "b": True, "B": False, "s": "x", "d": 2.0}
    assert type(point.fields["d"]) is float and type(point.fields["i"]) is int


def test_an_int_field_formats_with_its_i_suffix_and_nan_fields_are_left_out():
    assert format_point("m", {}, {"n": 3, "x": 1.0}, 1) == "m n=3i,x=1 1"
    assert format_point("m", {}, {"x": float("nan"), "y": 2.0}, 1) == "m y=2 1"
    assert format_point("m", {}, {"x": float("nan")}, 1) == ""


def test_gzip_input_comments_blank_lines_and_precision():
    from udf_agent.tools.lineproto import open_input

    data = gzip.compress(b"# recorded\n\ncpu v=1 3\n")
    with open_input("-", io.BytesIO(data)) as stream:
        [point] = read_points(stream, precision="s")
    assert point.time == 3 * SECOND


@pytest.mark.parametrize(
    "text, message",
    [
        ("cpu v=1 1\ncpu v 2", "data:2: not line protocol"),
        ("cpu v=1", "data:1: the point has no timestamp"),
        ("cpu v=18446744073709551615u 1", "does not fit Kapacitor's int64 fields"),
    ],
)
def test_bad_lines_are_refused_with_where_and_why(text, message):
    with pytest.raises(LineProtocolError, match=message):
        list(read_points(lines(text), "data"))


# --- TICKscript typing -----------------------------------------------------------------


@pytest.mark.parametrize(
    "text, wire_type, value",
    [
        ("10", udf_pb2.INT, 10),
        ("-3", udf_pb2.INT, -3),
        ("1.5", udf_pb2.DOUBLE, 1.5),
        ("2.", udf_pb2.DOUBLE, 2.0),
        ("'avg'", udf_pb2.STRING, "avg"),
        ("avg", udf_pb2.STRING, "avg"),
        ("'it\\'s'", udf_pb2.STRING, "it's"),
        ("'10'", udf_pb2.STRING, "10"),
        ("true", udf_pb2.BOOL, True),
        ("FALSE", udf_pb2.BOOL, False),
        ("10s", udf_pb2.DURATION, 10 * SECOND),
        ("500ms", udf_pb2.DURATION, SECOND // 2),
        ("2u", udf_pb2.DURATION, 2_000),
        ("1w", udf_pb2.DURATION, 7 * 86_400 * SECOND),
    ],
)
def test_literals_are_typed_as_tickscript_types_them(text, wire_type, value):
    typed = literal(text)
    assert typed.type == wire_type
    assert getattr(typed, typed.WhichOneof("value")) == value


def test_a_call_takes_several_values_split_outside_quotes():
    call = parse_call("field='a,b',2,1m")
    assert [v.WhichOneof("value") for v in call.values] == ["stringValue", "intValue", "durationValue"]
    assert call.values[0].stringValue == "a,b"


@pytest.mark.parametrize(
    "assignment, message",
    [
        ("size=2.0", "unexpected arg to size, got DOUBLE expected INT"),
        ("size=2,3", "unexpected number of args to size, got 2 expected 1"),
        ("sise=2", 'no method or property "sise" on UDF moving_avg'),
    ],
)
def test_a_call_of_the_wrong_type_gets_kapacitors_message(assignment, message):
    from udf_agent.options import option_info

    with pytest.raises(TickError, match=message):
        check_call("moving_avg", option_info(moving_avg.options), parse_call(assignment))


def test_one_duration_serves_as_option_type_and_as_value():
    import datetime

    assert Duration("10s") == Duration(10 * SECOND) == Duration(datetime.timedelta(seconds=10)) == Duration(pd.Timedelta("10s"))
    assert option("every", Duration("1m")).values[0].durationValue == 60 * SECOND
    with pytest.raises(ValueError, match="not a TICKscript duration"):
        Duration("ten seconds")



@pytest.mark.parametrize("text, written", [("1u", "1u"), ("250ms", "250ms"), ("90s", "90s"), ("2m", "2m"), ("3h", "3h"), ("1d", "24h"), ("1500ms", "1500ms")])
def test_tickscript_durations_are_read_and_written_back(text, written):
    from udf_agent.tools.tickscript import render_duration

    assert render_duration(literal(text).durationValue) == written
    assert literal(written).durationValue == literal(text).durationValue

# --- the replay itself, on real Spark ----------------------------------------------------


@pytest.mark.spark
def test_replay_of_moving_avg_on_spark_matches_plain_pandas_per_group(engines):
    text_lines = cpu_lines(count=60)
    points = list(read_points(lines("\n".join(text_lines))))
    out = list(replay_points(moving_avg, engines, [parse_call("field=usage"), parse_call("size=7")], points, group_by=["host"]))
    expected = rolling_reference(text_lines, 7)
    assert [p.tags["host"] for p in out] == expected["host"].tolist()  # arrival order
    assert [p.time for p in out] == expected["time"].tolist()
    np.testing.assert_allclose([p.fields["avg"] for p in out], expected["avg"], rtol=0, atol=1e-12)


@pytest.mark.spark
def test_replay_of_a_batch_udf_on_spark_cuts_aligned_windows_per_group(engines):
    text_lines = [f"cpu,host={h} usage={100.0 if t in (7, 23) else 1.0 + (t % 3)} {t * SECOND}" for t in range(30) for h in ("a", "b")]
    points = list(read_points(lines("\n".join(text_lines))))
    out = list(replay_points(outliers, engines, [parse_call("field=usage")], points, group_by=["host"], batch_every_ns=10 * SECOND))
    # Plain pandas: per host and aligned 10 s window, the points outside the Tukey fences.
    frame = pd.DataFrame({"host": [p.tags["host"] for p in points], "time": [p.time for p in points], "usage": [p.fields["usage"] for p in points]})
    frame["window"] = frame["time"] // (10 * SECOND)
    expected = []
    for (_, _), rows in frame.groupby(["window", "host"]):
        q1, q3 = rows["usage"].quantile(0.25), rows["usage"].quantile(0.75)
        fence = 1.5 * (q3 - q1)
        expected += [(h, t) for h, t, u in zip(rows["host"], rows["time"], rows["usage"]) if u < q1 - fence or u > q3 + fence]
    assert sorted((p.tags["host"], p.time) for p in out) == sorted(expected)
    assert {(h, t // SECOND) for h, t in expected} == {("a", 7), ("b", 7), ("a", 23), ("b", 23)}


def test_batches_are_framed_as_kapacitor_frames_a_window_per_group():
    points = list(read_points(lines("cpu,host=a v=1 1000000000\ncpu,host=b v=2 1500000000\ncpu,host=a v=3 12000000000")))
    kinds = [(r.WhichOneof("message"), getattr(r, r.WhichOneof("message"))) for r in batch_requests(points, ["host"], 10 * SECOND)]
    begins = [m for k, m in kinds if k == "begin"]
    ends = [m for k, m in kinds if k == "end"]
    assert [(b.group, b.size) for b in begins] == [("host=a", 1), ("host=b", 1), ("host=a", 1)]
    assert [(e.group, e.tmax) for e in ends] == [("host=a", 10 * SECOND), ("host=b", 10 * SECOND), ("host=a", 20 * SECOND)]
    assert dict(begins[0].tags) == {"host": "a"}


def test_options_the_udf_refuses_end_the_replay_with_its_reason():
    with pytest.raises(ReplayError, match="refused its options: .*'size': must be > 0"):
        list(replay_points(moving_avg, in_process_engines(), [parse_call("field=usage"), parse_call("size=0")], []))


# --- the command -----------------------------------------------------------------------


@pytest.fixture
def cpu_file(tmp_path):
    path = tmp_path / "cpu.lp.gz"
    text_lines = cpu_lines(count=30)
    path.write_bytes(gzip.compress("\n".join(text_lines).encode()))
    return path, text_lines


def test_replay_command_writes_the_udfs_output_as_line_protocol(cpu_file, tmp_path):
    path, text_lines = cpu_file
    out_path = tmp_path / "out.lp"
    result = CliRunner().invoke(main, ["replay", "moving_avg", "--input", str(path), "-o", "field=usage", "-o", "size=4", "--group-by", "host", "--in-process", "--output", str(out_path)])
    assert result.exit_code == 0, result.output
    out = list(read_points(lines(out_path.read_text())))
    expected = rolling_reference(text_lines, 4)
    np.testing.assert_allclose([p.fields["avg"] for p in out], expected["avg"], atol=1e-12)
    assert {p.tags["host"] for p in out} == {"a", "b"}
    assert "replayed 60 point(s) through moving_avg: 60 point(s) out" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["-o", "field=usage", "-o", "size=4.0"], "unexpected arg to size, got DOUBLE expected INT"),
        (["-o", "field=usage"], "missing required option 'size'"),
        (["-o", "size"], "is not NAME=VALUE"),
    ],
)
def test_replay_command_refuses_bad_options_with_one_clear_line(cpu_file, args, message):
    path, _ = cpu_file
    result = CliRunner().invoke(main, ["replay", "moving_avg", "--input", str(path), "--in-process", *args])
    assert result.exit_code != 0
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_batch_udf_without_batch_every_is_a_usage_error(cpu_file):
    path, _ = cpu_file
    result = CliRunner().invoke(main, ["replay", "outliers", "--input", str(path), "-o", "field=usage", "--in-process"])
    assert result.exit_code == 2
    assert "--batch-every" in result.output


def test_replay_plot_draws_each_group_with_titles_and_legends(cpu_file, tmp_path):
    import matplotlib.image

    from udf_agent.tools.plot import replay_figure

    path, text_lines = cpu_file
    png = tmp_path / "cpu.png"
    result = CliRunner().invoke(main, ["replay", "moving_avg", "--input", str(path), "-o", "field=usage", "-o", "size=4", "--group-by", "host", "--in-process", "--output", str(tmp_path / "o.lp"), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    height, width, _ = matplotlib.image.imread(png).shape
    assert width > 500 and height > 400

    points = list(read_points(lines("\n".join(text_lines))))
    outputs = list(replay_points(moving_avg, in_process_engines(), [parse_call("field=usage"), parse_call("size=4")], points, group_by=["host"]))
    figure = replay_figure("moving_avg", points, outputs, ["host"], ["usage"])
    titles = [axis.get_title() for axis in figure.axes]
    assert titles == ["group host=a", "group host=b"]
    assert [text.get_text() for text in figure.axes[0].get_legend().get_texts()] == ["in: usage", "out: avg"]
    assert figure.axes[-1].get_xlabel() == "time (UTC)"


UDF_THAT_PRINTS = '''
from udf_agent import stream_udf

@stream_udf()
def noisy(df, ctx):
    print("debugging output from the UDF")
    return df
'''


def run_replay_process(tmp_path, args, stderr=subprocess.PIPE):
    (tmp_path / "noisy.py").write_text(UDF_THAT_PRINTS)
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "udf_agent", "replay", *args], stdout=subprocess.PIPE, stderr=stderr, env=env, cwd=tmp_path, timeout=120)


@pytest.mark.integration
def test_a_udf_that_prints_cannot_corrupt_the_line_protocol_on_stdout(tmp_path):
    (tmp_path / "in.lp").write_text("cpu,host=a v=1 1\ncpu,host=a v=2 2\n")
    done = run_replay_process(tmp_path, ["noisy:noisy", "--input", "in.lp", "--in-process"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().splitlines() == ["cpu,host=a v=1 1", "cpu,host=a v=2 2"]
    assert b"debugging output from the UDF" in done.stderr
    assert b"points/s" not in done.stderr  # not a terminal: no progress bar


@pytest.mark.integration
def test_a_progress_bar_with_the_rate_shows_when_stderr_is_a_terminal(tmp_path):
    (tmp_path / "in.lp").write_text("\n".join(f"cpu,host=a v={i} {i}" for i in range(2000)))
    leader, follower = pty.openpty()
    try:
        done = run_replay_process(tmp_path, ["noisy:noisy", "--input", "in.lp", "--in-process"], stderr=follower)
        os.close(follower)
        seen = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0
    assert len(done.stdout.decode().splitlines()) == 2000
    assert b"replay" in seen and b"points/s" in seen and b"2000/2000" in seen


# --- testing.run_udf ---------------------------------------------------------------------


def test_run_udf_takes_and_returns_dataframes():
    data = pd.DataFrame(
        {
            "time": pd.to_datetime([1, 1, 2, 2, 3], unit="s"),
            "host": ["a", "b", "a", "b", "a"],
            "usage": [1.0, 10.0, 2.0, np.nan, 3.0],
        }
    )
    out = run_udf("moving_avg", data, {"field": "usage", "size": 2}, group_by=["host"])
    assert out.columns.tolist() == ["time", "name", "host", "avg"]
    assert str(out["time"].dtype) == "datetime64[ns, UTC]"
    assert out["host"].tolist() == ["a", "b", "a", "b", "a"]
    # b's second point has no usage field: its window holds a missing value.
    np.testing.assert_array_equal(out["avg"].to_numpy(), [1.0, 10.0, 1.5, np.nan, 2.5])


def test_run_udf_over_line_protocol_with_a_batch_udf_and_a_duration_window():
    text = "\n".join(f"m,h=a v={100.0 if t == 5 else 1.0} {t * SECOND}" for t in range(10))
    out = run_udf("outliers", text, {"field": "v"}, batch_every="10s")
    assert out["v"].tolist() == [100.0]
    assert out["time"].tolist() == [pd.Timestamp(5 * SECOND, unit="ns", tz="UTC")]


@pytest.mark.spark
def test_run_udf_on_spark_gives_what_it_gives_in_process(engines):
    data = pd.DataFrame({"time": np.arange(50) * SECOND, "host": ["a", "b"] * 25, "usage": np.linspace(0, 5, 50)})
    here = run_udf(moving_avg, data, {"field": "usage", "size": 3}, group_by=["host"])
    there = run_udf(moving_avg, data, {"field": "usage", "size": 3}, group_by=["host"], engines=engines)
    pd.testing.assert_frame_equal(here, there)


def test_a_slow_consumer_of_the_output_loses_nothing():
    """The agent drops output left unread for a second after input ends (a task stop);
    a replay whose consumer pauses longer than that must still get every point."""
    import time

    text_lines = cpu_lines(count=15_000)
    points = list(read_points(lines("\n".join(text_lines))))
    outputs = replay_points(moving_avg, in_process_engines(), [parse_call("field=usage"), parse_call("size=3")], points, group_by=["host"])
    first = next(outputs)
    time.sleep(2.5)  # input has ended by now, and the socket is full
    rest = list(outputs)
    assert 1 + len(rest) == len(points) == 30_000
    assert (first.time, rest[-1].time) == (0, 14_999 * SECOND)


def test_batch_every_takes_tickscript_durations(cpu_file):
    path, _ = cpu_file
    base = ["replay", "outliers", "--input", str(path), "-o", "field=usage", "--in-process"]
    assert CliRunner().invoke(main, [*base, "--batch-every", "1d"]).exit_code == 0
    refused = CliRunner().invoke(main, [*base, "--batch-every", "10x"])
    assert refused.exit_code == 2 and "not a TICKscript duration" in refused.output


def test_replay_plot_without_matplotlib_says_what_to_install_before_doing_any_work(cpu_file, tmp_path, monkeypatch):
    path, _ = cpu_file
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as after the README's plain install
    out_path, png = tmp_path / "o.lp", tmp_path / "cpu.png"
    result = CliRunner().invoke(main, ["replay", "moving_avg", "--input", str(path), "-o", "field=usage", "-o", "size=4", "--in-process", "--output", str(out_path), "--plot", str(png)])
    assert result.exit_code == 2
    assert "--plot needs matplotlib, which is not installed here: pip install 'udf-agent[plot]'" in result.output
    assert "Traceback" not in result.output and "replayed" not in result.output
    assert not out_path.exists() and not png.exists()


# --- Kapacitor's recordings -------------------------------------------------------------


def write_stream_recording(path, points):
    """A .srpl as Kapacitor's WritePointForRecording writes it: gzip of, per point, its
    database, its retention policy and the point as line protocol, a line each."""
    with gzip.open(path, "wb") as out:
        for database, policy, line in points:
            out.write(f"{database}\n{policy}\n".encode())
            out.write(line.encode())
            out.write(b"\n")


def write_batch_recording(path, queries):
    """A .brpl as Kapacitor writes it: a zip with a file per batch query (named 0, 1, ...),
    each Go's json.Encoder output of its buffered batches (one compact object a line)."""
    import json
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        for index, batches in enumerate(queries):
            archive.writestr(str(index), "".join(json.dumps(batch, separators=(",", ":")) + "\n" for batch in batches))


def test_a_stream_recording_replays_with_each_points_database_and_retention_policy(tmp_path):
    recording = tmp_path / "cpu.srpl"
    write_stream_recording(
        recording,
        [("telegraf", "autogen", "cpu,host=a value=1 1000000000"), ("telegraf", "autogen", "cpu,host=b value=2 2000000000"), ("other", "weekly", "cpu,host=a value=3 3000000000")],
    )
    out_path = tmp_path / "out.lp"
    result = CliRunner().invoke(main, ["replay", "tests.udfs.sample:where_from", "--input", str(recording), "--group-by", "host", "--in-process", "--output", str(out_path)])
    assert result.exit_code == 0, result.output
    out = sorted(read_points(lines(out_path.read_text())), key=lambda p: p.time)
    assert [(p.time, p.fields["database"], p.fields["retention_policy"], p.fields["task"]) for p in out] == [
        (1 * SECOND, "telegraf", "autogen", "replay"), (2 * SECOND, "telegraf", "autogen", "replay"), (3 * SECOND, "other", "weekly", "replay"),
    ]


def test_a_stream_recording_computes_as_the_same_points_in_line_protocol(cpu_file, tmp_path):
    _, text_lines = cpu_file
    recording = tmp_path / "cpu.srpl"
    write_stream_recording(recording, [("telegraf", "autogen", line) for line in text_lines])
    out_path = tmp_path / "out.lp"
    result = CliRunner().invoke(main, ["replay", "moving_avg", "--input", str(recording), "-o", "field=usage", "-o", "size=4", "--group-by", "host", "--in-process", "--output", str(out_path)])
    assert result.exit_code == 0, result.output
    out = list(read_points(lines(out_path.read_text())))
    np.testing.assert_allclose([p.fields["avg"] for p in out], rolling_reference(text_lines, 4)["avg"], atol=1e-12)


def test_a_batch_recording_replays_each_recorded_batch_as_one_batch(tmp_path):
    def batch(group, tmax, values, start):
        points = [{"fields": {"value": v}, "tags": {"host": group}, "time": f"2026-01-01T00:00:{start + i:02d}.5Z"} for i, v in enumerate(values)]
        points[0]["tags"] = {}  # as Kapacitor's replay: a point without tags has its batch's
        return {"name": "cpu", "tmax": tmax, "group": f"host={group}", "tags": {"host": group}, "points": points}

    recording = tmp_path / "cpu.brpl"
    write_batch_recording(
        recording,
        [
            # A query's batches are recorded with Go's zero time: they end at their last point.
            [batch("a", "0001-01-01T00:00:00Z", [1, 2, 3], 0), batch("b", "0001-01-01T00:00:00Z", [4, 5], 0)],
            [batch("a", "2026-01-01T00:01:00Z", [6], 10), {"name": "cpu", "tmax": "2026-01-01T00:02:00Z", "group": "host=a", "tags": {"host": "a"}}],
        ],
    )
    out_path = tmp_path / "out.lp"
    result = CliRunner().invoke(main, ["replay", "tests.udfs.sample:batch_count", "--input", str(recording), "--in-process", "--output", str(out_path)])
    assert result.exit_code == 0, result.output
    out = list(read_points(lines(out_path.read_text())))
    start = 1_767_225_600 * SECOND  # 2026-01-01T00:00:00Z
    # Three batches with points (the empty one is skipped), never cut or merged, at their tmax.
    assert sorted((p.tags.get("host"), p.fields["count"], p.time) for p in out) == [
        ("a", 1, start + 60 * SECOND),
        ("a", 3, start + 2 * SECOND + SECOND // 2),
        ("b", 2, start + 1 * SECOND + SECOND // 2),
    ]
    assert "replayed 6 point(s)" in result.output


@pytest.mark.parametrize(
    "name, content, target, args, message, code",
    [
        ("cut.srpl", "stream-cut", "stream", [], "the recording ends inside a point", 1),
        ("bad.srpl", b"not gzip", "stream", [], "not a stream recording (gzip)", 1),
        ("bad.brpl", b"not zip", "batch", [], "not a batch recording (zip)", 1),
        ("ok.brpl", "batch", "batch", ["--batch-every", "10s"], "drop --batch-every and --group-by", 2),
        ("stream.brpl", "batch", "stream", [], "a batch recording (.brpl) is for batch UDFs", 1),
    ],
)
def test_a_recording_that_cannot_be_replayed_says_why_in_one_line(tmp_path, name, content, target, args, message, code):
    path = tmp_path / name
    if content == "stream-cut":
        write_stream_recording(path, [("db", "rp", "cpu value=1 1")])
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes()).rsplit(b"\n", 2)[0] + b"\n"))
    elif content == "batch":
        write_batch_recording(path, [[{"name": "cpu", "group": "", "points": [{"fields": {"value": 1}, "tags": {}, "time": "2026-01-01T00:00:00Z"}]}]])
    else:
        path.write_bytes(content)
    udf = ["moving_avg", "-o", "field=value", "-o", "size=2"] if target == "stream" else ["tests.udfs.sample:batch_count"]
    result = CliRunner().invoke(main, ["replay", *udf, "--input", str(path), "--in-process", *args])
    assert result.exit_code == code, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(
    "text, ns",
    [
        ("1970-01-01T00:00:01Z", SECOND),
        ("2026-01-01T00:00:00.000000001Z", 1_767_225_600 * SECOND + 1),
        ("2026-01-01T01:00:00.5+01:00", 1_767_225_600 * SECOND + SECOND // 2),
        ("2025-12-31T23:00:00.25-01:00", 1_767_225_600 * SECOND + SECOND // 4),
    ],
)
def test_recorded_times_are_read_to_the_nanosecond_in_any_offset(text, ns):
    from udf_agent.tools.recordings import go_time_ns

    assert go_time_ns(text) == ns
