"""Micro-batches: incoming points kept as the bytes Kapacitor sent.

Stream points as the scanner's runs (``StreamMicroBatch``, grouped once per micro-batch
into ``grouped.GroupedPoints``), a Kapacitor batch's points in ``GroupRows``; no protobuf
object per point on the reader's path. Where a group is computed, ``columns`` or the
compiled ``pointcodec`` decodes those bytes into one Arrow table.
"""

from __future__ import annotations

from typing import Any

from udf_agent.wire.frames import encode_varint
from udf_agent.wire.grouped import GroupedPoints
from udf_agent.wire.hotpath import REFERENCE, WireKernels


class GroupRows:
    """The points of one group (or one Kapacitor batch), as length-prefixed Point bytes."""

    __slots__ = ("count", "_chunks")

    def __init__(self) -> None:
        self.count = 0
        self._chunks: list[bytes] = []

    def append(self, point: bytes) -> None:
        self._chunks.append(encode_varint(len(point)))
        self._chunks.append(point)
        self.count += 1

    def append_prefixed(self, point: bytes, count: int = 1) -> None:
        """Points that already carry their length varints (as inside Request frames)."""
        self._chunks.append(point)
        self.count += count

    def encoded(self) -> bytes:
        return b"".join(self._chunks)


class StreamMicroBatch:
    """Stream points waiting to be computed, as they arrived: runs of frames, each with
    its points' and groups' offsets (``frames.PointRun``). Grouping waits for ``grouped``,
    once per micro-batch, on the compute thread: the reader only appends."""

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0
        self._runs: list[tuple[bytes, Any, Any]] = []

    def append(self, group: str, point: bytes) -> None:
        """One point from the reference path: a run of one, its group bytes after it."""
        import numpy as np

        framed = encode_varint(len(point)) + point
        key = group.encode()
        self.append_run(framed + key, np.array([[0, len(framed)]]), np.array([[len(framed), len(framed) + len(key)]]))

    def append_run(self, frames: bytes, points: Any, groups: Any) -> None:
        """Points at ``points`` offsets of ``frames``, with their groups at ``groups`` ((-1, -1): none)."""
        self._runs.append((frames, points, groups))
        self.count += len(points)

    def grouped(self, kernels: WireKernels = REFERENCE) -> GroupedPoints:
        """The points by group, groups in order of first arrival (group bytes were
        checked to be UTF-8 when they arrived), grouped by ``kernels``."""
        import numpy as np

        if not self._runs:
            return GroupedPoints([], np.zeros(0, np.uint8), np.zeros(1, np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64))
        if len(self._runs) == 1:
            frames, points, groups = self._runs[0]
        else:
            shifts = np.cumsum([0] + [len(run[0]) for run in self._runs[:-1]])
            frames = b"".join(run[0] for run in self._runs)
            points = np.concatenate([run[1] + shift for run, shift in zip(self._runs, shifts)])
            groups = np.concatenate([np.where(run[2] >= 0, run[2] + shift, -1) for run, shift in zip(self._runs, shifts)])
        return kernels.group_points(frames, points, groups)


class KapacitorBatch:
    """One complete batch as Kapacitor sent it, BeginBatch to EndBatch."""

    __slots__ = ("group", "name", "tags", "by_name", "tmax", "rows")

    def __init__(self, begin: Any):
        self.group: str = begin.group
        self.name: str = begin.name
        self.tags: dict[str, str] = dict(begin.tags)
        self.by_name: bool = begin.byName
        self.tmax: int = 0
        self.rows = GroupRows()

    def close(self, end: Any) -> None:
        # EndBatch defines the batch: its name, tags and tmax win over BeginBatch's.
        self.name = end.name or self.name
        if end.tags:
            self.tags = dict(end.tags)
        self.tmax = end.tmax


class BatchMicroBatch:
    """Complete Kapacitor batches waiting to be computed, in arrival order."""

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0
        self.batches: list[KapacitorBatch] = []

    def add(self, batch: KapacitorBatch) -> None:
        self.batches.append(batch)
        self.count += batch.rows.count


class HandlerMicroBatch:
    """A Kapacitor Handler script's requests, in order, as the frames Kapacitor sent
    (length prefixes included): its handler takes them one by one."""

    __slots__ = ("opened_at", "count", "_chunks", "init_frame")

    def __init__(self, opened_at: float):
        self.opened_at = opened_at
        self.count = 0  # requests
        self._chunks: list[bytes] = []
        self.init_frame: bytes | None = None  # the task's InitRequest, if it is in here

    def append(self, frames: bytes, count: int = 1) -> None:
        self._chunks.append(frames)
        self.count += count

    def frames(self) -> bytes:
        return b"".join(self._chunks)
