"""Ready batch UDFs that reshape each batch in time: ``resample`` onto a regular grid and
``forecast`` its next points. Formulas, options and TICKscript examples: docs/library.md."""

from __future__ import annotations

from typing import Any

from udf_agent.api import Context, batch_udf
from udf_agent.options import Duration, Option

AGGREGATIONS = ("mean", "sum", "min", "max", "first", "last", "count")
FILLS = ("linear", "previous", "none")


def _one_of(choices: tuple[str, ...]) -> Any:
    return lambda value: value in choices or f"must be one of {', '.join(choices)}, got {value!r}"


def _positive_duration(value: Any) -> Any:
    return value.value > 0 or f"must be > 0, got {value}"


@batch_udf(
    options=[
        Option("every", Duration, validate=_positive_duration, help="grid spacing", example=Duration("1m")),
        Option("agg", str, default="mean", validate=_one_of(AGGREGATIONS), help=f"how the points of a grid cell combine: {', '.join(AGGREGATIONS)}"),
        Option("fill", str, default="linear", validate=_one_of(FILLS), help="empty cells: linear (in time), previous, or none (left out)"),
    ]
)
def resample(df: Any, ctx: Context) -> Any:
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


def _unit_interval(value: float) -> Any:
    return 0 < value <= 1 or f"must be in (0, 1], got {value}"


def _at_least_one(value: int) -> Any:
    return value >= 1 or f"must be >= 1, got {value}"


def _a_name(value: str) -> Any:
    return value.strip() != "" or "must be a field name, got an empty string"


def holt(values: Any, alpha: float, beta: float) -> tuple[float, float]:
    """Holt's linear trend: the level and trend after the last value."""
    level, trend = float(values[0]), float(values[1] - values[0])
    for value in values[1:]:
        previous = level
        level = alpha * float(value) + (1 - alpha) * (level + trend)
        trend = beta * (level - previous) + (1 - beta) * trend
    return level, trend


@batch_udf(
    options=[
        Option("field", str, validate=_a_name, help="field to forecast", example="usage_user"),
        Option("horizon", int, validate=_at_least_one, help="future points per batch", example=10),
        Option("alpha", float, default=0.5, validate=_unit_interval, help="level smoothing"),
        Option("beta", float, default=0.3, validate=_unit_interval, help="trend smoothing"),
        Option("as", str, default="forecast", validate=_a_name, help="name of the output field"),
    ]
)
def forecast(df: Any, ctx: Context) -> Any:
    """Per batch, `horizon` points after its last one by Holt's linear trend of `field`, spaced
    by the batch's median spacing."""
    import numpy as np
    import pandas as pd

    options = ctx.options
    field = options["field"]
    if field not in df:
        return None
    known = df.assign(value=pd.to_numeric(df[field], errors="coerce")).dropna(subset=["value"])
    if len(known) < 2:
        return None  # a trend needs two points
    stamps = known["time"].astype("int64").to_numpy()
    step = int(np.median(np.diff(stamps)))
    if step <= 0:
        return None
    level, trend = holt(known["value"].to_numpy(), options["alpha"], options["beta"])
    ahead = np.arange(1, options["horizon"] + 1)
    return pd.DataFrame({"time": pd.to_datetime(stamps[-1] + ahead * step, unit="ns", utc=True), options["as"]: level + ahead * trend})
