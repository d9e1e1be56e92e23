"""A micro-batch's stream points by group: what the compute side ships, one group a row."""

from __future__ import annotations

from typing import Any

from udf_agent.wire.frames import frame_spans


class GroupedPoints:
    """A micro-batch's points by group: group ``i`` is ``keys[i]``, and its ``counts[i]``
    points, length-prefixed and in arrival order, are ``data[bounds[i]:bounds[i + 1]]``.
    ``arrival[j]`` is when the j-th point so ordered arrived (0: first in the micro-batch)."""

    def __init__(self, keys: list[bytes], data: Any, bounds: Any, counts: Any, arrival: Any):
        self.keys = [key.decode() for key in keys]
        self.data = data
        self.bounds = bounds
        self.counts = counts
        self.arrival = arrival

    def __len__(self) -> int:
        return len(self.keys)

    def points(self, index: int) -> bytes:
        data: bytes = self.data[self.bounds[index] : self.bounds[index + 1]].tobytes()
        return data

    def arrow(self) -> Any:
        """Every group's points as one Arrow binary array, without copying them."""
        import numpy as np
        import pyarrow as pa

        offsets = np.ascontiguousarray(self.bounds, dtype=np.int32)
        return pa.Array.from_buffers(pa.binary(), len(self.keys), [None, pa.py_buffer(offsets), pa.py_buffer(self.data)])


def prefixed_ends(data: bytes) -> Any:
    """Where each length-prefixed item (a frame, or a point as the reader keeps it) of
    ``data`` ends, walked in plain Python; None unless ``data`` is whole items only."""
    import numpy as np

    ends = [end for _, _, end in frame_spans(data)]
    return np.array(ends, np.int64) if (ends[-1] if ends else 0) == len(data) else None


def group_points_by_key(frames: bytes, points: Any, groups: Any) -> GroupedPoints:
    """``scanner.group_points`` in plain Python, point by point."""
    import numpy as np

    chunks: dict[bytes, list[bytes]] = {}
    arrivals: dict[bytes, list[int]] = {}
    for number, ((start, end), (group_start, group_end)) in enumerate(zip(points.tolist(), groups.tolist())):
        key = frames[group_start:group_end] if group_start >= 0 else b""
        chunks.setdefault(key, []).append(frames[start:end])
        arrivals.setdefault(key, []).append(number)
    data = [b"".join(parts) for parts in chunks.values()]
    bounds = np.cumsum([0] + [len(d) for d in data], dtype=np.int64)
    arrival = np.array([n for numbers in arrivals.values() for n in numbers], np.int64)
    counts = np.array([len(p) for p in chunks.values()])
    return GroupedPoints(list(chunks), np.frombuffer(b"".join(data), np.uint8), bounds, counts, arrival)
