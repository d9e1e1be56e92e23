"""A micro-batch as the task tables an engine computes, with each group's kept history and
state: one kind per edge the UDF wants, chosen once per task (``task_tables_for``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias

import numpy as np
import pyarrow as pa

from udf_agent.api import UDFSpec
from udf_agent.compute.contract import Job, Task, tasks_table
from udf_agent.compute.packed import Blobs, ResultColumns, StreamTasks
from udf_agent.runtime.groups import GroupStore
from udf_agent.wire.batches import BatchMicroBatch, HandlerMicroBatch, StreamMicroBatch
from udf_agent.wire.grouped import GroupedPoints, prefixed_ends
from udf_agent.wire.hotpath import WireKernels

if TYPE_CHECKING:
    from udf_agent.compute.engine import Engine, Tenant

# Groups per task table: a micro-batch touching more (group churn) is computed in slices.
TASK_SLICE_GROUPS = 10_000

MicroBatch = StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch
# One slice of a micro-batch's tasks: a stream's packed, a Kapacitor batch's a task table.
Tasks: TypeAlias = "StreamTasks | pa.Table"


class TaskTables(Protocol):
    """A micro-batch's task tables (a stream micro-batch's packed, ``compute.packed``), read one
    after another (each may need the state the one before it left), run on the task's engine;
    and what its output's order and failures need to know."""

    @property
    def arrival(self) -> GroupedPoints | None:
        """How the points arrived, when 1:1 output can go back in that order (stream micro-batches)."""
        ...

    def __iter__(self) -> Iterator[Tasks]: ...

    def single_slice(self) -> StreamTasks | None:
        """The micro-batch's tasks when they are one stream slice (an engine may chain it
        behind the micro-batch before it, ``Engine.chain_stream``), else None."""
        ...

    def run(self, engine: Engine, job: Job, tasks: Tasks, tenant: Tenant | None) -> ResultColumns:
        """``tasks`` computed on ``engine``, the results row for row."""
        ...

    def keys(self, tasks: Tasks) -> list[str]:
        """Each task's group."""
        ...

    def points(self, tasks: Tasks, rows: Sequence[int]) -> list[bytes]:
        """The new points of the tasks' ``rows``, as they came (set-aside input: rare)."""
        ...

    def points_in(self, tasks: Tasks, rows: Sequence[int]) -> list[int]:
        """How many points each of the tasks' ``rows`` holds (set-aside input: rare)."""
        ...


class StreamTaskTables:
    """A stream micro-batch: one task per group, in slices of at most ``TASK_SLICE_GROUPS``
    groups, so what a slice ships (every group's kept history) and what the workers decode
    stays bounded however many groups a micro-batch touches. Packed, not Arrow: at a trickle
    a micro-batch is a few groups, and an Arrow table's making and reading costs more than
    the points' own work (``compute.packed``)."""

    def __init__(self, batch: MicroBatch, store: GroupStore, kernels: WireKernels):
        assert isinstance(batch, StreamMicroBatch)  # a stream task's intake makes no other
        self.arrival = batch.grouped(kernels)
        self._store = store

    def __iter__(self) -> Iterator[StreamTasks]:
        grouped = self.arrival
        bounds = grouped.bounds
        data = Blobs(grouped.data, bounds[1:] - bounds[:-1])  # np.diff costs three times as much on a trickle's few
        for first in range(0, len(grouped), TASK_SLICE_GROUPS):
            count = min(len(grouped), first + TASK_SLICE_GROUPS) - first
            keys = grouped.keys[first : first + count]
            kept = [self._store.get(key) for key in keys]
            histories = Blobs.of([history for history, _ in kept])
            states = Blobs.of_texts([state for _, state in kept])
            yield StreamTasks(np.arange(first, first + count), keys, data.slice(first, count), histories, states)

    def single_slice(self) -> StreamTasks | None:
        return next(iter(self)) if 0 < len(self.arrival) <= TASK_SLICE_GROUPS else None

    def run(self, engine: Engine, job: Job, tasks: Tasks, tenant: Tenant | None) -> ResultColumns:
        assert isinstance(tasks, StreamTasks)
        return engine.run_stream(job, tasks, tenant)

    def keys(self, tasks: Tasks) -> list[str]:
        assert isinstance(tasks, StreamTasks)
        return tasks.keys

    def points(self, tasks: Tasks, rows: Sequence[int]) -> list[bytes]:
        assert isinstance(tasks, StreamTasks)
        data = tasks.data.tolist()
        return [data[row] or b"" for row in rows]

    def points_in(self, tasks: Tasks, rows: Sequence[int]) -> list[int]:
        assert isinstance(tasks, StreamTasks)
        return [int(self.arrival.counts[tasks.seq[row]]) for row in rows]


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

    def single_slice(self) -> None:
        return None

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

    def run(self, engine: Engine, job: Job, tasks: Tasks, tenant: Tenant | None) -> ResultColumns:
        assert isinstance(tasks, pa.Table)
        return ResultColumns.of_table(engine.run(job, tasks, tenant))

    def keys(self, tasks: Tasks) -> list[str]:
        assert isinstance(tasks, pa.Table)
        keys: list[str] = tasks.column("key").to_pylist()
        return keys

    def points(self, tasks: Tasks, rows: Sequence[int]) -> list[bytes]:
        assert isinstance(tasks, pa.Table)
        data = tasks.column("data")
        return [data[row].as_py() for row in rows]

    def points_in(self, tasks: Tasks, rows: Sequence[int]) -> list[int]:
        ends = [prefixed_ends(data) for data in self.points(tasks, rows)]
        return [0 if row_ends is None else len(row_ends) for row_ends in ends]


def task_tables_for(spec: UDFSpec) -> Callable[[MicroBatch, GroupStore, WireKernels], TaskTables]:
    """How ``spec``'s micro-batches become task tables: by the edge its UDF wants."""
    return BatchTaskTables if spec.wants == "batch" else StreamTaskTables
