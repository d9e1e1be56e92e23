"""A UDF that does nothing but answer every point (a zero), with moving_avg's options and
history: run
as moving_avg is, its latency is what the path from Kapacitor to Spark's workers and back costs
alone (``run.py --cases latency``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from udf_agent import Option, stream_udf
from udf_agent.library.frames import field_read


# moving_avg's options, history and columns read: the same Init, the same history sent with
# every group, and frames of the same columns.
@stream_udf(
    options=[Option("field", str), Option("size", int), Option("as", str, default="avg")],
    history=lambda options: options["size"] - 1,
    vectorized=True,
    reads=field_read,
)
def zeros(df: Any, ctx: Any) -> Any:
    """A zero for every point, in field `as`."""
    return pd.DataFrame({ctx.options["as"]: np.zeros(len(df))}, index=df.index)
