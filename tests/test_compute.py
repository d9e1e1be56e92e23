"""Micro-batches computed on a real SparkSession, checked against plain pandas."""

import random
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from udfs import sample

from udf_agent import udf_pb2
from udf_agent.compute.contract import RESULT_SCHEMA, TASK_SCHEMA, Job, Task, spark_ddl, tasks_table
from udf_agent.compute.engine import LocalEngine
from udf_agent.compute.frame import user_frame
from udf_agent.library.builtins import moving_avg, outliers
from udf_agent.runtime.config import AgentConfig
from udf_agent.runtime.engines import Engines
from udf_agent.testing import Duration, InProcessAgent, option
from udf_agent.wire import pointcodec
from udf_agent.wire.batches import KapacitorBatch, StreamMicroBatch
from udf_agent.wire.columns import decode_points
from udf_agent.wire.frames import FrameDecoder, encode_frame
from udf_agent.wire.pointcodec import DecodedPoints

pytestmark = pytest.mark.spark

TUKEY_VALUES = [5, 6, 7, 13, 33, 35, 36, 45, 46, 47, 48, 50, 51, 52, 53, 54, 80, 85, 90, 100]


def decode(output: bytes):
    return FrameDecoder(udf_pb2.Response).feed(output)


def stream_tasks(points):
    batch = StreamMicroBatch(opened_at=0)
    for point in points:
        batch.append(point.group, point.SerializeToString())
    grouped = batch.grouped()
    return tasks_table([Task(seq, group, grouped.points(seq), None, None) for seq, group in enumerate(grouped.keys)])


def rich_points(count=60):
    """Points with every kind of value, sparse fields, several groups and names."""
    rng = random.Random(7)
    points = []
    for i in range(count):
        host = f"h{i % 4}"
        point = udf_pb2.Point(
            time=1_700_000_000_000_000_000 + i * 1_000_000,
            name="cpu" if i % 3 else "mem",
            database="telegraf",
            retentionPolicy="autogen",
            group=f"host={host}",
            dimensions=["host"],
            tags={"host": host, "region": rng.choice(["eu", "us"])},
            fieldsDouble={"d": rng.random() * 1e6 - 5e5},
            fieldsInt={"i": rng.randint(-(2**62), 2**62)},
            fieldsString={"s": rng.choice(["a", "", "ünïcode", "x,y=z"])},
            fieldsBool={"b": rng.random() < 0.5},
        )
        if i % 5 == 0:
            del point.fieldsDouble["d"]
        if i % 7 == 0:
            point.fieldsInt["only_some"] = i
        if i % 11 == 0:
            point.fieldsInt["time"] = -i  # a field may be called "time"
        points.append(point)
    return points


@pytest.fixture(params=["resident", "jobs"])
def any_spark_engine(request, spark_engine, spark_jobs_engine):
    return spark_engine if request.param == "resident" else spark_jobs_engine


def test_the_spark_ddl_is_derived_from_the_contract_schemas():
    assert spark_ddl(RESULT_SCHEMA) == "seq long, key string, output binary, history binary, state string, error string, emitted long"
    assert spark_ddl(TASK_SCHEMA) == (
        "seq long, key string, data binary, history binary, state string, batch_name string, "
        "batch_tag_keys array<string>, batch_tag_values array<string>, batch_tmax long, batch_by_name boolean"
    )


def test_a_kapacitor_batch_task_keeps_its_name_tags_and_tmax_on_spark(any_spark_engine):
    batch = KapacitorBatch(udf_pb2.BeginBatch(name="cpu", group="host=a", tags={"host": "a", "dc": "x"}, byName=True))
    for i, value in enumerate(TUKEY_VALUES):
        batch.rows.append(udf_pb2.Point(time=i, fieldsDouble={"value": float(value)}).SerializeToString())
    task = Task(0, "host=a", batch.rows.encoded(), None, None, batch_name="cpu", batch_tag_keys=["host", "dc"],
                batch_tag_values=["a", "x"], batch_tmax=99, batch_by_name=True)
    job = Job(outliers, {"field": "value", "scale": 1.5})
    (result,) = any_spark_engine.run(job, tasks_table([task])).to_pandas().itertuples()
    assert result.error is None, result.error
    (local,) = LocalEngine().run(job, tasks_table([task])).to_pandas().itertuples()
    assert decode(result.output) == decode(local.output)
    begin, *points, end = decode(result.output)
    assert (begin.begin.name, dict(begin.begin.tags), begin.begin.byName) == ("cpu", {"host": "a", "dc": "x"}, True)
    assert (end.end.tmax, len(points)) == (99, 5)


def test_spark_and_pandas_give_identical_results(any_spark_engine):
    spark_engine = any_spark_engine
    points = rich_points()
    for spec, options, window in (
        (sample.passthrough, {}, None),
        (moving_avg, {"field": "i", "size": 4, "as": "avg"}, {"rows": 3}),
    ):
        job = Job(spec, options)
        assert job.history_window == window
        tasks = stream_tasks(points)
        on_spark = spark_engine.run(job, tasks).to_pandas()
        in_pandas = LocalEngine().run(job, tasks).to_pandas()
        assert on_spark["error"].isna().all(), on_spark["error"].dropna().tolist()
        # Map order in serialised protobuf differs between processes: compare messages.
        assert [decode(o) for o in on_spark["output"]] == [decode(o) for o in in_pandas["output"]]
        assert list(on_spark["history"]) == list(in_pandas["history"])
        assert sum(len(decode(o)) for o in on_spark["output"]) == len(points)


def test_a_packed_stream_slice_gives_the_same_results_on_every_engine(any_spark_engine):
    """A stream micro-batch reaches an engine packed: the resident workers read it as it is, a
    Spark job from its task table; either way the results are the in-process engine's."""
    from udf_agent.compute.packed import StreamTasks

    tasks = StreamTasks.of_table(stream_tasks(rich_points(60)))
    for job in (Job(moving_avg, {"field": "d", "size": 3, "as": "avg"}), Job(sample.counter, {})):
        on_spark = any_spark_engine.run_stream(job, tasks)
        assert on_spark.table(tasks).equals(LocalEngine().run_stream(job, tasks).table(tasks))
        assert on_spark.emitted.sum() == 60


def test_passthrough_on_spark_keeps_every_value_and_type(spark_engine):
    points = rich_points()
    results = spark_engine.run(Job(sample.passthrough, {}), stream_tasks(points)).to_pandas()
    echoed = [r.point for output in results["output"] for r in decode(output)]
    by_time = {p.time: p for p in echoed}
    assert len(by_time) == len(points)
    for point in points:
        assert by_time[point.time] == point


def run_agent(spec, engines, options=(), config=None, feed=None):
    harness = InProcessAgent(spec, engines, config or AgentConfig(flush_interval=0.02))
    driver = harness.driver
    init = driver.init(*options)
    assert init.success, init.error
    feed(driver)
    return harness, driver


def test_moving_avg_is_exact_whatever_the_micro_batch_boundaries(engines):
    rng = random.Random(11)
    size = 5
    groups = [f"g{i}" for i in range(6)]
    series = {g: [] for g in groups}
    sent = []
    for t in range(400):
        group = rng.choice(groups)
        value = rng.uniform(-1e3, 1e3)
        series[group].append(value)
        sent.append((t, group, value))

    def feed(driver):
        for t, group, value in sent:
            driver.point(time=t, name="m", group=f"k={group}", dimensions=["k"], tags={"k": group}, fieldsDouble={"v": value})

    # Tiny micro-batches: most windows span several of them.
    harness, driver = run_agent(
        moving_avg, engines, (option("field", "v"), option("size", size)), AgentConfig(flush_interval=0.01, max_batch_points=13), feed
    )
    points = driver.responses.wait_for("point", len(sent), timeout=300)
    assert harness.finish() == 0
    # Out in the order the points came in, across groups too, as a per-point agent would.
    assert [p.time for p in points] == [t for t, _, _ in sent]
    expected = {}
    for group, values in series.items():
        expected[group] = [float(np.mean(values[max(0, i - size + 1) : i + 1])) for i in range(len(values))]
    got = {g: [] for g in groups}
    for point in points:
        got[point.tags["k"]].append(point.fieldsDouble["avg"])
    for group in groups:
        assert got[group] == pytest.approx(expected[group], rel=1e-9)


def test_a_duration_history_keeps_time_windows_exact(engines):
    second = 1_000_000_000

    def feed(driver):
        for t in range(30):
            driver.point(time=t * second, name="m", fieldsInt={"value": t})

    config = AgentConfig(flush_interval=0.01, max_batch_points=4)
    harness, driver = run_agent(sample.time_sum, engines, (option("window", Duration(3 * second)),), config, feed)
    points = driver.responses.wait_for("point", 30, timeout=300)
    assert harness.finish() == 0
    # A 3 s window ending at t holds t-2, t-1 and t.
    assert [p.fieldsDouble["sum"] for p in points] == [float(sum(range(max(0, t - 2), t + 1))) for t in range(30)]


def test_udf_state_persists_between_micro_batches(engines):
    def feed(driver):
        for t in range(40):
            driver.point(time=t, name="m", group=f"g={t % 2}", dimensions=["g"], tags={"g": str(t % 2)}, fieldsDouble={"x": 1.0})

    harness, driver = run_agent(sample.counter, engines, (), AgentConfig(flush_interval=0.01, max_batch_points=3), feed)
    points = driver.responses.wait_for("point", 40, timeout=300)
    assert harness.finish() == 0
    for group in ("0", "1"):
        assert [p.fieldsInt["count"] for p in points if p.tags["g"] == group] == list(range(1, 21))


def test_class_based_udf(engines):
    def feed(driver):
        driver.point(time=1, name="m", fieldsDouble={"x": 1.5}, fieldsString={"note": "kept out"})

    harness, driver = run_agent(sample.Scale.spec(), engines, (option("field", "x"), option("factor", 3.0)), None, feed)
    (point,) = driver.responses.wait_for("point", 1, timeout=120)
    assert harness.finish() == 0
    assert dict(point.fieldsDouble) == {"x": 4.5} and not point.fieldsString


def tukey_batch(driver, group="", name="cpu", tags=None, values=TUKEY_VALUES, tmax=99):
    driver.begin(name=name, group=group, tags=tags or {}, size=len(values))
    for i, value in enumerate(values):
        driver.point(time=i, group=group, tags=tags or {}, fieldsDouble={"value": float(value)}, fieldsInt={"i": i})
    driver.end(name=name, group=group, tags=tags or {}, tmax=tmax)


def test_outliers_reference_batch(engines):
    shuffled = TUKEY_VALUES[:]
    random.Random(3).shuffle(shuffled)

    def feed(driver):
        tukey_batch(driver, group="host=a", tags={"host": "a"}, values=shuffled, tmax=12345)
        tukey_batch(driver, group="host=b", tags={"host": "b"}, values=[], tmax=777)

    harness, driver = run_agent(outliers, engines, (option("field", "value"),), None, feed)
    ends = driver.responses.wait_for("end", 2, timeout=120)
    assert harness.finish() == 0
    kinds = driver.responses.kinds()
    assert kinds[kinds.index("begin") :] == ["begin"] + ["point"] * 5 + ["end", "begin", "end"]
    points = driver.responses.of("point")
    values = sorted(p.fieldsDouble["value"] for p in points)
    expected = pd.Series(TUKEY_VALUES, dtype=float)
    q1, q3 = expected.quantile(0.25), expected.quantile(0.75)
    assert values == sorted(v for v in TUKEY_VALUES if v < q1 - 1.5 * (q3 - q1) or v > q3 + 1.5 * (q3 - q1))
    assert len(values) == 5
    # Outliers are unchanged points: their other fields come along.
    assert all(shuffled[p.fieldsInt["i"]] == p.fieldsDouble["value"] for p in points)
    begins = driver.responses.of("begin")
    assert begins[0].size == 5 and begins[1].size == 0
    assert [(e.name, e.group, dict(e.tags), e.tmax) for e in ends] == [
        ("cpu", "host=a", {"host": "a"}, 12345),
        ("cpu", "host=b", {"host": "b"}, 777),
    ]


def test_outliers_scale_is_applied():
    batch = KapacitorBatch(udf_pb2.BeginBatch(name="m"))
    for i, value in enumerate(TUKEY_VALUES):
        batch.rows.append(udf_pb2.Point(time=i, fieldsDouble={"value": float(value)}).SerializeToString())
    tasks = tasks_table([Task(0, "", batch.rows.encoded(), None, None, batch_name="m", batch_tag_keys=[], batch_tag_values=[], batch_tmax=1, batch_by_name=False)])
    counts = []
    for scale in (1.0, 1.5, 3.0):
        (result,) = LocalEngine().run(Job(outliers, {"field": "value", "scale": scale}), tasks).to_pandas().itertuples()
        counts.append(sum(1 for r in decode(result.output) if r.WhichOneof("message") == "point"))
    assert counts[0] >= counts[1] == 5 >= counts[2]
    assert counts[0] > counts[2]


def test_batch_in_stream_out(engines):
    def feed(driver):
        tukey_batch(driver, group="host=a", tags={"host": "a"}, tmax=5_000)

    harness, driver = run_agent(sample.batch_count, engines, (), None, feed)
    (point,) = driver.responses.wait_for("point", 1, timeout=120)
    assert harness.finish() == 0
    assert point.fieldsInt["count"] == 20 and point.time == 5_000
    assert dict(point.tags) == {"host": "a"} and list(point.dimensions) == ["host"]


def test_a_udf_error_fails_the_task_with_a_clear_message(engines):
    def feed(driver):
        driver.point(time=1, name="m", group="host=x", dimensions=["host"], tags={"host": "x"}, fieldsDouble={"v": 1.0})

    for spec, expected in ((sample.failing, "ValueError: boom in the UDF"), (sample.wrong_result, "must return a pandas DataFrame or None, got list")):
        harness, driver = run_agent(spec, engines, (), None, feed)
        (error,) = driver.responses.wait_for("error", 1, timeout=120)
        assert expected in error.error and "host=x" in error.error
        assert harness.finish() == 1


@pytest.mark.parametrize("decoded", ["compiled", "reference"])
def test_tag_named_like_a_field_is_shown_with_a_prefix(decoded):
    point = udf_pb2.Point(time=5, tags={"x": "tag value", "host": "a"}, fieldsDouble={"x": 1.0})
    frame, layout = user_frame(decoded_points_of(encode_frame(point), decoded))
    # Tags, then fields, each sorted by name: the same layout whatever order points list them in.
    assert list(frame.columns) == ["time", "host", "tag:x", "x"]
    assert frame["time"][0] == pd.Timestamp(5, unit="ns", tz="UTC")
    assert layout.tag_columns == {"tag:x": "x", "host": "host"}



def test_a_udf_that_declares_what_it_reads_gets_time_and_those_columns_and_its_results_mean_the_same():
    """``reads`` (here a function of the options, naming a column no point carries too): the
    frame holds ``time`` and the columns read; a result column named like an unread tag is
    still that tag, as it is for a UDF given every column."""
    from udf_agent import Option, stream_udf
    from udf_agent.compute.packed import StreamTasks
    from udf_agent.compute.run import compute_stream

    columns = {}

    def call(df, ctx):
        columns.setdefault(ctx.options["name"], set()).add(tuple(df.columns))
        return pd.DataFrame({"twice": df[ctx.options["field"]] * 2.0, "region": "set"}, index=df.index)

    options = [Option("field", str), Option("name", str)]
    reading = stream_udf(options=options, reads=lambda options: [options["field"], "absent"], name="reading")(call)
    every = stream_udf(options=options, name="every")(call)
    tasks = StreamTasks.of_table(stream_tasks(rich_points(12)))
    outputs = []
    for spec in (reading, every):
        results = compute_stream(Job(spec, {"field": "d", "name": spec.name}), tasks)
        assert results.errors.all_missing(), results.errors.texts()
        outputs.append([decode(output) for output in results.output.tolist()])
    assert columns["reading"] == {("time", "d")}
    assert all({"time", "host", "region", "b", "d", "i", "s"} <= set(frame) for frame in columns["every"])
    assert outputs[0] == outputs[1] and {response.point.tags["region"] for group in outputs[0] for response in group} == {"set"}


@pytest.mark.parametrize("reads", ["d", [1]], ids=["a-string", "not-names"])
def test_reads_that_are_not_column_names_fail_at_init(reads):
    from udf_agent import stream_udf
    from udf_agent.api import BindError

    spec = stream_udf(reads=reads, name="reading")(lambda df, ctx: df)
    with pytest.raises(BindError, match="reads must be a list of column names"):
        spec.bind([])

def decoded_points_of(data, decoded):
    """``data``'s points decoded by the compiled codec (its numpy arrays), or by the reference
    (its Arrow table): the two ways a UDF's frame is made."""
    if decoded == "compiled":
        return pointcodec.decode_with_headers(data)[0]
    return DecodedPoints(decode_points(data))


def test_the_frame_from_the_compiled_decoders_arrays_is_the_one_from_the_reference_table():
    points = rich_points(120)
    # A field sent as a double by some points and as an int or a string by others, absent from the rest.
    points[3].fieldsInt["d"] = 7
    del points[3].fieldsDouble["d"]
    points[5].fieldsString["d"] = "text"  # point 5 has no double "d" (rich_points)
    del points[8].fieldsDouble["d"]
    points[9].tags.pop("region")
    data = b"".join(encode_frame(point) for point in points)
    compiled, compiled_layout = user_frame(decoded_points_of(data, "compiled"))
    reference, reference_layout = user_frame(decoded_points_of(data, "reference"))
    pd.testing.assert_frame_equal(compiled, reference)
    assert compiled_layout == reference_layout
    assert compiled["d"].tolist()[3:6] == [7, reference["d"][4], "text"] and compiled["region"][9] is None
    assert compiled["i"].dtype == "int64" and compiled["b"].dtype == "bool" and compiled["s"].dtype == object
    # Where a number is absent from some points, pandas' nullable dtype tells NA from NaN.
    sparse = [udf_pb2.Point(time=1, name="m", fieldsDouble={"v": float("nan")}), udf_pb2.Point(time=2, name="m", fieldsInt={"n": 1})]
    for decoded in ("compiled", "reference"):
        frame, _ = user_frame(decoded_points_of(b"".join(encode_frame(point) for point in sparse), decoded))
        assert str(frame["v"].dtype) == "Float64" and np.isnan(frame["v"][0]) and frame["v"][1] is pd.NA
        assert str(frame["n"].dtype) == "Int64" and frame["n"][0] is pd.NA and frame["n"][1] == 1


@pytest.mark.parametrize("decoded", ["compiled", "reference"])
def test_a_udf_may_write_into_its_frame_without_touching_what_the_runner_decoded(decoded):
    points = [udf_pb2.Point(time=t, name="m", tags={"host": "a"}, fieldsDouble={"v": 1.0}, fieldsInt={"n": t} if t % 2 else {}) for t in (10, 21, 30)]
    decoded_points = decoded_points_of(b"".join(encode_frame(point) for point in points), decoded)
    frame, _ = user_frame(decoded_points)
    # As a UDF may: the time, a float column and a column some points lack (Int64), in place.
    frame.loc[0, "time"] = pd.Timestamp(0, tz="UTC")
    frame.loc[1, "v"] = 5.0
    frame.loc[1, "n"] = 42
    assert frame["n"][1] == 42 and frame["n"].isna().tolist() == [True, False, True]
    assert decoded_points.times.tolist() == [10, 21, 30]  # kept histories go by these
    assert user_frame(decoded_points)[0]["v"].tolist() == [1.0, 1.0, 1.0]


def test_a_frame_made_of_its_arrays_equals_the_one_pandas_builds_of_them():
    """``frame_of`` skips pandas' constructor (its checks cost more than a trickle's UDF): what
    it makes of every kind of column a UDF is given is the frame pandas would make."""
    import numpy as np

    from udf_agent.compute.frame import INPUT_ROW, frame_of

    rows = 4
    arrays = [
        pd.array(pd.to_datetime(np.arange(rows), unit="ns", utc=True)),
        np.array([1.5, np.nan, 3.0, 4.0]),
        pd.array([1, None, 3, 4], dtype="Int64"),
        np.array(["a", None, "c", "d"], dtype=object),
        np.array([True, False, True, False]),
    ]
    names = ("time", "f", "i", "s", "b")
    index = pd.RangeIndex(rows, name=INPUT_ROW)
    frame = frame_of(arrays, names, index)
    pd.testing.assert_frame_equal(frame, pd.DataFrame(dict(zip(names, arrays)), index=index))
    # Where each column lies is given, not worked out by pandas: the same as pandas' own.
    given = frame._mgr.blknos.tolist(), frame._mgr.blklocs.tolist()
    frame._mgr._rebuild_blknos_and_blklocs()
    assert given == (frame._mgr.blknos.tolist(), frame._mgr.blklocs.tolist())
    frame.loc[1, "f"] = 2.0  # a frame like any other: written, grown, sliced
    frame["g"] = frame["f"] * 2
    assert frame.iloc[1:3]["g"].tolist() == [4.0, 6.0] and frame["i"].isna().tolist() == [False, True, False, False]
    # Changed the ways pandas rewrites where its columns lie, twice: each frame its own.
    for _ in range(2):
        changed, expected = frame_of(arrays, names, index), pd.DataFrame(dict(zip(names, arrays)), index=index)
        for each in (changed, expected):
            each.insert(1, "h", 0.5)
            each["b"] = each["f"] + 1  # a column of another dtype in place
            del each["s"]
        pd.testing.assert_frame_equal(changed, expected)


def test_a_udf_adds_a_column_to_a_frame_of_many_fields_without_a_fragmentation_warning():
    # A few columns are one block each (no copies); many are stacked, as pandas expects of them.
    fields = {f"f{i:03d}": float(i) for i in range(150)}
    data = encode_frame(udf_pb2.Point(time=1, name="m", fieldsDouble=fields))
    frame, _ = user_frame(decoded_points_of(data, "compiled"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", pd.errors.PerformanceWarning)
        frame["total"] = frame[list(fields)].sum(axis=1)
    assert frame["total"][0] == sum(fields.values())


def test_a_udf_cannot_rename_the_columns_of_later_frames():
    data = encode_frame(udf_pb2.Point(time=1, name="m", fieldsDouble={"v": 1.0}))
    frame, _ = user_frame(decoded_points_of(data, "compiled"))
    with pytest.raises(ValueError, match="read-only"):
        frame.columns.values[1] = "renamed"
    frame.columns = ["time", "mine"]  # renaming its own frame is fine
    assert list(user_frame(decoded_points_of(data, "compiled"))[0].columns) == ["time", "v"]


def test_a_result_with_two_columns_of_one_name_is_not_encoded_as_two_fields():
    from udf_agent.compute.results import encode_rows_of

    points, headers = pointcodec.decode_with_headers(encode_frame(udf_pb2.Point(time=1, name="m", fieldsDouble={"v": 1.0})))
    frame, layout = user_frame(points)
    result = pd.DataFrame([[1.0, 2.0]], columns=["a", "a"], index=frame.index)
    assert encode_rows_of(result, headers, layout, 1, 0) is None
    assert encode_rows_of(result.iloc[:, :1], headers, layout, 1, 0) is not None


def test_moving_avg_of_extreme_values_does_not_depend_on_boundaries(engines):
    # Huge values leaving the window would leave rounding residue in a running sum.
    values = [1e15, 0.01437, -1e15, 0.08309, 0.0004543, 3e14, 0.5, 0.25, -3e14, 0.125, 0.0625, 0.03125] * 3
    size = 3

    def feed(driver):
        for t, value in enumerate(values):
            driver.point(time=t, name="m", fieldsDouble={"v": value})

    results = []
    for max_batch_points in (1, 4, 1000):
        harness, driver = run_agent(
            moving_avg, engines, (option("field", "v"), option("size", size)), AgentConfig(flush_interval=0.01, max_batch_points=max_batch_points), feed
        )
        points = driver.responses.wait_for("point", len(values), timeout=300)
        assert harness.finish() == 0
        results.append([p.fieldsDouble["avg"] for p in points])
    expected = [sum(values[max(0, i - size + 1) : i + 1]) / len(values[max(0, i - size + 1) : i + 1]) for i in range(len(values))]
    assert results[0] == results[1] == results[2]
    for got, want in zip(results[0], expected):
        assert got == pytest.approx(want, rel=1e-9, abs=1e-9 * max(1.0, abs(want)))


def test_new_rows_from_a_fresh_frame_are_emitted_not_taken_for_history(engines):
    def feed(driver):
        for t in range(6):
            driver.point(time=t * 10, name="m", tags={"host": "a"}, fieldsDouble={"value": float(t)})

    # Boundaries set by count alone: this UDF's output depends on them.
    config = AgentConfig(flush_interval=60, adaptive_flush=False, max_batch_points=2)
    harness, driver = run_agent(sample.window_total, engines, (), config, feed)
    points = driver.responses.wait_for("point", 3, timeout=300)
    assert harness.finish() == 0
    # One point per micro-batch of two, each the total of the last three values.
    assert [(p.time, p.fieldsDouble["total"]) for p in points] == [(10, 1.0), (30, 6.0), (50, 12.0)]
    assert all(dict(p.tags) == {} and p.name == "m" for p in points)


def test_a_udf_calling_sys_exit_fails_the_task_instead_of_hanging(engines):
    def feed(driver):
        driver.point(time=1, name="m", fieldsDouble={"v": 1.0})

    harness, driver = run_agent(sample.exits, engines, (), None, feed)
    (error,) = driver.responses.wait_for("error", 1, timeout=30)
    assert "SystemExit" in error.error
    assert harness.finish(timeout=30) == 1


def test_keepalives_are_read_and_answered_while_micro_batches_wait_within_budget(engines):
    harness = InProcessAgent(sample.sleepy, engines, AgentConfig(flush_interval=0.01, max_batch_points=1))
    driver = harness.driver
    assert driver.init(option("seconds", 0.5)).success
    for t in range(6):
        driver.point(time=t, name="m", fieldsDouble={"x": float(t)})
    for stamp in range(1, 21):
        driver.keepalive(stamp)
        time.sleep(0.1)
    driver.responses.wait_for("point", 6, timeout=120)
    assert harness.finish() == 0
    latencies = driver.keepalive_latencies()
    assert max(latencies) <= 1.0, latencies


def test_past_the_budget_the_reader_stops_reading_and_sends_heartbeats(engines):
    harness = InProcessAgent(sample.sleepy, engines, AgentConfig(flush_interval=0.01, max_batch_points=1, max_pending_points=2))
    driver = harness.driver
    # Each call sleeps 1 s: the reader waits for room long enough for several 0.25 s heartbeats.
    assert driver.init(option("seconds", 1.0)).success
    for t in range(8):
        driver.point(time=t, name="m", fieldsDouble={"x": float(t)})
    # Once heartbeats come, the reader has read the points and stopped reading.
    deadline = time.monotonic() + 60
    while not any(k.time > 10**18 for k in driver.responses.of("keepalive")):
        assert time.monotonic() < deadline, "no heartbeat while the reader waited for room"
        time.sleep(0.01)
    driver.keepalive(4242)
    driver.responses.wait_for("point", 8, timeout=120)
    assert harness.finish() == 0
    stamps = [k.time for k in driver.responses.of("keepalive")]
    # Kapacitor's own request was answered once read, and unasked heartbeats kept its watchdog fed before that.
    assert 4242 in stamps
    heartbeats = stamps[: stamps.index(4242)]
    assert len(heartbeats) >= 2 and all(s > 10**18 for s in heartbeats)


def test_over_the_budget_a_keepalive_behind_the_held_input_is_answered_within_milliseconds():
    from udf_agent.runtime.engines import Engines

    config = AgentConfig(flush_interval=0.01, max_batch_points=100, max_pending_points=100)
    harness = InProcessAgent(sample.slow_local, Engines(LocalEngine), config)
    driver = harness.driver
    assert driver.init(option("seconds", 2.0)).success
    sample.slow_local_began.clear()
    driver.point(time=0, name="m", fieldsDouble={"x": 0.0})
    assert sample.slow_local_began.wait(30), "the first micro-batch never began computing"
    # Computing for 2 s from now on. A full budget waiting: the reader holds back what follows.
    for t in range(1, 101):
        driver.point(time=t, name="m", fieldsDouble={"x": float(t)})
    deadline = time.monotonic() + 30
    while harness.agent.stats.points_in < 101:
        assert time.monotonic() < deadline, f"the budget's points were never read: {harness.agent.stats.points_in} of 101"
        time.sleep(0.01)
    for t in range(101, 104):
        driver.point(time=t, name="m", fieldsDouble={"x": float(t)})
    driver.keepalive(4242)
    # Read a few milliseconds later (the budget may be overshot by a tenth), not once the
    # 2 s micro-batch has made room: answered before that micro-batch's point.
    driver.responses.wait_for("point", 104, timeout=60)
    kinds = driver.responses.kinds()
    assert "keepalive" in kinds and kinds.index("keepalive") < kinds.index("point"), kinds[:5]
    assert harness.finish() == 0


# ---- vectorized UDFs: one call for many groups ----


def test_a_vectorized_udf_is_called_once_with_every_group_of_the_micro_batch():
    sample.vectorized_calls.clear()
    harness = InProcessAgent(sample.group_sizes, Engines(LocalEngine), AgentConfig(flush_interval=60, adaptive_flush=False, max_batch_points=9))
    driver = harness.driver
    assert driver.init().success
    # Two micro-batches of nine points over groups a, b, c: the second also carries one
    # history row per group.
    for t in range(18):
        group = "abc"[t % 3]
        driver.point(time=t, name="m", group=f"k={group}", dimensions=["k"], tags={"k": group}, fieldsDouble={"v": 1.0})
    points = driver.responses.wait_for("point", 18, timeout=60)
    assert harness.finish() == 0
    assert sample.vectorized_calls == [(("k=a", "k=b", "k=c"), [0, 3, 6, 9]), (("k=a", "k=b", "k=c"), [0, 4, 8, 12])]
    # History rows' results are dropped; every point comes out once, in order within its group.
    assert [p.time for p in points if p.tags["k"] == "a"] == list(range(0, 18, 3))
    assert [p.fieldsInt["rows"] for p in points] == [3] * 9 + [4] * 9


@pytest.mark.parametrize(
    "spec, message",
    [
        (sample.vectorized_new_rows, "must return one row per input row"),
        (sample.vectorized_with_state, "keeps no ctx.state"),
    ],
    ids=["new-rows", "state"],
)
def test_a_vectorized_udf_that_breaks_its_contract_fails_the_task_clearly(spec, message):
    harness = InProcessAgent(spec, Engines(LocalEngine), AgentConfig(flush_interval=0.01))
    driver = harness.driver
    assert driver.init().success
    driver.point(time=1, name="m", group="k=a", dimensions=["k"], tags={"k": "a"}, fieldsDouble={"v": 1.0})
    (error,) = driver.responses.wait_for("error", 1, timeout=30)
    assert message in error.error and "partition of 1 group(s)" in error.error
    assert harness.finish() == 1


@pytest.mark.parametrize("slice_groups", [10_000, 3_000])
def test_moving_avg_over_ten_thousand_groups_on_spark_matches_plain_pandas(engines, spark_engine, monkeypatch, slice_groups):
    # A micro-batch over more groups than a task slice holds is computed slice by slice.
    monkeypatch.setattr("udf_agent.runtime.tasks.TASK_SLICE_GROUPS", slice_groups)
    sizes = []
    run = spark_engine.run_stream

    def counted(job, tasks, tenant=None):
        sizes.append(len(tasks))
        return run(job, tasks, tenant)

    monkeypatch.setattr(spark_engine, "run_stream", counted)
    chain = spark_engine.chain_stream

    def chained(job, tasks, tenant, follow):  # a micro-batch of one slice, and those chained behind it
        sizes.append(len(tasks))

        def counted_follow():
            following = follow()
            if following is not None:
                sizes.append(len(following))
            return following

        return chain(job, tasks, tenant, counted_follow)

    monkeypatch.setattr(spark_engine, "chain_stream", chained)
    rng = np.random.default_rng(5)
    groups, per_group, size = 10_000, 3, 2
    values = rng.normal(size=groups * per_group)

    def feed(driver):
        frames = []
        for i, value in enumerate(values):
            group = f"h{i % groups}"
            point = udf_pb2.Point(time=i, name="cpu", group=f"host={group}", dimensions=["host"], tags={"host": group}, fieldsDouble={"v": value})
            frames.append(encode_frame(udf_pb2.Request(point=point)))
        driver.send_raw(b"".join(frames))

    config = AgentConfig(flush_interval=0.05, max_batch_points=12_000)
    harness, driver = run_agent(moving_avg, engines, (option("field", "v"), option("size", size)), config, feed)
    points = driver.responses.wait_for("point", len(values), timeout=300)
    assert harness.finish() == 0
    # Groups take turns, so a point's predecessor in its group is `groups` points earlier.
    expected = values.copy()
    expected[groups:] = (values[:-groups] + values[groups:]) / 2
    got = {p.time: p.fieldsDouble["avg"] for p in points}
    assert np.allclose([got[t] for t in range(len(values))], expected, rtol=1e-12, atol=0)
    assert [p.time for p in points] == list(range(len(values)))  # arrival order across 10 k groups
    assert max(sizes) == slice_groups and sum(sizes) >= groups


def test_moving_avg_turns_non_finite_and_missing_values_into_nan_and_never_fails():
    nan, inf = float("nan"), float("inf")
    # Per group, size 2: a NaN (or a point without the field, or a string) spoils the means
    # of the windows it is in, then leaves.
    series = {
        "a": [1.0, nan, 3.0, 4.0, 5.0],
        "b": [1.0, None, 3.0, 4.0, 5.0],  # None: the point has no field "v"
        "c": [1.0, inf, 3.0, -inf, 5.0],
        "d": [1.0, "x", 3.0, 4.0, 5.0],  # a string value
    }
    points = []
    for group, values in series.items():
        for t, value in enumerate(values):
            point = udf_pb2.Point(time=t, name="m", group=group, dimensions=["g"], tags={"g": group})
            if isinstance(value, str):
                point.fieldsString["v"] = value
            elif value is not None:
                point.fieldsDouble["v"] = value
            points.append(point)
    results = LocalEngine().run(Job(moving_avg, {"field": "v", "size": 2, "as": "avg"}), stream_tasks(points)).to_pandas()
    assert results["error"].isna().all(), results["error"].dropna().tolist()
    got = {key: [r.point.fieldsDouble["avg"] for r in decode(output)] for key, output in zip(results["key"], results["output"])}
    spoiled = [1.0, nan, nan, 3.5, 4.5]
    assert got["a"] == pytest.approx(spoiled, nan_ok=True)
    assert got["b"] == pytest.approx(spoiled, nan_ok=True)
    assert got["d"] == pytest.approx(spoiled, nan_ok=True)
    assert got["c"] == pytest.approx([1.0, inf, inf, -inf, -inf], nan_ok=True)


def test_past_max_groups_the_least_recently_seen_group_starts_afresh(caplog):
    from udf_agent.runtime.engines import Engines

    def feed(driver):
        for t, group, value in ((1, "a", 10.0), (2, "b", 20.0), (3, "c", 30.0), (4, "a", 40.0), (5, "c", 60.0)):
            driver.point(time=t, name="m", group=group, dimensions=["g"], tags={"g": group}, fieldsDouble={"v": value})

    config = AgentConfig(flush_interval=0.01, max_batch_points=1, max_groups=2)
    with caplog.at_level("WARNING", logger="udf_agent"):
        harness, driver = run_agent(moving_avg, Engines(LocalEngine), (option("field", "v"), option("size", 2)), config, feed)
        points = driver.responses.wait_for("point", 5, timeout=60)
        assert harness.finish() == 0
    means = {p.time: p.fieldsDouble["avg"] for p in points}
    # 'a' was the least recently seen when 'c' came: it comes back without history.
    # 'c' was seen more recently than 'b' when 'a' came back: it keeps its history.
    assert means == {1: 10.0, 2: 20.0, 3: 30.0, 4: 40.0, 5: 45.0}
    assert "--max-groups 2 reached" in caplog.text


@pytest.mark.parametrize("slice_groups", [10_000, 1], ids=["one-slice", "a-slice-per-group"])
@pytest.mark.parametrize("policy", ["skip", "dead-letter"])
def test_on_error_sets_the_failed_group_aside_and_the_task_goes_on(policy, slice_groups, tmp_path, caplog, monkeypatch):
    from udf_agent.runtime.engines import Engines

    monkeypatch.setattr("udf_agent.runtime.tasks.TASK_SLICE_GROUPS", slice_groups)

    def feed(driver):
        for t in range(6):
            group = "ab"[t % 2]
            driver.point(time=t, name="cpu", group=f"host={group}", dimensions=["host"], tags={"host": group}, fieldsDouble={"v": t + 0.5})

    config = AgentConfig(flush_interval=0.01, max_batch_points=2, on_error=policy, dead_letter_dir=str(tmp_path) if policy == "dead-letter" else None)
    with caplog.at_level("ERROR", logger="udf_agent"):
        harness, driver = run_agent(sample.fails_on, Engines(LocalEngine), (option("group", "host=b"),), config, feed)
        points = driver.responses.wait_for("point", 3, timeout=60)
        assert harness.finish() == 0
    assert [p.time for p in points] == [0, 2, 4]  # group a, all of it
    assert not driver.responses.of("error")
    assert "UDF failure set aside (--on-error " + policy in caplog.text and "boom on host=b" in caplog.text
    letters = sorted(tmp_path.iterdir())
    if policy == "skip":
        assert letters == []
        return
    written = "".join(path.read_text() for path in letters)
    assert "# udf-agent dead letter: UDF 'fails_on'" in written and "ValueError: boom on host=b" in written
    assert [line for line in written.splitlines() if not line.startswith("#")] == [
        f"cpu,host=b v={t + 0.5} {t}" for t in (1, 3, 5)
    ]


def test_on_error_skip_counts_the_points_of_a_failed_kapacitor_batch(caplog):
    from udf_agent.runtime.engines import Engines

    def feed(driver):
        driver.send(udf_pb2.Request(begin=udf_pb2.BeginBatch(name="m", group="g")))
        for t in range(3):
            driver.send(udf_pb2.Request(point=udf_pb2.Point(time=t, name="m", group="g", fieldsDouble={"other": 1.0})))
        driver.send(udf_pb2.Request(end=udf_pb2.EndBatch(name="m", group="g", tmax=2)))

    config = AgentConfig(flush_interval=0.01, on_error="skip")
    with caplog.at_level("ERROR", logger="udf_agent"):
        # outliers on a field the points lack: the batch fails, and is skipped.
        harness, driver = run_agent(outliers, Engines(LocalEngine), (option("field", "value"),), config, feed)
        assert harness.finish() == 0
    assert not driver.responses.of("error")
    assert "UDF failure set aside (--on-error skip): 3 point(s), 3 so far" in caplog.text


def test_the_context_names_the_task_the_node_and_each_points_database_and_retention_policy(engines):
    sent = [(t, "telegraf" if t % 3 else "other", "autogen" if t % 2 else "week") for t in range(30)]

    def feed(driver):
        for t, database, policy in sent:
            driver.point(time=t, name="m", group="k=a", dimensions=["k"], tags={"k": "a"}, database=database, retentionPolicy=policy, fieldsDouble={"v": 1.0})

    # Micro-batches of 7 points: the kept history row sits above each one's new rows.
    harness, driver = run_agent(sample.where_from, engines, (), AgentConfig(flush_interval=0.01, max_batch_points=7), feed)
    points = driver.responses.wait_for("point", len(sent), timeout=300)
    assert harness.finish() == 0
    got = [(p.time, p.fieldsString["database"], p.fieldsString["retention_policy"]) for p in points]
    assert got == sent
    assert {(p.fieldsString["task"], p.fieldsString["node"]) for p in points} == {("test", "udf1")}


def test_a_batch_udf_sees_each_points_database_and_the_task(engines):
    def feed(driver):
        driver.begin(name="m", group="", size=2)
        driver.point(time=1, name="m", database="db1", fieldsDouble={"v": 1.0})
        driver.point(time=2, name="m", database="db2", fieldsDouble={"v": 2.0})
        driver.end(name="m", group="", tmax=2)

    harness, driver = run_agent(sample.batch_where_from, engines, (), None, feed)
    driver.responses.wait_for("end", 1, timeout=300)
    assert harness.finish() == 0
    points = driver.responses.of("point")
    assert [(p.fieldsString["database"], p.fieldsString["task"], p.fieldsString["node"]) for p in points] == [("db1", "test", "udf1"), ("db2", "test", "udf1")]


def test_the_init_response_goes_before_the_output_of_points_sent_with_it(monkeypatch):
    """A relay carrying a task over replays its Init and the points after it in one write, not
    waiting for the InitResponse as Kapacitor does. Their output still comes after it: the relay
    drops what Kapacitor saw by counting frames, and an InitResponse behind the points once made
    it drop a point Kapacitor had not seen and pass a second InitResponse."""
    from udf_agent.library.builtins import mirror
    from udf_agent.wire import hotpath

    load_scanner = hotpath.load_scanner

    def slow_load() -> None:  # the InitResponse waits for the hot path (numba's first compile)
        time.sleep(0.5)
        load_scanner()

    monkeypatch.setattr(hotpath, "load_scanner", slow_load)
    agent = InProcessAgent(mirror, Engines(LocalEngine))
    points = [udf_pb2.Request(point=udf_pb2.Point(time=t, name="m", fieldsDouble={"x": 1.0})) for t in range(2)]
    agent.driver.send_raw(b"".join(encode_frame(r) for r in [udf_pb2.Request(init=udf_pb2.InitRequest(taskID="t")), *points]))
    agent.driver.responses.wait_for("point", 2, timeout=30)
    assert agent.driver.responses.kinds() == ["init", "point", "point"]
    assert agent.finish(30) == 0
