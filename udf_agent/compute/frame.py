"""The DataFrame a UDF sees, made from the Arrow table of a group's points (``wire.columns``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa

from udf_agent.wire import columns as cols

TIME_COLUMN = "time"
TAG_COLUMN_PREFIX = "tag:"
FIELD_COLUMN_PREFIX = "field:"
# The index name that marks a result's rows as input rows (see output_points).
INPUT_ROW = "input_row"


@dataclass
class Layout:
    """How the UDF's column names map back to tags and fields."""

    tag_columns: dict[str, str]  # user column -> tag key


def user_frame(data: pa.Table) -> tuple[pd.DataFrame, Layout]:
    """``time`` (UTC timestamps), one column per tag, one per field.

    A tag that shares its name with a field (or with ``time``) is shown as
    ``tag:NAME``, a field called ``time`` as ``field:time``. The index, named
    ``input_row``, numbers the rows. A field sent with different types in one frame becomes one
    object column holding each point's own value.
    """
    names = data.column_names
    field_kinds: dict[str, list[str]] = {}
    for name in names:
        prefix = cols.column_prefix(name) if ":" in name else ""
        if prefix in cols.FIELD_PREFIXES:
            field_kinds.setdefault(name[len(prefix) :], []).append(name)
    columns: dict[str, Any] = {
        TIME_COLUMN: pd.DatetimeIndex(data.column(cols.TIME).to_numpy().view("M8[ns]")).tz_localize("UTC")
    }
    layout = Layout(tag_columns={})
    for name in sorted(n for n in names if n.startswith(cols.TAG)):
        key = name[len(cols.TAG) :]
        user_name = TAG_COLUMN_PREFIX + key if key in field_kinds or key == TIME_COLUMN else key
        columns[user_name] = to_pandas(data.column(name))
        layout.tag_columns[user_name] = key
    for key, sources in sorted(field_kinds.items()):
        # A field may be called "time" (Kapacitor allows it); the time column keeps the name.
        column = FIELD_COLUMN_PREFIX + key if key == TIME_COLUMN else key
        if len(sources) == 1:
            columns[column] = to_pandas(data.column(sources[0]))
        else:
            merged = [None] * data.num_rows
            for source in sources:
                for row, value in enumerate(data.column(source).to_pylist()):
                    if value is not None and merged[row] is None:
                        merged[row] = value
            columns[column] = pd.Series(merged, dtype=object)
    # numpy arrays in, no copies: a Series per column would cost more than most UDFs.
    frame = pd.DataFrame(columns, index=pd.RangeIndex(data.num_rows, name=INPUT_ROW), copy=False)
    return frame, layout


# Sparse columns: pandas' nullable dtypes tell a missing value (NA) from a NaN.
_NULLABLE = {pa.int64(): pd.Int64Dtype(), pa.float64(): pd.Float64Dtype(), pa.bool_(): pd.BooleanDtype()}


def to_pandas(column: pa.ChunkedArray) -> Any:
    if column.null_count and column.type in _NULLABLE:
        return column.to_pandas(types_mapper=_NULLABLE.get)
    return column.to_numpy(zero_copy_only=False)
