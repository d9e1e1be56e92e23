"""Heavy UDFs for benchmarks: compute-heavy ones for the scaling measurements
(``benchmarks/deployment.py``, ``benchmarks/cores.py``), a slow one for the neighbours
(``benchmarks/neighbours.py``)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pandas as pd

from udf_agent import Option, batch_udf, stream_udf


@batch_udf(provides="stream", options=[Option("field", str), Option("degree", int, default=12), Option("resamples", int, default=8)])
def trend_fit(df: Any, ctx: Any) -> Any:
    """Per batch, a least-squares polynomial fit of `field` over time (`degree`), solved over
    `resamples` bootstrap resamples: one point at tmax with the fits' mean residual spread."""
    values = df[ctx.options["field"]].to_numpy(dtype="float64")
    if len(values) == 0:
        return pd.DataFrame({"time": [ctx.tmax], "spread": [np.nan]})
    x = np.linspace(-1.0, 1.0, len(values))
    design = np.vander(x, ctx.options["degree"] + 1)
    rng = np.random.default_rng(len(values))
    spreads = []
    for _ in range(ctx.options["resamples"]):
        rows = rng.integers(0, len(values), len(values))
        coefficients, *_ = np.linalg.lstsq(design[rows], values[rows], rcond=None)
        spreads.append(float(np.std(values - design @ coefficients)))
    return pd.DataFrame({"time": [ctx.tmax], "spread": [float(np.mean(spreads))]})


@stream_udf(options=[Option("seconds", float, default=1.0)])
def sleeps(df: Any, ctx: Any) -> Any:
    """Sleeps ``seconds`` a call (a group's share of a micro-batch), then echoes: the slow
    neighbour of ``benchmarks/neighbours.py``."""
    time.sleep(ctx.options["seconds"])
    return df


@stream_udf(options=[Option("micros", float, default=400.0)])
def burns(df: Any, ctx: Any) -> Any:
    """Spends ``micros`` of CPU a point (a busy loop, the GIL held as pure Python holds it),
    then echoes: a CPU-bound stream UDF, whose rate is the cores it computes on
    (``benchmarks/cores.py``)."""
    until = time.thread_time() + len(df) * ctx.options["micros"] / 1e6
    while time.thread_time() < until:
        pass
    return df
