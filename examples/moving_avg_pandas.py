"""Kapacitor's moving_avg.py example as a plain pandas UDF (docs/migrating.md shows the two side
by side): per group, the mean of the last `size` values of `field`. The built-in `moving_avg`
computes the same, vectorized over many groups at a time."""

import pandas as pd

from udf_agent import Option, stream_udf


@stream_udf(
    options=[Option("field", str), Option("size", int), Option("as", str, default="avg")],
    history=lambda options: options["size"] - 1,  # the window's earlier points, kept per group
)
def moving_avg(df, ctx):
    means = df[ctx.options.field].rolling(ctx.options.size, min_periods=1).mean()
    return pd.DataFrame({ctx.options["as"]: means.to_numpy()}, index=df.index)
