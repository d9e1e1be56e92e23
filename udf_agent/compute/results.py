"""The points a UDF's result becomes, as output frames: by the compiled encoder for the common
result (a field per row), else point by point."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from udf_agent import udf_pb2
from udf_agent.api import Context
from udf_agent.compute.frame import FIELD_COLUMN_PREFIX, INPUT_ROW, TAG_COLUMN_PREFIX, TIME_COLUMN, Layout
from udf_agent.wire import columns as cols
from udf_agent.wire import pointcodec


def output_points(
    result: Any,
    data: pa.Table,
    layout: Layout,
    ctx: Context,
    *,
    first_row: int,
    in_batch: bool = False,
    dimensions: tuple[str, ...] | None = None,
) -> list[udf_pb2.Point]:
    """Turns a UDF's result into points.

    Rows of a result whose index is still ``input_row`` carry that input row's
    time, metadata and tags; results for history rows (labels below
    ``first_row``) are dropped. Any other result is new rows: it must carry a
    ``time`` column and takes the group's metadata and tags. Columns that were tags, or are named ``tag:KEY``, are
    tags; ``time`` is the time; every other column is a field.
    """
    if result is None:
        return []
    if not isinstance(result, pd.DataFrame):
        raise TypeError(f"the UDF must return a pandas DataFrame or None, got {type(result).__name__}")
    if len(result) == 0:
        return []
    source = _source_rows(result, data.num_rows)
    if source is not None:
        keep = source >= first_row
        result, source = result[keep], source[keep]
        order = np.argsort(source, kind="stable")
        result, source = result.iloc[order], source[order]
    elif TIME_COLUMN in result.columns:
        result = result.iloc[np.argsort(_times(result[TIME_COLUMN]), kind="stable")]
    else:
        raise ValueError(
            "result rows must keep the input's index labels, or carry a 'time' column "
            f"(got index {result.index[:5].tolist()!r}...)"
        )
    count = len(result)
    if count == 0:
        return []
    last = data.num_rows - 1
    rows = source if source is not None else np.full(count, last, dtype=np.int64)
    times = _times(result[TIME_COLUMN]) if TIME_COLUMN in result.columns else data.column(cols.TIME).to_numpy()[rows]

    def meta(name: str) -> list[Any]:
        if last < 0:
            return [None] * count
        values: list[Any] = data.column(name).take(pa.array(rows)).to_pylist()
        return values

    names, databases, policies = meta(cols.NAME), meta(cols.DATABASE), meta(cols.RETENTION_POLICY)
    dims, by_names = meta(cols.DIMENSIONS), meta(cols.BY_NAME)
    tag_values: dict[str, list[Any]] = {}
    if source is not None:
        for name in data.column_names:
            if name.startswith(cols.TAG):
                tag_values[name[len(cols.TAG) :]] = data.column(name).take(pa.array(rows)).to_pylist()
    else:
        for tag, value in ctx.tags.items():
            tag_values[tag] = [value] * count
    fields: list[tuple[str, str, list[Any]]] = []
    for column in result.columns:
        if column == TIME_COLUMN:
            continue
        key: str | None = layout.tag_columns.get(column)
        if key is None and isinstance(column, str) and column.startswith(TAG_COLUMN_PREFIX):
            key = column[len(TAG_COLUMN_PREFIX) :]
        name = TIME_COLUMN if column == FIELD_COLUMN_PREFIX + TIME_COLUMN else str(column)
        values = result[column]
        if key is not None:
            override = [None if _missing(v) else str(v) for v in values.tolist()]
            base = tag_values.get(key, [None] * count)
            tag_values[key] = [o if o is not None else b for o, b in zip(override, base)]
        else:
            fields.append((name, _field_kind(column, values), values.tolist()))

    points = []
    for i in range(count):
        point = udf_pb2.Point(time=int(times[i]), group=ctx.group)
        if not in_batch:
            point.name = names[i] or ctx.name
            point.database = databases[i] or ""
            point.retentionPolicy = policies[i] or ""
            point.byName = bool(by_names[i])
            point.dimensions.extend(dimensions if dimensions is not None else (dims[i] or ()))
        for key, values in tag_values.items():
            value = values[i]
            if value is not None:
                point.tags[key] = value
        for key, kind, values in fields:
            _set_field(point, key, kind, values[i])
        points.append(point)
    return points


def encode_rows_of(
    result: Any, headers: pointcodec.Headers, layout: Layout, input_rows: int, seen: Any, offset: int = 0
) -> tuple[bytes, np.ndarray, np.ndarray] | None:
    """The compiled encoder's frames for the common result, or None for ``output_points``.

    The common result: one row per input row (index ``input_row``), field columns of
    float, int or bool dtype, no time or tag columns. Results for rows below ``seen``
    (a row number, or one per input row) were sent before and are dropped; the rest
    leave in input order. Returns the frames, the input rows they stand for (plus
    ``offset``: rows of ``headers``) and where each frame ends.
    """
    if not isinstance(result, pd.DataFrame):
        return None
    names = result.columns.tolist()  # a list: no lookup table to build
    # Read by name, two columns of one name are not two fields.
    if TIME_COLUMN in names or len(set(names)) != len(names):
        return None
    source = _source_rows(result, input_rows)
    if source is None:
        return None
    fields = []
    for position, column in enumerate(names):
        # The column's array, without making a Series of it (as long as the rest of this).
        values = result._get_column_array(position)
        if not isinstance(column, str) or column in layout.tag_columns or column.startswith(TAG_COLUMN_PREFIX) or not isinstance(values, np.ndarray):
            return None
        fields.append((TIME_COLUMN if column == FIELD_COLUMN_PREFIX + TIME_COLUMN else column, values))
    in_order = _ascending_range(result.index)
    whole = in_order and len(source) == input_rows  # every input row, in order: source[i] == i
    floor = seen[source] if isinstance(seen, np.ndarray) and not whole else seen
    picked = (source >= floor).nonzero()[0]
    if not in_order:
        picked = picked[np.argsort(source[picked], kind="stable")]
    rows = picked if whole else source[picked]
    if not (in_order and len(picked) == len(source)):  # else every row as it lies: no copies
        fields = [(name, values[picked]) for name, values in fields]
    encoded = pointcodec.encode_rows(headers, rows + offset if offset else rows, fields)
    if encoded is None:
        return None
    output, ends = encoded
    return output, rows, ends


def _source_rows(result: pd.DataFrame, input_rows: int) -> np.ndarray | None:
    """The input rows a result's rows stand for, or None for a result of new rows.

    Only an index still named ``input_row`` (kept by selections, ``assign``,
    ``DataFrame(index=df.index)``...) counts: a fresh ``pd.DataFrame({...})``
    numbered 0..k-1 is new rows, never mistaken for the first input rows.
    """
    index = result.index
    if index.name != INPUT_ROW:
        return None
    if _ascending_range(index) and index.start >= 0 and index.stop <= input_rows:
        # The input's own index, or a stretch of it (the usual vectorized result): in range
        # by construction, no need to look at each label.
        return np.arange(index.start, index.stop, index.step, dtype=np.int64)
    labels = index.to_numpy()
    if not pd.api.types.is_integer_dtype(labels.dtype) or (len(labels) and (labels.min() < 0 or labels.max() >= input_rows)):
        raise ValueError(
            f"the result's index is named {INPUT_ROW!r} but holds labels that are not input rows "
            f"(0..{input_rows - 1}); keep the input's index, or build new rows with a 'time' column and a fresh index"
        )
    rows: np.ndarray = labels.astype(np.int64)
    return rows


def _ascending_range(index: pd.Index) -> bool:
    """Whether ``index`` is a range going up: its rows are in input order already."""
    return isinstance(index, pd.RangeIndex) and index.step > 0


def _times(series: pd.Series) -> np.ndarray:
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        stamps = pd.DatetimeIndex(series)
        if stamps.tz is None:
            stamps = stamps.tz_localize("UTC")
        nanoseconds: np.ndarray = stamps.as_unit("ns").asi8
        return nanoseconds
    if pd.api.types.is_integer_dtype(series.dtype):
        integers: np.ndarray = series.to_numpy(dtype=np.int64)
        return integers
    raise TypeError(f"the 'time' column must hold timestamps or int64 nanoseconds, got {series.dtype}")


def _missing(value: Any) -> bool:
    return value is None or value is pd.NA or (isinstance(value, float) and value != value)


def _field_kind(column: Any, values: pd.Series) -> str:
    dtype = values.dtype
    if pd.api.types.is_bool_dtype(dtype):
        return "bool"
    if pd.api.types.is_integer_dtype(dtype):
        return "int"
    if pd.api.types.is_float_dtype(dtype):
        return "double"
    if pd.api.types.is_string_dtype(dtype) or pd.api.types.is_object_dtype(dtype):
        return "value"
    raise TypeError(
        f"result column {column!r} has dtype {dtype}; fields must be float, int, bool or str"
    )


def _set_field(point: udf_pb2.Point, key: str, kind: str, value: Any) -> None:
    if value is None or value is pd.NA:  # no value; a NaN is a value
        return
    if kind == "value":
        kind = _value_kind(key, value)
    if kind == "double":
        point.fieldsDouble[key] = value
    elif kind == "int":
        point.fieldsInt[key] = value
    elif kind == "bool":
        point.fieldsBool[key] = value
    else:
        point.fieldsString[key] = value


def _value_kind(key: str, value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return "bool"
    if isinstance(value, (int, np.integer)):
        return "int"
    if isinstance(value, (float, np.floating)):
        return "double"
    if isinstance(value, str):
        return "string"
    raise TypeError(f"field {key!r} holds a {type(value).__name__}; fields must be float, int, bool or str")
