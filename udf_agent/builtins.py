"""The built-in UDFs, with the option names and types of Kapacitor's own examples."""

from __future__ import annotations

from typing import Any

from udf_agent.api import Context, UDFSpec, batch_udf, stream_udf
from udf_agent.options import Option


def _positive(value: int) -> Any:
    return value > 0 or f"must be > 0, got {value}"


def _at_least_one(value: float) -> Any:
    return value >= 1 or f"must be >= 1, got {value}"


@stream_udf(compute=False)
def mirror(df: Any, ctx: Context) -> Any:
    """Echoes every point unchanged (never starts Spark)."""
    return df


@stream_udf(
    options=[
        Option("field", str, help="field to average", example="usage_user"),
        Option("size", int, validate=_positive, help="number of points in the window", example=10),
        Option("as", str, default="avg", help="name of the output field"),
    ],
    history=lambda options: options["size"] - 1,
)
def moving_avg(df: Any, ctx: Context) -> Any:
    """Per group, the mean of the last `size` values of `field`, for every point."""
    import pandas as pd

    options = ctx.options
    values = pd.to_numeric(df[options["field"]], errors="raise").astype("float64") if options["field"] in df else None
    if values is None:
        raise KeyError(f"field {options['field']!r} is missing from group {ctx.group!r}")
    result = pd.DataFrame(index=df.index)
    result[options["as"]] = values.rolling(options["size"], min_periods=1).mean()
    return result


@batch_udf(
    options=[
        Option("field", str, help="field to test", example="value"),
        Option("scale", float, default=1.5, validate=_at_least_one, help="Tukey fence multiplier"),
    ]
)
def outliers(df: Any, ctx: Context) -> Any:
    """Per batch, the points outside the Tukey fences of `field`, unchanged."""
    options = ctx.options
    if df.empty:
        return df
    values = df[options["field"]].astype("float64")
    q1, q3 = values.quantile(0.25, interpolation="linear"), values.quantile(0.75, interpolation="linear")
    spread = (q3 - q1) * options["scale"]
    return df[(values < q1 - spread) | (values > q3 + spread)]


BUILTINS: dict[str, UDFSpec] = {spec.name: spec for spec in (mirror, moving_avg, outliers)}
