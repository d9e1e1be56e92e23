"""The ready stream UDFs ewma, zscore and mad: against plain pandas, exact across micro-batch
boundaries on Spark, and through a snapshot restored in a fresh agent."""

import numpy as np
import pandas as pd
import pytest

from udf_agent.library.scores import ewma, mad, zscore
from udf_agent.options import Duration
from udf_agent.runtime.config import AgentConfig
from udf_agent.testing import InProcessAgent, option, run_udf

HOSTS = ("a", "b", "c")


def stream(count=120, seed=3):
    rng = np.random.default_rng(seed)
    rows = [(t, host, float(rng.normal(50, 10)) if (t, host) != (60, "b") else 400.0) for t in range(count) for host in HOSTS]
    return pd.DataFrame(rows, columns=["t", "host", "usage"])


def run_on_agent(spec, engines, options, frame, snapshot_after=None):
    """Feeds FRAME in micro-batches of 7 points; with SNAPSHOT_AFTER, takes a snapshot after
    that many points and goes on in a fresh agent restored from it. Output points by time."""

    def start():
        agent = InProcessAgent(spec, engines, AgentConfig(flush_interval=0.01, max_batch_points=7))
        assert agent.driver.init(*options).success
        return agent

    def feed(driver, rows):
        for t, host, usage in rows:
            driver.point(time=t, name="cpu", group=f"host={host}", dimensions=["host"], tags={"host": host}, fieldsDouble={"usage": usage})

    rows = list(frame.itertuples(index=False, name=None))
    cut = len(rows) if snapshot_after is None else snapshot_after
    agent = start()
    feed(agent.driver, rows[:cut])
    points = list(agent.driver.responses.wait_for("point", cut, timeout=300))
    if snapshot_after is not None:
        data = agent.driver.snapshot()
        assert agent.finish() == 0
        agent = start()
        assert agent.driver.restore(data).success
        feed(agent.driver, rows[cut:])
        points += agent.driver.responses.wait_for("point", len(rows) - cut, timeout=300)
    assert agent.finish() == 0
    assert len(points) == len(rows)
    return points


def by_group(frame, column, compute):
    return frame.groupby("host", sort=False)[column].transform(compute)


def ewma_reference(frame, alpha):
    return by_group(frame, "usage", lambda s: s.ewm(alpha=alpha, adjust=False).mean())


def zscore_reference(frame, size):
    """Each point against the SIZE points of its group before it."""
    mean = by_group(frame, "usage", lambda s: s.rolling(size, min_periods=2).mean().shift(1))
    std = by_group(frame, "usage", lambda s: s.rolling(size, min_periods=2).std(ddof=1).shift(1))
    return (frame["usage"] - mean) / std


def mad_reference(frame, size):
    def scores(series):
        out = []
        for i in range(len(series)):
            window = series.iloc[max(0, i - size) : i]
            median = window.median()
            spread = (window - median).abs().median()
            out.append(0.6745 * (series.iloc[i] - median) / spread if len(window) >= 2 and spread else np.nan)
        return pd.Series(out, index=series.index)

    return by_group(frame, "usage", scores)


CASES = [
    (ewma, [option("field", "usage"), option("alpha", 0.3)], lambda f: ewma_reference(f, 0.3), "ewma", None),
    (zscore, [option("field", "usage"), option("size", 10)], lambda f: zscore_reference(f, 10), "zscore", 3.0),
    (mad, [option("field", "usage"), option("size", 9)], lambda f: mad_reference(f, 9), "mad", 3.5),
]


def field_of(points, name):
    return np.array([p.fieldsDouble.get(name, np.nan) for p in points])


@pytest.mark.spark
@pytest.mark.parametrize("spec, options, reference, name, threshold", CASES, ids=[c[0].name for c in CASES])
def test_on_spark_in_micro_batches_of_seven_points_each_score_matches_plain_pandas(engines, spec, options, reference, name, threshold):
    frame = stream()
    points = run_on_agent(spec, engines, options, frame)
    assert [(p.time, p.tags["host"]) for p in points] == list(zip(frame["t"], frame["host"]))
    expected = reference(frame).to_numpy()
    np.testing.assert_allclose(field_of(points, name), expected, rtol=1e-9, atol=1e-12, equal_nan=True)
    if threshold is not None:
        flagged = [(p.time, p.tags["host"]) for p in points if p.fieldsBool["anomaly"]]
        assert flagged == [(t, h) for t, h, s in zip(frame["t"], frame["host"], expected) if abs(s) > threshold]
        assert (60, "b") in flagged


@pytest.mark.spark
@pytest.mark.parametrize("spec, options, reference, name, threshold", CASES, ids=[c[0].name for c in CASES])
def test_a_snapshot_restored_in_a_fresh_agent_continues_exactly(engines, spec, options, reference, name, threshold):
    frame = stream(count=40)
    uninterrupted = field_of(run_on_agent(spec, engines, options, frame), name)
    resumed = field_of(run_on_agent(spec, engines, options, frame, snapshot_after=50), name)
    np.testing.assert_array_equal(resumed, uninterrupted)


def test_ewma_by_span_and_a_point_without_the_field():
    data = pd.DataFrame({"time": pd.to_datetime(range(5), unit="s"), "usage": [1.0, 2.0, np.nan, 4.0, 5.0]})
    out = run_udf("ewma", data, {"field": "usage", "span": 3.0})
    # alpha = 2 / (3 + 1); the point without a value gets none and leaves the average as it was.
    assert out["ewma"].tolist()[:2] == [1.0, 1.5]
    assert np.isnan(out["ewma"][2])
    assert out["ewma"].tolist()[3:] == [2.75, 3.875]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"field": "usage"}, "set exactly one of .alpha"),
        ({"field": "usage", "alpha": 0.5, "span": 3.0}, "set exactly one of .alpha"),
        ({"field": "usage", "alpha": 1.5}, "'alpha' must be in (0, 1]"),
    ],
)
def test_ewma_refuses_options_that_do_not_name_one_smoothing(options, message):
    from udf_agent.tools.replay import ReplayError

    data = pd.DataFrame({"time": pd.to_datetime([1], unit="s"), "usage": [1.0]})
    with pytest.raises(ReplayError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        run_udf("ewma", data, options)


def test_zscore_window_size_must_hold_two_points():
    from udf_agent.tools.replay import ReplayError

    data = pd.DataFrame({"time": pd.to_datetime([1], unit="s"), "usage": [1.0]})
    with pytest.raises(ReplayError, match="'size': must be between 2 and 10000, got 1"):
        run_udf("zscore", data, {"field": "usage", "size": 1})


# --- batch UDFs: resample and forecast -----------------------------------------------------

SECOND = 1_000_000_000


def irregular_batches(seed=5):
    """Two hosts, points at irregular times over 3 minutes, with a gap in host b."""
    rng = np.random.default_rng(seed)
    rows = []
    for host in ("a", "b"):
        times = np.sort(rng.choice(np.arange(0, 180), size=40, replace=False))
        if host == "b":
            times = times[(times < 60) | (times > 100)]
        rows += [(int(t) * SECOND, host, float(rng.normal(10, 3))) for t in times]
    return pd.DataFrame(rows, columns=["time", "host", "usage"]).sort_values("time", kind="stable")


@pytest.mark.spark
@pytest.mark.parametrize("agg, fill", [("mean", "linear"), ("max", "previous"), ("count", "none")])
def test_resample_on_spark_matches_pandas_resample_per_window_and_host(engines, agg, fill):
    data = irregular_batches()
    out = run_udf("resample", data, {"every": Duration("10s"), "agg": agg, "fill": fill}, group_by=["host"], batch_every="1m", engines=engines)
    expected = []
    for (_, host), rows in data.groupby([data["time"] // (60 * SECOND), "host"]):
        series = rows.set_index(pd.to_datetime(rows["time"], unit="ns"))["usage"]
        grid = series.resample("10s", origin="epoch").agg(agg)
        if agg == "count":
            grid = grid.where(grid > 0)  # an empty cell has no points to count
        grid = {"linear": grid.interpolate("time"), "previous": grid.ffill(), "none": grid.dropna()}[fill]
        expected += [(host, int(t.value), float(v)) for t, v in grid.items()]
    got = [(h, int(t.value), float(v)) for h, t, v in zip(out["host"], out["time"], out["usage"])]
    assert_same_points(got, expected)
    assert len(got) > 20


def assert_same_points(got, expected):
    """(host, time, value) triples: the same keys, values within 1e-9."""
    got, expected = sorted(got), sorted(expected)
    assert [key[:2] for key in got] == [key[:2] for key in expected]
    np.testing.assert_allclose([v for *_, v in got], [v for *_, v in expected], rtol=1e-9)


def holt_reference(values, alpha, beta, horizon):
    levels, trends = [values[0]], [values[1] - values[0]]
    for value in values[1:]:
        levels.append(alpha * value + (1 - alpha) * (levels[-1] + trends[-1]))
        trends.append(beta * (levels[-1] - levels[-2]) + (1 - beta) * trends[-1])
    return [levels[-1] + h * trends[-1] for h in range(1, horizon + 1)]


@pytest.mark.spark
def test_forecast_on_spark_follows_holts_linear_trend_per_batch(engines):
    data = irregular_batches()
    out = run_udf("forecast", data, {"field": "usage", "horizon": 3, "alpha": 0.6, "beta": 0.2}, group_by=["host"], batch_every="1m", engines=engines)
    expected = []
    for (_, host), rows in data.groupby([data["time"] // (60 * SECOND), "host"]):
        stamps = rows["time"].to_numpy()
        step = int(np.median(np.diff(stamps)))
        values = holt_reference(rows["usage"].tolist(), 0.6, 0.2, 3)
        expected += [(host, int(stamps[-1] + h * step), v) for h, v in zip(range(1, 4), values)]
    got = [(h, int(t.value), v) for h, t, v in zip(out["host"], out["time"], out["forecast"])]
    assert_same_points(got, expected)


def test_forecast_of_a_straight_line_continues_it():
    data = pd.DataFrame({"time": pd.to_datetime(np.arange(10) * 5, unit="s"), "v": 2.0 * np.arange(10) + 1})
    out = run_udf("forecast", data, {"field": "v", "horizon": 2}, batch_every="1h")
    assert out["forecast"].tolist() == pytest.approx([21.0, 23.0])
    assert [t.value for t in out["time"]] == [50 * SECOND, 55 * SECOND]


# 2 * scipy.stats.t.sf(t, dof) (scipy 1.17.1), for these t in each row.
T_VALUES = (0.0, 0.1, 1.0, 2.5, 10.0, 40.0)
SCIPY_T_TWO_SIDED = {
    0.5: [1.0, 0.9463316211286064, 0.6022432216826441, 0.4009705290532932, 0.20267735277133117, 0.10140979992949435],
    1.0: [1.0, 0.936548965138893, 0.5000000000000001, 0.24223788318168682, 0.06345103486110713, 0.015912179824051624],
    2.7: [1.0, 0.9272983352515441, 0.39832434722077276, 0.09707941444293468, 0.003287656064689192, 7.995639890192217e-05],
    9.0: [1.0, 0.9225364479566812, 0.3434363961379136, 0.033861827682985735, 3.578237431924736e-06, 1.8982998449339822e-11],
    33.3: [1.0, 0.9209439520150112, 0.32452207319306736, 0.017517610879219808, 1.4660119866294544e-11, 9.836112135817584e-30],
    1000.0: [1.0, 0.9203643690236041, 0.31755241808467255, 0.012578567801090807, 1.6670702958600137e-22, 1.0478852155173272e-209],
    1e6: [1.0, 0.9203443454920432, 0.3173107498335783, 0.012419489502163254, 1.527861076817818e-23, 0.0],
}


@pytest.mark.parametrize("dof", sorted(SCIPY_T_TWO_SIDED))
def test_students_t_p_values_are_scipys(dof):
    from udf_agent.library.distributions import t_two_sided_pvalue

    got = [t_two_sided_pvalue(t, dof) for t in T_VALUES]
    np.testing.assert_allclose(got, SCIPY_T_TWO_SIDED[dof], rtol=1e-10, atol=0)
    assert [t_two_sided_pvalue(-t, dof) for t in T_VALUES] == got  # two-sided
    assert t_two_sided_pvalue(float("inf"), dof) == 0.0


def test_students_t_refuses_degrees_of_freedom_that_are_not_positive():
    from udf_agent.library.distributions import t_two_sided_pvalue

    for dof in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="degrees of freedom"):
            t_two_sided_pvalue(1.0, dof)


def welch_reference(sample: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """Welch's t and two-sided p from the raw samples (no pooled summaries)."""
    from udf_agent.library.distributions import t_two_sided_pvalue

    v1, v2 = sample.var(ddof=1) / len(sample), other.var(ddof=1) / len(other)
    t = (sample.mean() - other.mean()) / np.sqrt(v1 + v2)
    dof = (v1 + v2) ** 2 / (v1**2 / (len(sample) - 1) + v2**2 / (len(other) - 1))
    return float(t), t_two_sided_pvalue(float(t), float(dof))


@pytest.mark.spark
def test_ttest_on_spark_is_welchs_test_against_the_previous_batches_of_the_group(engines):
    rng = np.random.default_rng(9)
    rows = []
    for window in range(6):
        for host in ("a", "b"):
            shift = 4.0 if (window, host) == (4, "a") else 0.0
            rows += [(window * 60 * SECOND + i * SECOND, host, float(rng.normal(10 + shift, 1 + window % 2))) for i in range(8 + window)]
    data = pd.DataFrame(rows, columns=["time", "host", "usage"]).sort_values("time", kind="stable")
    # All six windows reach the agent at once: each batch must still see the state its group's
    # previous batch left.
    out = run_udf("ttest", data, {"field": "usage", "size": 3, "alpha": 0.01}, group_by=["host"], batch_every="1m", engines=engines)
    expected = []
    for host in ("a", "b"):
        windows = [data[(data["host"] == host) & (data["time"] // (60 * SECOND) == w)]["usage"].to_numpy() for w in range(6)]
        for w in range(1, 6):
            statistic, pvalue = welch_reference(windows[w], np.concatenate(windows[max(0, w - 3) : w]))
            expected.append((host, (w + 1) * 60 * SECOND, statistic, pvalue))
    got = [(h, t.value, tv, p) for h, t, tv, p in zip(out["host"], out["time"], out["t"], out["pvalue"])]
    assert [g[:2] for g in sorted(got)] == [e[:2] for e in sorted(expected)]
    np.testing.assert_allclose([g[2:] for g in sorted(got)], [e[2:] for e in sorted(expected)], rtol=1e-9)
    assert out["significant"].tolist() == (out["pvalue"] < 0.01).tolist()
    assert ["a", pd.Timestamp(5 * 60 * SECOND, unit="ns", tz="UTC")] in out[out["significant"]][["host", "time"]].values.tolist()


@pytest.mark.spark
def test_ttest_state_survives_a_snapshot_restored_in_a_fresh_agent(engines):
    from udf_agent.library.batches import ttest

    rng = np.random.default_rng(4)
    windows = [[float(v) for v in rng.normal(10 + (w == 5) * 3, 1, size=6)] for w in range(7)]

    def start():
        agent = InProcessAgent(ttest, engines, AgentConfig(flush_interval=0.01))
        assert agent.driver.init(option("field", "usage"), option("size", 3)).success
        return agent

    def send(driver, w):
        driver.begin(name="cpu", group="host=a", tags={"host": "a"}, size=len(windows[w]))
        for i, value in enumerate(windows[w]):
            driver.point(time=w * 60 * SECOND + i * SECOND, name="cpu", group="host=a", tags={"host": "a"}, fieldsDouble={"usage": value})
        driver.end(name="cpu", group="host=a", tags={"host": "a"}, tmax=(w + 1) * 60 * SECOND)

    def run(cut=None):
        agent = start()
        for w in range(7):
            if w == cut:
                agent.driver.responses.wait_for("point", w - 1, timeout=300)  # every earlier batch computed
                data = agent.driver.snapshot()
                assert agent.finish() == 0
                agent = start()
                assert agent.driver.restore(data).success
            send(agent.driver, w)
        points = agent.driver.responses.wait_for("point", 7 - 1 - (0 if cut is None else cut - 1), timeout=300)
        assert agent.finish() == 0
        return [(p.time, p.fieldsDouble["t"], p.fieldsDouble["pvalue"]) for p in points]

    uninterrupted = run()
    assert len(uninterrupted) == 6
    assert run(cut=4)[-3:] == uninterrupted[-3:]
