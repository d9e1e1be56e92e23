"""What the ready UDFs read from the DataFrame they are given: a field as numbers, and
(for vectorized UDFs, whose rows come sorted by group) each row's place in its group."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported on the Info path (Kapacitor's Info, `udf-agent list`): pandas loads with the first call
    import numpy as np
    import pandas as pd

    from udf_agent.options import OptionValues


def field_read(options: OptionValues) -> list[str]:
    """``reads`` of a UDF that reads the column its ``field`` option names and no other: its
    frames are made without the rest (the other fields, the tags' strings)."""
    return [options["field"]]


def numeric_field(df: pd.DataFrame, field: str) -> np.ndarray:
    """FIELD as a float64 array, NaN where a point lacks it or holds something other than a number."""
    import numpy as np
    import pandas as pd

    columns = df.columns
    if field not in columns:
        return np.full(len(df), np.nan)
    place = columns.get_loc(field)
    if isinstance(place, int):
        # The usual case, one float64 column of that name: its array as the frame holds it
        # (``df[field]`` makes a Series first, most of the cost at a trickle).
        floats = df._get_column_array(place)
        if isinstance(floats, np.ndarray) and floats.dtype == np.float64:
            return floats
    values: np.ndarray = pd.to_numeric(df[field], errors="coerce").to_numpy(dtype="float64", na_value=np.nan)
    return values


def float_frame(df: pd.DataFrame, name: str, values: np.ndarray) -> pd.DataFrame:
    """A frame of one float column, NAME, row for row with DF (a vectorized UDF's result).

    Made from the array as it is, under a column index kept per name
    (``compute.frame.frame_of``): pandas' public constructor makes and checks a new index from
    a list of names, and checks the array and the axes again, on every call, several times the
    cost of the frame itself at a trickle."""
    from udf_agent.compute.frame import frame_of

    return frame_of([values], (name,), df.index)


def places_in_groups(starts: np.ndarray) -> np.ndarray:
    """Each row's index within its group, from the groups' start rows (``Context.group_starts``,
    the row count last)."""
    import numpy as np

    places: np.ndarray = np.arange(starts[-1]) - np.repeat(starts[:-1], np.diff(starts))
    return places
