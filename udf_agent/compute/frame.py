"""The DataFrame a UDF sees, made from a group's decoded points (``wire.pointcodec``)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from pandas._libs.internals import BlockPlacement
from pandas.core.arrays import DatetimeArray
from pandas.core.internals.blocks import ensure_block_shape, get_block_type, maybe_coerce_values
from pandas.core.internals.construction import arrays_to_mgr
from pandas.core.internals.managers import BlockManager

from udf_agent.wire import columns as cols
from udf_agent.wire.pointcodec import DecodedPoints

TIME_COLUMN = "time"
TAG_COLUMN_PREFIX = "tag:"
FIELD_COLUMN_PREFIX = "field:"
# The index name that marks a result's rows as input rows (see output_points).
INPUT_ROW = "input_row"
# Up to this many columns, a frame keeps one block a column (see ``user_frame``).
FEW_COLUMNS = 32


@dataclass(frozen=True)
class Layout:
    """How the UDF's column names map back to tags and fields (one per plan, shared by its frames: read only)."""

    tag_columns: dict[str, str]  # user column -> tag key


def user_frame(points: DecodedPoints, reads: frozenset[str] | None = None) -> tuple[pd.DataFrame, Layout]:
    """``time`` (UTC timestamps), one column per tag, one per field; of them only those in
    ``reads`` if given (the UDF's ``reads``).

    A tag that shares its name with a field (or with ``time``) is shown as
    ``tag:NAME``, a field called ``time`` as ``field:time``. The index, named
    ``input_row``, numbers the rows. A field sent with different types in one frame becomes one
    object column holding each point's own value.
    """
    plan = _plan(tuple(points.names), reads)
    columns: dict[str, Any] = {TIME_COLUMN: _utc_times(points.times)}
    for user_name, sources in plan.columns:
        if len(sources) == 1:
            columns[user_name] = _pandas_array(*points.values(sources[0]))
        else:
            merged = np.full(points.num_rows, None, dtype=object)
            for source in sources:
                values, valid = points.values(source)
                unset = merged == None  # noqa: E711  # elementwise: which rows no earlier kind filled
                take = unset if valid is None else unset & valid
                merged[take] = values[take].tolist()
            columns[user_name] = merged
    # Arrays that already have their final dtypes, no copies: pandas' checks of each column
    # cost more than most UDFs on a small micro-batch, and so does stacking the columns of
    # one dtype into one block (a copy each; 156 -> 115 us a frame of 40 rows and 6 columns),
    # which pandas does later if an operation wants it. Many columns are stacked all the
    # same: pandas warns of a "highly fragmented" frame past 100 blocks when a UDF adds one.
    index = pd.RangeIndex._simple_new(range(points.num_rows), name=INPUT_ROW)  # the public constructor checks its arguments: 5 against 1 µs
    if len(columns) > FEW_COLUMNS:
        manager = arrays_to_mgr(list(columns.values()), column_index(tuple(columns)), index, verify_integrity=False, typ="block", consolidate=True)
        return pd.DataFrame._from_mgr(manager, axes=manager.axes), plan.layout
    return frame_of(list(columns.values()), tuple(columns), index), plan.layout


def read_sources(names: tuple[str, ...], reads: frozenset[str]) -> frozenset[str]:
    """The decoded columns (of ``names``) that a frame reading ``reads`` is made from."""
    return frozenset(source for _, sources in _plan(names, reads).columns for source in sources)


def frame_of(arrays: list[Any], names: tuple[str, ...], index: pd.Index) -> pd.DataFrame:
    """A frame of ``arrays`` (final dtypes, one per column, as long as ``index``), one block a
    column, the arrays themselves as its values: pandas' constructors check and group them
    again (``arrays_to_mgr``: 23 against 14 µs a frame of one column, 33 against 24 of two)."""
    blocks = tuple(_block(array, place) for place, array in enumerate(arrays))
    manager = BlockManager(blocks, [column_index(names), index], verify_integrity=False)
    # Where each column lies, as pandas would work it out at the first column read (~10 µs
    # on a fresh frame): column i is block i's only one. Fresh arrays: pandas writes into them.
    manager._blknos = np.arange(len(blocks), dtype=np.intp)
    manager._blklocs = np.zeros(len(blocks), dtype=np.intp)
    return pd.DataFrame._from_mgr(manager, axes=manager.axes)


def _block(array: Any, place: int) -> Any:
    """A one-column block of ``array``: pandas' ``new_block_2d(ensure_block_shape(array, 2))``
    with its checks of the dtype worked out once per dtype."""
    kind, reshaped, checked = _block_kind(array.dtype)
    if not checked:
        array = maybe_coerce_values(array)
    return kind(array.reshape(1, -1) if reshaped else array, ndim=2, placement=_placement(place))


@lru_cache(maxsize=FEW_COLUMNS)
def _placement(place: int) -> BlockPlacement:
    return BlockPlacement(slice(place, place + 1))


@lru_cache(maxsize=64)
def _block_kind(dtype: Any) -> tuple[type, bool, bool]:
    """The block class for ``dtype``, whether its arrays are stored 2-D, and whether they need
    no coercion (numbers, booleans, objects and pandas' own arrays: anything but numpy's
    datetimes, timedeltas and fixed-width strings)."""
    probe = np.empty(0, dtype) if isinstance(dtype, np.dtype) else dtype.construct_array_type()._from_sequence([], dtype=dtype)
    return get_block_type(dtype), ensure_block_shape(probe, 2).ndim == 2, isinstance(dtype, pd.api.extensions.ExtensionDtype) or dtype.kind not in "mMU"


@dataclass(frozen=True)
class _Plan:
    """What a frame of given decoded columns holds: each user column (after ``time``) and the
    decoded columns it comes from (several for a field sent with different types), and
    which are tags."""

    columns: tuple[tuple[str, tuple[str, ...]], ...]
    # User column to tag key: every tag, read or not, so a result's columns mean the same either way.
    layout: Layout


@lru_cache(maxsize=256)
def _plan(names: tuple[str, ...], reads: frozenset[str] | None) -> _Plan:
    """One per set of decoded column names (a task sends the same few) and of columns read:
    working the names out took a third of a small frame's cost."""
    field_kinds: dict[str, list[str]] = {}
    for name in names:
        prefix = cols.column_prefix(name) if ":" in name else ""
        if prefix in cols.FIELD_PREFIXES:
            field_kinds.setdefault(name[len(prefix) :], []).append(name)
    columns: list[tuple[str, tuple[str, ...]]] = []
    tag_columns: list[tuple[str, str]] = []
    for name in sorted(n for n in names if n.startswith(cols.TAG)):
        key = name[len(cols.TAG) :]
        user_name = TAG_COLUMN_PREFIX + key if key in field_kinds or key == TIME_COLUMN else key
        columns.append((user_name, (name,)))
        tag_columns.append((user_name, key))
    for key, sources in sorted(field_kinds.items()):
        # A field may be called "time" (Kapacitor allows it); the time column keeps the name.
        columns.append((FIELD_COLUMN_PREFIX + key if key == TIME_COLUMN else key, tuple(sources)))
    if reads is not None:
        columns = [column for column in columns if column[0] in reads]
    return _Plan(tuple(columns), Layout(dict(tag_columns)))


def column_index(names: tuple[str, ...]) -> pd.Index:
    """A frame's column Index, of one kept per set of names: a new one costs 20 µs, and its
    first lookup as much again (a view shares the lookup table; each frame gets its own view,
    so renaming one renames no other). Its names are read-only: a UDF writing into
    ``df.columns.values`` would otherwise rename the columns of every later frame."""
    return _column_index(names).view()


@lru_cache(maxsize=256)
def _column_index(names: tuple[str, ...]) -> pd.Index:
    values = np.array(names, dtype=object)
    values.flags.writeable = False
    return pd.Index(values, dtype=object, copy=False)


def _utc_times(nanoseconds: np.ndarray) -> Any:
    """int64 nanoseconds as pandas' UTC timestamps (the public constructors check and convert
    them again: 20-30 µs against 2). A copy: the UDF may change its frame's times, and the
    runner keeps histories by the times decoded."""
    return DatetimeArray._simple_new(nanoseconds.astype("M8[ns]"), dtype=_UTC)


def _pandas_array(values: np.ndarray, valid: np.ndarray | None) -> Any:
    """A column as the UDF sees it: numpy, or where a number is absent from some points one
    of pandas' nullable arrays, which tell a missing value (NA) from a NaN. Strings stay
    objects, None where absent."""
    if valid is None or values.dtype == object:
        return values
    return _NULLABLE[values.dtype.kind](values, ~valid)


_UTC = pd.DatetimeTZDtype("ns", "UTC")
_NULLABLE = {"f": pd.arrays.FloatingArray, "i": pd.arrays.IntegerArray, "b": pd.arrays.BooleanArray}
