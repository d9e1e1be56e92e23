"""Each group's kept history and UDF state, across micro-batches, snapshots and restores.

History is a group's last points as Kapacitor sent them (length-prefixed point bytes) and
state its ``ctx.state`` as JSON: what the next micro-batch of the group needs, and what a
snapshot carries. The store lives in the agent, so engines and their workers hold nothing
a task needs to keep.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from udf_agent.runtime.snapshot import GroupState, dump_snapshot, dump_snapshot_into, load_snapshot

log = logging.getLogger(__name__)

NOTHING_KEPT: GroupState = (None, None)


class GroupStore:
    """Groups in least-recently-seen order; past ``max_groups`` the oldest are dropped
    (group churn): such a group starts afresh if it comes back."""

    def __init__(self, max_groups: int):
        self.max_groups = max_groups
        self.evicted = 0
        self._groups: dict[str, GroupState] = {}

    def __len__(self) -> int:
        return len(self._groups)

    def get(self, key: str) -> GroupState:
        return self._groups.get(key, NOTHING_KEPT)

    def keep(self, key: str, history: bytes | None, state: str | None) -> None:
        """What ``key`` left after a micro-batch; the group becomes the most recently seen."""
        # Popped and inserted again: the dict's order is least recently seen first.
        self._groups.pop(key, None)
        if history is not None or state is not None:
            self._groups[key] = (history, state)

    def evict(self) -> None:
        excess = len(self._groups) - self.max_groups
        if excess <= 0:
            return
        for key in list(itertools.islice(self._groups, excess)):
            del self._groups[key]
        self.evicted += excess
        log.warning(
            "--max-groups %d reached: dropped the kept history and state of the %d least recently seen group(s) (%d so far)",
            self.max_groups, excess, self.evicted,
        )

    def snapshot(self, udf_name: str, options: dict[str, Any] | None) -> bytes:
        return dump_snapshot(udf_name, self._groups, options)

    def snapshot_into(self, out: bytearray, udf_name: str, options: dict[str, Any] | None) -> None:
        """``snapshot``, appended to ``out``."""
        dump_snapshot_into(out, udf_name, self._groups, options)

    def restore(self, udf_name: str, data: bytes, options: dict[str, Any] | None) -> int:
        """Replaces every group with the snapshot's (SnapshotError if it is refused); how many."""
        self._groups = load_snapshot(udf_name, data, options)
        restored = len(self._groups)
        self.evict()
        return restored
