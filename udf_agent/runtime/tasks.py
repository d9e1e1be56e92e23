"""A micro-batch as the task tables an engine computes, with each group's kept history and
state: one kind per edge the UDF wants, chosen once per task (``task_tables_for``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

import numpy as np
import pyarrow as pa

from udf_agent.api import UDFSpec
from udf_agent.compute.contract import TASK_SCHEMA, Task, tasks_table
from udf_agent.runtime.groups import GroupStore
from udf_agent.wire.batches import BatchMicroBatch, HandlerMicroBatch, StreamMicroBatch
from udf_agent.wire.grouped import GroupedPoints, prefixed_ends
from udf_agent.wire.hotpath import WireKernels

# A stream group's task has no Kapacitor batch: these columns come last, and are null.
_BATCH_COLUMNS = [name for name in TASK_SCHEMA.names if name.startswith("batch_")]
assert TASK_SCHEMA.names[-len(_BATCH_COLUMNS) :] == _BATCH_COLUMNS
# Groups per task table: a micro-batch touching more (group churn) is computed in slices.
TASK_SLICE_GROUPS = 10_000

MicroBatch = StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch


class TaskTables(Protocol):
    """A micro-batch's task tables, read one after another (each may need the state the one
    before it left), and what its output's order and failures need to know."""

    @property
    def arrival(self) -> GroupedPoints | None:
        """How the points arrived, when 1:1 output can go back in that order (stream micro-batches)."""
        ...

    def __iter__(self) -> Iterator[pa.Table]: ...

    def points_in(self, tasks: pa.Table, rows: Sequence[int]) -> list[int]:
        """How many points each of the task table's ``rows`` holds (set-aside input: rare)."""
        ...


class StreamTaskTables:
    """A stream micro-batch: one task per group, in slices of at most ``TASK_SLICE_GROUPS``
    groups, so what a slice ships (every group's kept history) and what the workers decode
    stays bounded however many groups a micro-batch touches."""

    def __init__(self, batch: MicroBatch, store: GroupStore, kernels: WireKernels):
        assert isinstance(batch, StreamMicroBatch)  # a stream task's intake makes no other
        self.arrival = batch.grouped(kernels)
        self._store = store

    def __iter__(self) -> Iterator[pa.Table]:
        grouped = self.arrival
        data = grouped.arrow()
        for first in range(0, len(grouped), TASK_SLICE_GROUPS):
            last = min(len(grouped), first + TASK_SLICE_GROUPS)
            keys = grouped.keys[first:last]
            kept = [self._store.get(key) for key in keys]
            columns = [
                pa.array(np.arange(first, last)),
                pa.array(keys, pa.string()),
                data.slice(first, last - first),
                pa.array([history for history, _ in kept], pa.binary()),
                pa.array([state for _, state in kept], pa.string()),
                *(_few_no_batches(len(keys)) if len(keys) <= FEW_GROUPS else _no_batches(len(keys))),
            ]
            yield pa.Table.from_arrays(columns, schema=TASK_SCHEMA)

    def points_in(self, tasks: pa.Table, rows: Sequence[int]) -> list[int]:
        first = tasks.column("seq")[0].as_py()  # a slice's groups' counts are known
        return [int(self.arrival.counts[first + row]) for row in rows]


class BatchTaskTables:
    """A batch micro-batch: one task per Kapacitor batch. A group's next batch needs the state
    its previous one left: a micro-batch holding several batches of a group is computed in runs
    with one batch per group at most, each run's state read (lazily, by the caller's iteration)
    once the run before it is kept."""

    arrival = None  # output goes group after group

    def __init__(self, batch: MicroBatch, store: GroupStore, kernels: WireKernels):
        assert isinstance(batch, BatchMicroBatch)  # a batch task's intake makes no other
        self._batch = batch
        self._store = store

    def __iter__(self) -> Iterator[pa.Table]:
        rows: list[Task] = []
        in_run: set[str] = set()
        for seq, kbatch in enumerate(self._batch.batches):
            if kbatch.group in in_run:
                yield tasks_table(rows)
                rows, in_run = [], set()
            in_run.add(kbatch.group)
            _, state = self._store.get(kbatch.group)
            rows.append(
                Task(
                    seq, kbatch.group, kbatch.rows.encoded(), None, state,
                    batch_name=kbatch.name, batch_tag_keys=list(kbatch.tags), batch_tag_values=list(kbatch.tags.values()),
                    batch_tmax=kbatch.tmax, batch_by_name=kbatch.by_name,
                )
            )
        yield tasks_table(rows)

    def points_in(self, tasks: pa.Table, rows: Sequence[int]) -> list[int]:
        data = tasks.column("data")
        ends = [prefixed_ends(data[row].as_py()) for row in rows]
        return [0 if row_ends is None else len(row_ends) for row_ends in ends]


def _no_batches(groups: int) -> tuple[pa.Array, ...]:
    """The null batch columns of a stream task table of ``groups`` rows."""
    return tuple(pa.nulls(groups, TASK_SCHEMA.field(name).type) for name in _BATCH_COLUMNS)


# Micro-batches of a few groups recur at a trickle, where making these columns is a visible
# share of the work: they are made once per size (Arrow arrays are immutable), small ones only.
FEW_GROUPS = 64
_few_no_batches = functools.lru_cache(maxsize=FEW_GROUPS)(_no_batches)


def task_tables_for(spec: UDFSpec) -> Callable[[MicroBatch, GroupStore, WireKernels], TaskTables]:
    """How ``spec``'s micro-batches become task tables: by the edge its UDF wants."""
    return BatchTaskTables if spec.wants == "batch" else StreamTaskTables
