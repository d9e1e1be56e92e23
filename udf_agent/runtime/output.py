"""A micro-batch's output frames as the pieces handed to the writer, in the order they leave.

The frames come as each slice's output column (``compute.packed.Blobs``, one item per group):
its bytes are copied out as soon as the slice is computed (the rest of the result, histories
included, is then let go), so no Python object is made per group or per point on the way to
the writer.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np

from udf_agent.runtime.writer import WRITE_CHUNK
from udf_agent.wire.grouped import GroupedPoints
from udf_agent.wire.hotpath import WireKernels


def output_pieces(slices: Sequence[tuple[bytes, np.ndarray]], counts: np.ndarray, grouped: GroupedPoints | None, kernels: WireKernels) -> Iterator[bytes]:
    """Each group's output frames (``slices``: each slice's frames and where each group's end; ``counts``
    frames a group, in group order), in input arrival order across groups when every group gave
    one frame per new point (1:1 UDFs, as a per-point agent would) and ``grouped`` says how the
    input arrived, else group after group. In pieces of whole frames, so keepalive replies get
    in between."""
    if not slices:
        return
    data, ends = slices[0]
    if len(slices) > 1:  # over TASK_SLICE_GROUPS groups: the slices one after another
        starts = np.cumsum([0] + [len(frames) for frames, _ in slices[:-1]])
        data = b"".join(frames for frames, _ in slices)
        ends = np.concatenate([slice_ends + start for (_, slice_ends), start in zip(slices, starts)])
    if not data:
        return
    if grouped is not None and len(grouped) > 1 and np.array_equal(grouped.counts, counts):
        arranged = kernels.arrival_order(data, grouped.arrival)
        if arranged is not None:
            data, ends = arranged
    start, piece = 0, WRITE_CHUNK // 2
    if len(data) <= piece:  # a trickle's output: one piece, no search
        yield data
        return
    while start < len(data):
        index = int(np.searchsorted(ends, start + piece, side="right")) - 1
        stop = int(ends[index]) if index >= 0 and ends[index] > start else int(ends[np.searchsorted(ends, start, side="right")])
        yield data[start:stop]
        start = stop
