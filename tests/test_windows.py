"""moving_avg's compiled window means against their twin, the numpy loop moving_avg ran
before: equal bit for bit, NaN, infinities, signed zeros and extremes included (any NaN
matches any NaN)."""

from __future__ import annotations

import numpy as np
import pytest

from udf_agent.library.windows import window_means


def window_means_twin(values: np.ndarray, starts: np.ndarray, size: int) -> np.ndarray:
    """The reference: per lag, the value that many rows back where it is in the row's group."""
    place = np.arange(starts[-1]) - np.repeat(starts[:-1], np.diff(starts))
    sums = np.zeros(len(values))
    with np.errstate(all="ignore"):  # infinities and NaN are among the values
        for lag in range(min(size, len(values)) - 1, 0, -1):
            sums[lag:] += np.where(place[lag:] >= lag, values[:-lag], 0.0)
        sums += values
        return sums / np.minimum(place + 1, size)


def same_bits(got: np.ndarray, want: np.ndarray) -> bool:
    """Equal to the last bit, a zero's sign included; a NaN matches a NaN (its sign and payload
    depend on which operand the CPU's addition keeps, which compilers may swap)."""
    both_nan = np.isnan(got) & np.isnan(want)
    return got.shape == want.shape and bool(((got.view(np.int64) == want.view(np.int64)) | both_nan).all())


def random_groups(rng: np.random.Generator, rows: int) -> np.ndarray:
    """Group starts for ``rows`` rows in random groups (some of one row), the row count last."""
    cuts = np.sort(rng.choice(np.arange(1, rows), size=rng.integers(0, rows), replace=False)) if rows > 1 else np.zeros(0, np.int64)
    return np.concatenate(([0], cuts, [rows])).astype(np.int64)


@pytest.mark.parametrize("size", [1, 2, 3, 10, 64])
def test_the_compiled_means_are_their_twins_bit_for_bit(size):
    rng = np.random.default_rng(size)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e308, -1e308, 5e-324, 1e15, -1e15])
    for _ in range(200):
        rows = int(rng.integers(1, 60))
        values = rng.normal(0, 1e3, rows)
        spoiled = rng.random(rows) < 0.15
        values[spoiled] = rng.choice(specials, spoiled.sum())
        starts = random_groups(rng, rows)
        assert same_bits(window_means(values, starts, size), window_means_twin(values, starts, size)), (values, starts)


def test_a_window_holds_only_its_own_groups_last_values():
    values = np.array([1.0, 2.0, 3.0, 10.0, 20.0, 100.0])
    starts = np.array([0, 3, 5, 6])
    assert window_means(values, starts, 2).tolist() == [1.0, 1.5, 2.5, 10.0, 15.0, 100.0]


def test_a_nan_spoils_the_means_of_the_windows_it_is_in_then_leaves():
    got = window_means(np.array([1.0, np.nan, 3.0, 4.0, 5.0]), np.array([0, 5]), 2)
    assert np.isnan(got[1:3]).all() and got[[0, 3, 4]].tolist() == [1.0, 3.5, 4.5]


def test_no_rows_give_no_means():
    assert window_means(np.zeros(0), np.array([0]), 10).shape == (0,)
