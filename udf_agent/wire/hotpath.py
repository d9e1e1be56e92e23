"""Where the runtime chooses between the compiled kernels and their plain-Python twins.

The compiled frame scanner and point codec (numba, compiled once per machine into its cache)
load off the Info path. Until the scanner has loaded, or where it cannot, the reference
``frames.FrameSplitter`` cuts frames and ``WireKernels`` groups points and reorders output,
slower; once it has, ``kernels()`` is their compiled twin, chosen here and nowhere else. The point codec has no such twin in production
(``columns`` is the tests' reference): a UDF that computes needs it, and ``doctor`` checks it
loads. Nothing heavy is imported here: loading is what the ``load_*`` functions do.
"""

from __future__ import annotations

from typing import Any

from udf_agent.wire.frames import FrameSplitter, count_frames
from udf_agent.wire.grouped import GroupedPoints, group_points_by_key, prefixed_ends

# Up to this many points, the plain-Python twin groups them faster than the compiled kernel
# sets up its arrays (4 points: 11 us against 51 us; even at about 32): a micro-batch at a
# trickle, one point a read, is this small.
FEW_POINTS = 16


class WireKernels:
    """What a micro-batch's points and output need cut and moved, in plain Python and numpy:
    the reference twins of the compiled kernels."""

    def group_points(self, frames: bytes, points: Any, groups: Any) -> GroupedPoints:
        """The points at ``points`` offsets of ``frames`` by their group bytes (``groups``)."""
        return group_points_by_key(frames, points, groups)

    def arrival_order(self, output: bytes, arrival: Any) -> tuple[bytes, Any] | None:
        """Output frames, one per point in grouped order (``GroupedPoints.arrival``: the
        j-th frame answers the point that arrived ``arrival[j]``-th), put back in the order the
        points arrived, with where each frame then ends; None unless ``output`` holds exactly
        one whole frame per point."""
        import numpy as np

        ends = prefixed_ends(output)
        if ends is None or len(ends) != len(arrival):
            return None
        frames = [output[start:end] for start, end in zip([0, *ends[:-1].tolist()], ends.tolist())]
        placed = [b""] * len(frames)
        for frame, place in zip(frames, arrival.tolist()):
            placed[place] = frame
        return b"".join(placed), np.cumsum([len(frame) for frame in placed], dtype=np.int64)

    def count_frames(self, data: bytes, uncounted_key: int) -> int:
        """The frames of ``data`` (whole frames only) but those whose body starts with ``uncounted_key``."""
        return count_frames(data, uncounted_key)


class CompiledWireKernels(WireKernels):
    """The compiled kernels (``scanner``, ``kernels``), each the twin of the method it overrides;
    made once the scanner has loaded."""

    def __init__(self) -> None:
        from udf_agent.wire import scanner

        self._group_points = scanner.group_points
        self._arrival_order = scanner.arrival_order
        self._count_frames = scanner.count_frames

    def group_points(self, frames: bytes, points: Any, groups: Any) -> GroupedPoints:
        if len(points) <= FEW_POINTS:
            return super().group_points(frames, points, groups)
        grouped: GroupedPoints = self._group_points(frames, points, groups)
        return grouped

    def arrival_order(self, output: bytes, arrival: Any) -> tuple[bytes, Any] | None:
        return self._arrival_order(output, arrival)

    def count_frames(self, data: bytes, uncounted_key: int) -> int:
        return self._count_frames(data, uncounted_key)


REFERENCE = WireKernels()
_kernels = REFERENCE


def kernels() -> WireKernels:
    """The compiled kernels once the scanner has loaded, else their reference twins."""
    return _kernels


def load_scanner() -> None:
    """Loads the compiled frame scanner and its kernels; raises what loading raised."""
    global _kernels
    from udf_agent.wire import scanner

    scanner.warm_up()
    _kernels = CompiledWireKernels()


def load_point_codec() -> None:
    """Loads the compiled point decoder and encoder (UDFs whose points are computed)."""
    from udf_agent.wire import pointcodec

    pointcodec.warm_up()


def compiled_splitter(splitter: FrameSplitter) -> FrameSplitter:
    """The compiled scanner, taking over mid-stream from ``splitter`` (``load_scanner`` first)."""
    from udf_agent.wire.scanner import FastFrameSplitter

    return FastFrameSplitter.continuing(splitter)


def handler_run_splitter(splitter: FrameSplitter) -> FrameSplitter:
    """For a Kapacitor Handler script's session: the compiled scanner of the runs of requests
    its handler takes as they came, taking over mid-stream from ``splitter`` (``load_scanner``
    first)."""
    from udf_agent.wire.scanner import RequestRunSplitter

    return RequestRunSplitter.continuing(splitter)
