"""A micro-batch as the task tables an engine computes, with each group's kept history and state."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from udf_agent.compute.run import TASK_SCHEMA, tasks_from_rows
from udf_agent.runtime.groups import GroupStore
from udf_agent.wire.batches import BatchMicroBatch
from udf_agent.wire.grouped import GroupedPoints

# Groups per task table: a micro-batch touching more (group churn) is computed in slices.
TASK_SLICE_GROUPS = 10_000


def stream_task_slices(grouped: GroupedPoints, store: GroupStore, history_window: dict[str, int] | None) -> Iterator[pa.Table]:
    """A stream micro-batch's task tables, in slices of at most ``TASK_SLICE_GROUPS`` groups, so
    what a slice ships (every group's kept history) and what the workers decode stays bounded
    however many groups a micro-batch touches."""
    meta = json.dumps({"history": history_window})
    data = grouped.arrow()
    for first in range(0, len(grouped), TASK_SLICE_GROUPS):
        last = min(len(grouped), first + TASK_SLICE_GROUPS)
        keys = grouped.keys[first:last]
        kept = [store.get(key) for key in keys]
        columns = {
            "seq": np.arange(first, last),
            "key": keys,
            "meta": [meta] * len(keys),
            "data": data.slice(first, last - first),
            "history": [history for history, _ in kept],
            "state": [state for _, state in kept],
        }
        yield pa.table(columns, schema=TASK_SCHEMA)


def batch_task_runs(batch: BatchMicroBatch, store: GroupStore) -> Iterator[pa.Table]:
    """A batch micro-batch's task tables. A group's next batch needs the state its previous one
    left: a micro-batch holding several batches of a group is computed in runs with one batch per
    group at most, each run's state read (lazily, by the caller's iteration) once the run before
    it is kept."""
    rows: list[tuple[object, ...]] = []
    in_run: set[str] = set()
    for seq, kbatch in enumerate(batch.batches):
        if kbatch.group in in_run:
            yield tasks_from_rows(rows)
            rows, in_run = [], set()
        in_run.add(kbatch.group)
        meta = json.dumps({"name": kbatch.name, "tags": kbatch.tags, "tmax": kbatch.tmax, "by_name": kbatch.by_name})
        _, state = store.get(kbatch.group)
        rows.append((seq, kbatch.group, meta, kbatch.rows.encoded(), None, state))
    yield tasks_from_rows(rows)
