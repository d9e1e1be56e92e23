"""A micro-batch's output frames as the pieces handed to the writer, in the order they leave."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from udf_agent.runtime.writer import WRITE_CHUNK
from udf_agent.wire.batches import in_arrival_order
from udf_agent.wire.grouped import GroupedPoints
from udf_agent.wire.hotpath import WireKernels


def output_pieces(outputs: list[bytes | None], counts: list[int], grouped: GroupedPoints | None, kernels: WireKernels) -> Iterator[bytes]:
    """Each group's output frames (``outputs``, ``counts`` frames each, in group order), in input
    arrival order across groups when every group gave one frame per new point (1:1 UDFs, as a
    per-point agent would) and ``grouped`` says how the input arrived, else group after group.
    In pieces of whole frames, so keepalive replies get in between."""
    data = b"".join(output for output in outputs if output)
    if not data:
        return
    ends = np.cumsum([len(output) for output in outputs if output])
    if grouped is not None and len(grouped) > 1 and grouped.counts.tolist() == counts:
        arranged = in_arrival_order(data, grouped.arrival, kernels)
        if arranged is not None:
            data, ends = arranged
    start, piece = 0, WRITE_CHUNK // 2
    while start < len(data):
        index = int(np.searchsorted(ends, start + piece, side="right")) - 1
        stop = int(ends[index]) if index >= 0 and ends[index] > start else int(ends[np.searchsorted(ends, start, side="right")])
        yield data[start:stop]
        start = stop
