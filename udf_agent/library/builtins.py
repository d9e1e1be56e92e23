"""The built-in UDFs, with the option names and types of Kapacitor's own examples."""

from __future__ import annotations

from typing import TYPE_CHECKING

from udf_agent.api import Context, UDFSpec, batch_udf, stream_udf
from udf_agent.library.frames import field_read
from udf_agent.options import Option, at_least, field_name, positive

if TYPE_CHECKING:  # imported on the Info path (Kapacitor's Info, `udf-agent list`): pandas loads with the first call
    import pandas as pd


def _echo(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Echoes every point unchanged (never starts Spark)."""
    return df


# Points are forwarded as the bytes Kapacitor sent; the function states what that means.
mirror = UDFSpec(name="mirror", function=_echo, compute=False, passthrough=True, description=_echo.__doc__ or "")


@stream_udf(
    options=[
        Option("field", str, validate=field_name, help="field to average", example="usage_user"),
        Option("size", int, validate=positive, help="number of points in the window", example=10),
        Option("as", str, default="avg", validate=field_name, help="name of the output field"),
    ],
    history=lambda options: options["size"] - 1,
    vectorized=True,
    reads=field_read,
)
def moving_avg(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per group, the mean of the last `size` values of `field`, for every point.

    A NaN in the window makes the mean NaN until it leaves the window; so does a point
    without the field, or with a string in it. Never a task failure."""
    import numpy as np

    from udf_agent.library.frames import float_frame, numeric_field
    from udf_agent.library.windows import window_means

    options = ctx.options
    assert ctx.group_starts is not None  # a vectorized UDF's call always has it
    # Every group at once: each row's place in its group bounds its window. One layout of
    # arrays, so the kernel is compiled for no other.
    values = np.ascontiguousarray(numeric_field(df, options["field"]), np.float64)
    means = window_means(values, np.ascontiguousarray(ctx.group_starts, np.int64), options["size"])
    return float_frame(df, options["as"], means)


@batch_udf(
    options=[
        Option("field", str, validate=field_name, help="field to test", example="value"),
        Option("scale", float, default=1.5, validate=at_least(1), help="Tukey fence multiplier"),
    ]
)
def outliers(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per batch, the points outside the Tukey fences of `field`, unchanged."""
    options = ctx.options
    if df.empty:
        return df
    values = df[options["field"]].astype("float64")
    q1, q3 = values.quantile(0.25, interpolation="linear"), values.quantile(0.75, interpolation="linear")
    spread = (q3 - q1) * options["scale"]
    return df[(values < q1 - spread) | (values > q3 + spread)]


def _all() -> dict[str, UDFSpec]:
    from udf_agent.library.batches import forecast, resample, ttest
    from udf_agent.library.scores import ewma, mad, zscore

    return {spec.name: spec for spec in (mirror, moving_avg, outliers, ewma, zscore, mad, resample, forecast, ttest)}


BUILTINS: dict[str, UDFSpec] = _all()
