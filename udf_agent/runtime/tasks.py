"""A micro-batch as the task tables an engine computes, with each group's kept history and state."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from udf_agent.compute.contract import TASK_SCHEMA, Task, tasks_table
from udf_agent.runtime.groups import GroupStore
from udf_agent.wire.batches import BatchMicroBatch
from udf_agent.wire.grouped import GroupedPoints

# A stream group's task has no Kapacitor batch.
_BATCH_COLUMNS = [name for name in TASK_SCHEMA.names if name.startswith("batch_")]
# Groups per task table: a micro-batch touching more (group churn) is computed in slices.
TASK_SLICE_GROUPS = 10_000


def stream_task_slices(grouped: GroupedPoints, store: GroupStore) -> Iterator[pa.Table]:
    """A stream micro-batch's task tables, in slices of at most ``TASK_SLICE_GROUPS`` groups, so
    what a slice ships (every group's kept history) and what the workers decode stays bounded
    however many groups a micro-batch touches."""
    data = grouped.arrow()
    for first in range(0, len(grouped), TASK_SLICE_GROUPS):
        last = min(len(grouped), first + TASK_SLICE_GROUPS)
        keys = grouped.keys[first:last]
        kept = [store.get(key) for key in keys]
        columns = {
            "seq": np.arange(first, last),
            "key": keys,
            "data": data.slice(first, last - first),
            "history": [history for history, _ in kept],
            "state": [state for _, state in kept],
        }
        columns.update({name: pa.nulls(len(keys), TASK_SCHEMA.field(name).type) for name in _BATCH_COLUMNS})
        yield pa.table(columns, schema=TASK_SCHEMA)


def batch_task_runs(batch: BatchMicroBatch, store: GroupStore) -> Iterator[pa.Table]:
    """A batch micro-batch's task tables. A group's next batch needs the state its previous one
    left: a micro-batch holding several batches of a group is computed in runs with one batch per
    group at most, each run's state read (lazily, by the caller's iteration) once the run before
    it is kept."""
    rows: list[Task] = []
    in_run: set[str] = set()
    for seq, kbatch in enumerate(batch.batches):
        if kbatch.group in in_run:
            yield tasks_table(rows)
            rows, in_run = [], set()
        in_run.add(kbatch.group)
        _, state = store.get(kbatch.group)
        rows.append(
            Task(
                seq, kbatch.group, kbatch.rows.encoded(), None, state,
                batch_name=kbatch.name, batch_tag_keys=list(kbatch.tags), batch_tag_values=list(kbatch.tags.values()),
                batch_tmax=kbatch.tmax, batch_by_name=kbatch.by_name,
            )
        )
    yield tasks_table(rows)
