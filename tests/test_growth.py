"""The growth policy of a cluster engine's resident slots, on a fake clock (spark_backend/growth.py)."""

from __future__ import annotations

from spark_backend.growth import CAPPED_PAUSE, PATIENCE, SHRINK_WINDOWS, WINDOW, CoreGrowth


def run(growth: CoreGrowth, start: float, seconds: float, connected: int, busy: float) -> tuple[float, list[int]]:
    """Ticks every second for ``seconds``, ``busy`` workers computing all along (a fraction:
    busy that share of each second, one worker at a time beyond the whole ones); the
    wanted counts seen, and the time at the end."""
    seen = []
    now = start
    whole, part = int(busy), busy - int(busy)
    for _ in range(int(seconds)):
        growth.busy_workers(now, whole + (1 if part else 0))
        if part:
            growth.busy_workers(now + part, whole)
        now += 1.0
        seen.append(growth.tick(now, connected))
    return now, seen


def asking_for_a_second_slot(cap: int | None = None) -> tuple[CoreGrowth, float]:
    """A policy whose one worker was busy a whole window: it wants a second slot now."""
    growth = CoreGrowth(cap=cap, now=0.0)
    now, _ = run(growth, 0.0, WINDOW + 1, connected=1, busy=1.0)
    assert growth.wanted == 2
    return growth, now


def test_it_starts_with_one_slot_and_grows_by_one_when_the_workers_are_busy_a_whole_window():
    growth = CoreGrowth(cap=None, now=0.0)
    assert growth.wanted == 1
    now, seen = run(growth, 0.0, WINDOW - 1, connected=1, busy=1.0)
    assert seen[-1] == 1  # a window is not over yet
    now, seen = run(growth, now, 2, connected=1, busy=1.0)
    assert seen[-1] == 2 and growth.reason.startswith("growing")
    # Until the new slot's worker connects, no more: the growth has not landed.
    now, seen = run(growth, now, 3 * WINDOW, connected=1, busy=1.0)
    assert set(seen) == {2}
    now, seen = run(growth, now, WINDOW + 1, connected=2, busy=2.0)
    assert seen[-1] == 3


def test_workers_that_are_not_busy_enough_never_grow():
    growth = CoreGrowth(cap=None, now=0.0)
    _, seen = run(growth, 0.0, 10 * WINDOW, connected=1, busy=0.7)
    assert set(seen) == {1}
    assert growth.reason.startswith("steady")


def test_it_stops_at_the_cap_and_says_so():
    growth, now = asking_for_a_second_slot(cap=2)
    now, seen = run(growth, now, 4 * WINDOW, connected=2, busy=2.0)
    assert set(seen) == {2}
    assert growth.reason.startswith("capped: --max-cores 2")


def test_a_slot_spark_never_grants_is_given_up_and_not_asked_again_for_a_while():
    growth, now = asking_for_a_second_slot()
    now, seen = run(growth, now, PATIENCE + 1, connected=1, busy=1.0)
    assert seen[-1] == 1 and growth.reason.startswith("capped: Spark granted no core")
    now, seen = run(growth, now, CAPPED_PAUSE - WINDOW, connected=1, busy=1.0)
    assert set(seen) == {1} and growth.reason.startswith("capped")
    now, seen = run(growth, now, 2 * WINDOW, connected=1, busy=1.0)
    assert seen[-1] == 2


def test_a_slot_still_waiting_for_its_core_is_given_up_when_the_load_falls():
    growth, now = asking_for_a_second_slot()
    now, seen = run(growth, now, WINDOW + 1, connected=1, busy=0.2)
    assert seen[-1] == 1 and growth.reason.startswith("steady: the load fell")
    assert now < PATIENCE


def test_it_shrinks_one_slot_at_a_time_once_the_work_fits_in_fewer_and_not_before():
    growth, now = asking_for_a_second_slot()
    now, _ = run(growth, now, WINDOW + 1, connected=2, busy=2.0)
    now, _ = run(growth, now, 2, connected=3, busy=3.0)
    assert growth.wanted == 3
    # 1.5 cores of work would keep 2 slots 75 % busy, over SHRINK_BUSY: the 3 are kept, so
    # that a slot given back is not wanted again at once.
    now, seen = run(growth, now, 4 * WINDOW, connected=3, busy=1.5)
    assert set(seen) == {3}
    # 1 core of work fits in 2 (<= 1.2): one given back after SHRINK_WINDOWS windows.
    now, seen = run(growth, now, SHRINK_WINDOWS * WINDOW + 1, connected=3, busy=1.0)
    assert seen[-1] == 2 and growth.reason.startswith("shrinking")
    # Idle: down to one, never below.
    now, seen = run(growth, now, 10 * SHRINK_WINDOWS * WINDOW, connected=2, busy=0.0)
    assert seen[-1] == 1 and min(seen) == 1


def test_the_busy_share_is_measured_on_the_workers_connected_now():
    growth, now = asking_for_a_second_slot()
    # The second worker joins: a window begins; one busy worker of two is 50 %, not 100 %.
    now, seen = run(growth, now, 3 * WINDOW, connected=2, busy=1.0)
    assert set(seen) == {2}
    assert growth.holding(2, None).busy_share == 0.5


def test_after_an_idle_release_it_starts_again_from_one():
    growth, now = asking_for_a_second_slot()
    now, _ = run(growth, now, 2, connected=2, busy=2.0)
    growth.released(now)
    assert growth.wanted == 1 and growth.reason.startswith("released")
    _, seen = run(growth, now, 3, connected=0, busy=0.0)
    assert set(seen) == {1}


def test_status_shows_the_slots_the_cores_spark_holds_and_why():
    from udf_agent.serve.status import table

    server = {"kind": "shared server", "pid": 7, "socket": "/run/udf.sock", "uptime_s": 60, "spark": "ready", "resident_workers": 1, "tasks": []}
    growing = {**server, "resident_slots": 2, "spark_cores": 1, "resident_slots_why": "growing: its 1 worker(s) busy 97% of 5 s"}
    assert "Spark ready, 1 resident worker(s) of 2 slot(s), 1 core(s) of executors (growing: its 1 worker(s) busy 97% of 5 s): 0 task(s)" in table([growing])
    fixed = {**server, "resident_slots": 1, "resident_slots_why": "fixed: --resident-slots, spark.cores.max or the master's cores"}
    assert "1 resident worker(s) of 1 slot(s) (fixed: " in table([fixed])
