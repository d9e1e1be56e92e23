"""Ready batch UDFs: ``resample`` each batch onto a regular grid, ``forecast`` its next
points, and ``ttest`` it against the group's previous batches. Formulas, options and
TICKscript examples: docs/library.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from udf_agent.api import Context, batch_udf
from udf_agent.library.frames import numeric_field
from udf_agent.options import Duration, Option, Validator, at_least, field_name

if TYPE_CHECKING:  # imported on the Info path (Kapacitor's Info, `udf-agent list`): pandas loads with the first call
    import numpy as np
    import pandas as pd

AGGREGATIONS = ("mean", "sum", "min", "max", "first", "last", "count")
FILLS = ("linear", "previous", "none")


def _one_of(choices: tuple[str, ...]) -> Validator:
    return lambda value: value in choices or f"must be one of {', '.join(choices)}, got {value!r}"


def _positive_duration(value: pd.Timedelta) -> bool | str:
    return value.value > 0 or f"must be > 0, got {value}"


@batch_udf(
    options=[
        Option("every", Duration, validate=_positive_duration, help="grid spacing", example=Duration("1m")),
        Option("agg", str, default="mean", validate=_one_of(AGGREGATIONS), help=f"how the points of a grid cell combine: {', '.join(AGGREGATIONS)}"),
        Option("fill", str, default="linear", validate=_one_of(FILLS), help="empty cells: linear (in time), previous, or none (left out)"),
    ]
)
def resample(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per batch, every numeric field on a regular grid of `every`, aggregated by `agg`,
    gaps filled by `fill`."""
    import numpy as np
    import pandas as pd

    fields = [c for c in df.columns if c != "time" and c not in ctx.tags and pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]
    if df.empty or not fields:
        return None
    every = ctx.options["every"].value
    stamps = df["time"].astype("int64").to_numpy()
    cells = stamps // every * every  # cells aligned to the epoch, as window().align() aligns
    values = df[fields].astype("float64")
    combined = values.groupby(cells).agg(ctx.options["agg"])
    grid = np.arange(cells.min(), cells.max() + every, every)
    gridded = combined.reindex(grid)
    fill = ctx.options["fill"]
    if fill == "linear":
        gridded = gridded.apply(lambda column: pd.Series(np.interp(grid, column.dropna().index, column.dropna().to_numpy()), index=grid) if column.notna().any() else column)
    elif fill == "previous":
        gridded = gridded.ffill()
    gridded = gridded.dropna(how="all")
    return gridded.reset_index(drop=True).assign(time=pd.to_datetime(gridded.index, unit="ns", utc=True))


def _unit_interval(value: float) -> bool | str:
    return 0 < value <= 1 or f"must be in (0, 1], got {value}"


def holt(values: np.ndarray, alpha: float, beta: float) -> tuple[float, float]:
    """Holt's linear trend: the level and trend after the last value."""
    level, trend = float(values[0]), float(values[1] - values[0])
    for value in values[1:]:
        previous = level
        level = alpha * float(value) + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
    return level, trend


@batch_udf(
    options=[
        Option("field", str, validate=field_name, help="field to forecast", example="usage_user"),
        Option("horizon", int, validate=at_least(1), help="future points per batch", example=10),
        Option("alpha", float, default=0.5, validate=_unit_interval, help="level smoothing"),
        Option("beta", float, default=0.3, validate=_unit_interval, help="trend smoothing"),
        Option("as", str, default="forecast", validate=field_name, help="name of the output field"),
    ]
)
def forecast(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per batch, `horizon` points after its last one by Holt's linear trend of `field`, spaced
    by the batch's median spacing."""
    import numpy as np
    import pandas as pd

    options = ctx.options
    field = options["field"]
    if field not in df:
        return None
    known = df.assign(value=numeric_field(df, field)).dropna(subset=["value"])
    if len(known) < 2:
        return None  # a trend needs two points
    stamps = known["time"].astype("int64").to_numpy()
    step = int(np.median(np.diff(stamps)))
    if step <= 0:
        return None
    level, trend = holt(known["value"].to_numpy(), options["alpha"], options["beta"])
    ahead = np.arange(1, options["horizon"] + 1)
    return pd.DataFrame({"time": pd.to_datetime(stamps[-1] + ahead * step, unit="ns", utc=True), options["as"]: level + ahead * trend})


def _pooled(summaries: list[list[float]]) -> tuple[float, float, float]:
    """(n, mean, sum of squared deviations) of several samples' summaries, pooled exactly
    (Chan et al.), without keeping their points."""
    n, mean, m2 = 0.0, 0.0, 0.0
    for count, batch_mean, batch_m2 in summaries:
        total = n + count
        delta = batch_mean - mean
        mean += delta * count / total
        m2 += batch_m2 + delta * delta * n * count / total
        n = total
    return n, mean, m2


@batch_udf(
    options=[
        Option("field", str, validate=field_name, help="field to test", example="usage_user"),
        Option("size", int, validate=at_least(1), help="earlier batches of the group the batch is tested against", example=5),
        Option("alpha", float, default=0.05, validate=_unit_interval, help="significance level of the `significant` field"),
    ],
    provides="stream",
)
def ttest(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per batch, Welch's t-test of `field` against the group's previous `size` batches
    pooled: one point at the batch's tmax with `t`, `pvalue` and `significant`."""
    import numpy as np
    import pandas as pd

    from udf_agent.library.distributions import t_two_sided_pvalue

    options = ctx.options
    values = numeric_field(df, options["field"])
    values = values[~np.isnan(values)]
    earlier: list[list[float]] = ctx.state.get("batches", [])
    current = [float(len(values)), float(values.mean()), float(((values - values.mean()) ** 2).sum())] if len(values) else None
    if current is not None:
        # Summaries only (n, mean, squared deviations): the state stays small and JSON.
        ctx.state["batches"] = [*earlier, current][-options["size"] :]
    if current is None or current[0] < 2:
        return None
    n2, mean2, m2 = _pooled(earlier)
    if n2 < 2:
        return None
    n1, mean1, m1 = current
    var1, var2 = m1 / (n1 - 1), m2 / (n2 - 1)
    spread = var1 / n1 + var2 / n2
    if spread == 0:
        return None  # constant samples: no test
    t = (mean1 - mean2) / np.sqrt(spread)
    dof = spread**2 / ((var1 / n1) ** 2 / (n1 - 1) + (var2 / n2) ** 2 / (n2 - 1))
    pvalue = t_two_sided_pvalue(float(t), float(dof))
    return pd.DataFrame({"time": [ctx.tmax], "t": [float(t)], "pvalue": [pvalue], "significant": [pvalue < options["alpha"]]})
