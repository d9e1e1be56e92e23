"""moving_avg's arithmetic, compiled: each row's mean over its window within its group.

Compiled once per machine into numba's cache (as the wire kernels are), at its first call.
Its twin is the numpy loop in ``tests/test_windows.py``, which moving_avg ran before: a few
array calls a lag where this is one call (a moving_avg call on 40 rows at a trickle, window
means and frames included: 112–171 µs before, 47–91 after); the tests hold the two equal bit
for bit. The first call on a machine compiles it (~0.8 s, in that micro-batch); later
processes load it from the cache (~10 ms).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def window_means(values: Any, starts: Any, size: int) -> Any:
    """For each row, the mean of the last ``size`` values of its group up to it (fewer at
    the group's start). Rows come group after group, group ``g`` being rows
    ``starts[g]:starts[g + 1]`` (``Context.group_starts``: the row count last).

    Each window is summed on its own, oldest value first, never as a running sum: a row's mean
    depends on its window only, so it is the same whatever the micro-batch boundaries. A NaN
    in the window makes the mean NaN."""
    means = np.empty(values.shape[0])
    widest = min(size, values.shape[0])
    for group in range(starts.shape[0] - 1):
        first, end = starts[group], starts[group + 1]
        for row in range(first, end):
            place = row - first
            total = 0.0
            # The oldest lag first; a lag before the group's start adds nothing (adding
            # 0.0, as the twin does, leaves any sum begun at 0.0 unchanged).
            for lag in range(widest - 1, 0, -1):
                if place >= lag:
                    total += values[row - lag]
            means[row] = (total + values[row]) / min(place + 1, size)
    return means
