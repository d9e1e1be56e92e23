"""Start-up objects kept out of full garbage collections (``udf_agent.collector``)."""

from __future__ import annotations

import gc

from udf_agent.collector import freeze_startup_objects


def test_each_moment_freezes_what_is_alive_once_per_process():
    try:
        freeze_startup_objects("test: start-up built")
        frozen = gc.get_freeze_count()
        assert frozen > 0
        later = [[] for _ in range(1_000)]  # a task's objects, made after start-up
        freeze_startup_objects("test: start-up built")
        assert gc.get_freeze_count() == frozen, "a moment reached again froze later objects"
        freeze_startup_objects("test: another moment")
        assert gc.get_freeze_count() >= frozen + len(later)
    finally:
        gc.unfreeze()  # the rest of the suite collects as usual
