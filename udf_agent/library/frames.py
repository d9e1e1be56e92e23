"""What the ready UDFs read from the DataFrame they are given: a field as numbers, and
(for vectorized UDFs, whose rows come sorted by group) each row's place in its group."""

from __future__ import annotations

from typing import Any


def numeric_field(df: Any, field: str) -> Any:
    """FIELD as a float64 array, NaN where a point lacks it or holds something other than a number."""
    import numpy as np
    import pandas as pd

    if field not in df:
        return np.full(len(df), np.nan)
    return pd.to_numeric(df[field], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)


def places_in_groups(starts: Any) -> Any:
    """Each row's index within its group, from the groups' start rows (``Context.group_starts``,
    the row count last)."""
    import numpy as np

    return np.arange(starts[-1]) - np.repeat(starts[:-1], np.diff(starts))
