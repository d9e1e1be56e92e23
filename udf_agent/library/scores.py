"""Ready stream UDFs that score each point against its group's recent past: ``ewma``,
``zscore`` and ``mad``. Formulas, options and TICKscript examples: docs/library.md."""

from __future__ import annotations

from typing import TYPE_CHECKING

from udf_agent.api import Context, stream_udf
from udf_agent.library.frames import field_read, numeric_field, places_in_groups
from udf_agent.options import Option, OptionValues, field_name, positive

if TYPE_CHECKING:  # imported on the Info path (Kapacitor's Info, `udf-agent list`): pandas loads with the first call
    import numpy as np
    import pandas as pd

# A window this long already costs size x rows floats per micro-batch.
MAX_WINDOW = 10_000


def _window_size(value: int) -> bool | str:
    return 2 <= value <= MAX_WINDOW or f"must be between 2 and {MAX_WINDOW}, got {value}"


def _ewma_alpha(options: OptionValues) -> float:
    alpha, span = options["alpha"], options["span"]
    return float(alpha) if alpha > 0 else 2.0 / (span + 1.0)


def _one_of_alpha_or_span(options: OptionValues) -> str | None:
    alpha, span = options["alpha"], options["span"]
    if (alpha > 0) == (span > 0):
        return "set exactly one of .alpha(0 < a <= 1) or .span(s >= 1)"
    if alpha > 1:
        return f"option 'alpha' must be in (0, 1], got {alpha}"
    if 0 < span < 1:
        return f"option 'span' must be >= 1, got {span}"
    return None


@stream_udf(
    options=[
        Option("field", str, validate=field_name, help="field to smooth", example="usage_user"),
        Option("alpha", float, default=0.0, help="smoothing factor in (0, 1]; or give span"),
        Option("span", float, default=0.0, help="span s >= 1, alpha = 2 / (s + 1); or give alpha"),
        Option("as", str, default="ewma", validate=field_name, help="name of the output field"),
    ],
    check_options=_one_of_alpha_or_span,
    reads=field_read,
)
def ewma(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per group, the exponentially weighted moving average of `field`, for every point.

    s = x for the group's first value, then s = alpha * x + (1 - alpha) * s. A point
    without a numeric `field` gets NaN and leaves s as it was."""
    import math

    import pandas as pd

    alpha = _ewma_alpha(ctx.options)
    smoothed = ctx.state.get("ewma")
    out = []
    for value in numeric_field(df, ctx.options["field"]).tolist():
        if math.isnan(value):
            out.append(math.nan)
            continue
        smoothed = value if smoothed is None else alpha * value + (1.0 - alpha) * smoothed
        out.append(smoothed)
    if smoothed is not None:
        ctx.state["ewma"] = smoothed  # JSON: kept between micro-batches and in snapshots
    return pd.DataFrame({ctx.options["as"]: out}, index=df.index)


def _windows(values: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """Row i's window: the last SIZE values of its group up to and including row i, as one
    row of a (rows, size) array, NaN where the group has fewer rows before i."""
    import numpy as np

    rows = np.arange(len(values))
    place = places_in_groups(starts)
    windows = np.full((len(values), size), np.nan)
    for lag in range(size):
        inside = place >= lag
        windows[inside, size - 1 - lag] = values[rows[inside] - lag]
    return windows


def _score_options(name: str, threshold: float) -> list[Option]:
    return [
        Option("field", str, validate=field_name, help="field to score", example="usage_user"),
        Option("size", int, validate=_window_size, help="earlier points of the group each point is scored against", example=30),
        Option("threshold", float, default=threshold, validate=positive, help="|score| above this is an anomaly"),
        Option("as", str, default=name, validate=field_name, help="name of the score field"),
        Option("anomaly", str, default="anomaly", validate=field_name, help="name of the boolean anomaly field"),
    ]


def _scored(df: pd.DataFrame, ctx: Context, scores: np.ndarray) -> pd.DataFrame:
    import numpy as np
    import pandas as pd

    options = ctx.options
    with np.errstate(invalid="ignore"):
        anomalous = np.abs(scores) > options["threshold"]
    return pd.DataFrame({options["as"]: scores, options["anomaly"]: anomalous}, index=df.index)


def _past_and_present(df: pd.DataFrame, ctx: Context) -> tuple[np.ndarray, np.ndarray]:
    """Each row's earlier ``size`` values of its group (rows, size), and its own value."""
    assert ctx.group_starts is not None  # a vectorized UDF's call always has it
    windows = _windows(numeric_field(df, ctx.options["field"]), ctx.group_starts, ctx.options["size"] + 1)
    return windows[:, :-1], windows[:, -1]


# The point itself stays out of its window: with it, |z| can never exceed (n - 1) / sqrt(n)
# (2.85 for 10 points), and an outlier would widen the very spread it is measured by.
@stream_udf(options=_score_options("zscore", 3.0), history=lambda options: options["size"], vectorized=True, reads=field_read)
def zscore(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per group, each point's z-score against the `size` values of `field` before it:
    (x - mean) / sample standard deviation, and whether |z| > threshold."""
    import numpy as np

    windows, values = _past_and_present(df, ctx)
    with np.errstate(invalid="ignore", divide="ignore"):
        counts = np.sum(~np.isnan(windows), axis=1)
        mean = np.nansum(windows, axis=1) / counts
        deviation = np.sqrt(np.nansum((windows - mean[:, None]) ** 2, axis=1) / (counts - 1))
        scores = (values - mean) / deviation
    scores[(counts < 2) | ~np.isfinite(scores)] = np.nan
    return _scored(df, ctx, scores)


# The MAD of a normal distribution is 0.6745 of its standard deviation (Iglewicz and Hoaglin).
MAD_SCALE = 0.6745


@stream_udf(options=_score_options("mad", 3.5), history=lambda options: options["size"], vectorized=True, reads=field_read)
def mad(df: pd.DataFrame, ctx: Context) -> pd.DataFrame | None:
    """Per group, each point's robust score against the `size` values of `field` before it:
    0.6745 (x - median) / MAD, and whether |score| > threshold."""
    import numpy as np

    windows, values = _past_and_present(df, ctx)
    scores = np.full(len(windows), np.nan)
    known = np.sum(~np.isnan(windows), axis=1) >= 2
    if known.any():
        with np.errstate(invalid="ignore", divide="ignore"):
            median = np.nanmedian(windows[known], axis=1)
            spread = np.nanmedian(np.abs(windows[known] - median[:, None]), axis=1)
            scores[known] = MAD_SCALE * (values[known] - median) / spread
    scores[~np.isfinite(scores)] = np.nan
    return _scored(df, ctx, scores)
