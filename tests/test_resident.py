"""Spark's resident workers (spark_backend.resident): results, and lost or stuck workers."""

from __future__ import annotations

import functools
import os
import signal
import socket
import threading
import time

import pytest
from test_compute import decode, rich_points, stream_tasks
from udfs import sample

from spark_backend.resident import ResidentWorkers, _ChainPace, _slice_end, _split
from spark_backend.resident_protocol import (
    KEPT_JOBS,
    JobCache,
    Link,
    WorkerAddress,
    clock_id,
    describe_failure,
    read_stream_result,
    stream_result,
)
from spark_backend.resident_slots import START_TIMEOUT, WorkerLost, WorkerOverMemory
from spark_backend.spark_jobs import run_until_resident
from udf_agent.compute.contract import Job
from udf_agent.compute.engine import LocalEngine
from udf_agent.compute.packed import StreamTasks
from udf_agent.errors import first_line
from udf_agent.library.builtins import moving_avg

pytestmark = pytest.mark.spark

# A worker never gets as far as a certificate where these addresses lead.
NO_CERTIFICATE = "0" * 64


def test_a_task_or_result_table_travels_as_one_message_whatever_its_chunks():
    import pyarrow as pa

    from udf_agent.compute.contract import RESULT_SCHEMA, TASK_SCHEMA
    from udf_agent.wire.columns import message_table, table_message

    tasks = stream_tasks(rich_points(12))
    cases = {
        "one chunk": tasks,
        "two chunks": pa.concat_tables([tasks.slice(0, 5), tasks.slice(5)]),
        "a slice (offsets into shared buffers)": tasks.slice(3, 4),
        "no rows": tasks.slice(0, 0),
    }
    for name, table in cases.items():
        assert message_table(table_message(table), TASK_SCHEMA).equals(table.combine_chunks()), name
    results = LocalEngine().run(Job(moving_avg, {"field": "value", "size": 3}), tasks)
    assert message_table(table_message(results), RESULT_SCHEMA).equals(results.combine_chunks())


def _after(seconds: float, action) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), action()), daemon=True)
    thread.start()
    return thread


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def test_a_micro_batch_split_across_workers_equals_the_local_result(spark_engine):
    # Enough bytes that the micro-batch is split between both workers.
    points = rich_points(40_000)
    job = Job(moving_avg, {"field": "i", "size": 5, "as": "avg"})
    assert job.history_window == {"rows": 4}
    tasks = stream_tasks(points)
    assert len(_split(tasks, 2)) == 2
    on_spark = spark_engine.run(job, tasks).to_pandas()
    local = LocalEngine().run(job, tasks).to_pandas()
    assert on_spark["error"].isna().all(), on_spark["error"].dropna().tolist()
    assert list(on_spark["key"]) == list(local["key"])
    assert [decode(o) for o in on_spark["output"]] == [decode(o) for o in local["output"]]
    assert list(on_spark["history"]) == list(local["history"])


def test_a_cpu_bound_micro_batch_is_spread_over_every_worker_its_task_may_hold(spark_engine, monkeypatch):
    # A few KiB of points, far under SPLIT_BYTES: what makes it worth spreading is its compute.
    resident = spark_engine.resident
    monkeypatch.setattr(resident._grants._fair, "active_window", 0.0)  # no earlier test's task is active
    assert resident.wait_for_workers(2, timeout=120)
    tenant = _Tenant()
    job = Job(sample.busy_pid, {"seconds": 0.02})
    tasks = stream_tasks(rich_points(40))  # 4 groups: 80 ms of CPU on one worker

    def pids(results):
        assert results["error"].isna().all(), results["error"].dropna().tolist()
        return {r.point.fieldsDouble["pid"] for output in results["output"] for r in decode(output)}

    first = spark_engine.run(job, tasks, tenant).to_pandas()
    assert len(pids(first)) == 1  # nothing measured yet: one part
    second = spark_engine.run(job, tasks, tenant).to_pandas()
    assert pids(second) == {float(pid) for pid in resident.worker_pids()}  # a part on each worker
    assert list(second["key"]) == list(first["key"])  # results in task order, as one part gives them
    assert resident.held_by(tenant) == 0


def test_a_resident_workers_full_collections_walk_only_what_came_after_its_start(spark_engine):
    # Else a full collection walks pandas, pyarrow, numba and PySpark: ~70 ms in place, a
    # stall of every point waiting on the worker, every few thousand micro-batches.
    job = Job(sample.collector_sight, {})
    for _ in range(2):  # the first micro-batch's imports are put out of sight after it
        results = spark_engine.run(job, stream_tasks(rich_points(3))).to_pandas()
    assert results["error"].isna().all(), results["error"].dropna().tolist()
    (point, *_) = [response.point for output in results["output"] for response in decode(output)]
    assert point.fieldsDouble["frozen"] > 5 * point.fieldsDouble["tracked"], point.fieldsDouble


def test_a_killed_worker_is_replaced_and_the_micro_batch_computed_once(spark_engine):
    resident = spark_engine.resident
    launches, victims = resident.launches, resident.worker_pids()
    points = rich_points(200)
    _after(0.5, lambda: _signal_all(victims[:1], signal.SIGKILL))
    # Four groups: four calls of 0.4 s.
    results = spark_engine.run(Job(sample.sleepy, {"seconds": 0.4}), stream_tasks(points)).to_pandas()
    assert results["error"].isna().all()
    echoed = sorted(r.point.time for output in results["output"] for r in decode(output))
    assert echoed == sorted(p.time for p in points)  # every point, exactly once
    assert resident.launches == launches + 1
    # Only the killed worker's slot was launched again: its neighbour never noticed.
    assert victims[0] not in resident.worker_pids() and victims[1] in resident.worker_pids()


def test_a_stuck_worker_is_abandoned_at_the_batch_timeout_and_the_batch_retried(spark_engine):
    resident = spark_engine.resident
    deadline = time.monotonic() + 60  # both slots' workers up (an earlier test's may still be starting): both stopped
    while len(resident.worker_pids()) < 2:
        assert time.monotonic() < deadline, "the resident workers did not connect"
        time.sleep(0.1)
    launches, stuck = resident.launches, resident.worker_pids()
    resident.batch_timeout = 3.0
    try:
        _after(0.3, lambda: _signal_all(stuck, signal.SIGSTOP))
        started = time.monotonic()
        # Four groups: four calls of 0.25 s.
        results = spark_engine.run(Job(sample.sleepy, {"seconds": 0.25}), stream_tasks(rich_points(50))).to_pandas()
        elapsed = time.monotonic() - started
    finally:
        resident.batch_timeout = 60.0
        _signal_all(stuck, signal.SIGKILL)
    assert results["error"].isna().all()
    # One part, or two on both workers (the fair shares cut a slow micro-batch into parts
    # while other tasks are active): each stuck worker that had one was replaced.
    assert 1 <= resident.launches - launches <= 2
    assert 3.0 <= elapsed < 30, elapsed
    # A stopped worker without a part, killed above while idle, has its slot launched again
    # too: each slot once in all.
    deadline = time.monotonic() + 60
    while set(stuck) & set(resident.worker_pids()) or len(resident.worker_pids()) < 2:
        assert time.monotonic() < deadline, "the killed idle worker's slot was not launched again"
        time.sleep(0.1)
    assert resident.launches == launches + 2


def test_a_micro_batch_that_fails_twice_names_the_udf_the_groups_and_the_cause(spark_engine, monkeypatch):
    resident = spark_engine.resident
    # One part: no earlier test's tenant counts as active, so the fair shares cut nothing, and a
    # task of its own has no measure yet that would spread its micro-batch over both workers.
    monkeypatch.setattr(resident._grants._fair, "active_window", 0.0)
    launches = resident.launches
    tasks = stream_tasks(rich_points(40))
    with pytest.raises(WorkerLost) as failure:
        spark_engine.run(Job(sample.dies_outside, {"spare_pid": os.getpid()}), tasks, _Tenant()).to_pandas()
    message = str(failure.value)
    assert "UDF 'dies_outside'" in message and f"{len(tasks)} group(s)" in message and "failed twice" in message
    assert "was lost" in message or "closed its connection" in message
    # Fresh workers are up for the next micro-batch.
    assert resident.launches == launches + 2
    assert spark_engine.run(Job(sample.passthrough, {}), tasks).to_pandas()["error"].isna().all()


def test_a_job_let_go_by_the_workers_is_sent_again_after_many_others(spark_engine):
    # More distinct jobs than a worker keeps (KEPT_JOBS) between two micro-batches of the
    # first job: the agent's view of each worker's jobs follows the worker's own cache.
    first = Job(moving_avg, {"field": "i", "size": 2, "as": "first"})
    tasks = stream_tasks(rich_points(8))
    expected = LocalEngine().run(first, tasks).to_pandas()
    assert spark_engine.run(first, tasks).to_pandas()["error"].isna().all()
    for n in range(KEPT_JOBS + 6):
        other = Job(moving_avg, {"field": "i", "size": 2, "as": f"other{n}"})
        assert spark_engine.run(other, tasks).to_pandas()["error"].isna().all()
    again = spark_engine.run(first, tasks).to_pandas()
    assert again["error"].isna().all(), again["error"].dropna().tolist()
    assert [decode(o) for o in again["output"]] == [decode(o) for o in expected["output"]]
    with spark_engine.resident._cond:
        workers = list(spark_engine.resident._slots.workers())
    assert workers and all(len(worker.jobs) <= KEPT_JOBS for worker in workers)
    assert all(worker.link.sock.family == socket.AF_UNIX for worker in workers)  # on the agent's host: its unix socket


def test_a_worker_failure_outside_the_udf_says_what_failed_and_where(spark_engine):
    import dataclasses

    from udf_agent.compute.packed import Blobs, StreamTasks

    resident = spark_engine.resident
    tasks = StreamTasks.of_table(stream_tasks(rich_points(8)))
    # Lengths of points that were never sent: the worker cannot read the message.
    broken = dataclasses.replace(tasks, data=Blobs(b"", tasks.data.lengths))
    with pytest.raises(RuntimeError) as failure:
        resident.run(Job(moving_avg, {"field": "i", "size": 2, "as": "avg"}), broken)
    headline = first_line(failure.value)
    assert "failed outside the UDF: ValueError" in headline and "lengths run past its bytes" in headline, headline
    assert " in " in headline and ".py:" in headline, headline  # where it was raised
    assert "Traceback (most recent call last)" in str(failure.value)  # the whole of it follows
    # The workers are fine: the next micro-batch computes.
    assert spark_engine.run(Job(sample.passthrough, {}), stream_tasks(rich_points(8))).to_pandas()["error"].isna().all()


def test_describe_failure_puts_the_exception_and_its_last_frames_on_the_first_line():
    def inner() -> None:
        raise ValueError("bad\nsecond line")

    try:
        inner()
    except ValueError as exc:
        text = describe_failure(exc)
    headline, rest = text.split("\n", 1)
    assert headline.startswith("ValueError: bad second line in inner (test_resident.py:")
    assert "<- test_describe_failure" in headline
    assert rest.startswith("Traceback (most recent call last)")


def test_job_cache_forgets_the_least_recently_used():
    cache: JobCache[int] = JobCache(capacity=2)
    cache.add(b"a", 1)
    cache.add(b"b", 2)
    assert cache.use(b"a") == 1  # a is now the most recently used
    cache.add(b"c", 3)
    assert b"a" in cache and b"c" in cache and b"b" not in cache
    with pytest.raises(KeyError):
        cache.use(b"b")


def test_idle_workers_end_give_their_core_back_and_the_next_micro_batch_relaunches_them(spark_engine):
    # On the session's third core (the shared engine's workers hold the other two).
    session = spark_engine.session
    job = Job(moving_avg, {"field": "i", "size": 2, "as": "avg"})
    tasks = stream_tasks(rich_points(8))
    expected = [decode(o) for o in LocalEngine().run(job, tasks).to_pandas()["output"]]
    resident = ResidentWorkers(session, 1, session.agent_host(), batch_timeout=60, idle_release=2.0, first_worker_wait=START_TIMEOUT)
    resident.start()
    try:
        assert [decode(o) for o in resident.run(job, tasks).to_pandas()["output"]] == expected
        assert resident.launches == 1
        deadline = time.monotonic() + 30
        while not resident.released:
            assert time.monotonic() < deadline, "idle workers were not released"
            time.sleep(0.2)
        assert resident.worker_pids() == [] and not resident.connected()
        # The released core is Spark's again: a job needing all three cores runs.
        frame = session.dataframes.createDataFrame([(n,) for n in range(3)], "n long").repartition(3)
        assert frame.rdd.mapPartitions(lambda rows: [sum(1 for _ in rows)]).collect() == [1, 1, 1]
        launches = resident.launches
        assert [decode(o) for o in resident.run(job, tasks).to_pandas()["output"]] == expected
        assert resident.launches == launches + 1  # relaunched for it, and computed the same
        # The relaunched workers are released in turn, once idle for as long.
        last_used = time.monotonic()
        while not resident.released:
            assert time.monotonic() < last_used + 30, "relaunched idle workers were not released"
            time.sleep(0.1)
        assert time.monotonic() - last_used < 2.0 + 1.5
    finally:
        resident.stop()


def test_a_worker_whose_agent_no_longer_listens_ends_quietly(tmp_path):
    """A resident task that gets its core after the agent let its workers go (stopped,
    released, relaunched) finds the listener closed: it ends, serving nothing, no traceback."""

    import pandas as pd

    from spark_backend.resident_worker import serve_slot

    with socket.create_server(("127.0.0.1", 0)) as closed:
        address = WorkerAddress(*closed.getsockname()[:2], fingerprint=NO_CERTIFICATE)
    (done,) = serve_slot(address, "token", 1, 1, None, iter([pd.DataFrame({"id": [1]})]))
    assert done.to_dict("records") == [{"slot": 1, "served": 0}]
    # Its unix socket closed too (the file left behind): the same.
    path = str(tmp_path / "door")
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(path)
    (done,) = serve_slot(address._replace(path=path), "token", 2, 1, None, iter([pd.DataFrame({"id": [2]})]))
    assert done.to_dict("records") == [{"slot": 2, "served": 0}]
    # Accepted, then closed before the welcome: the same.
    with socket.create_server(("127.0.0.1", 0)) as listener:
        closer = threading.Thread(target=lambda: listener.accept()[0].close(), daemon=True)
        closer.start()
        (done,) = serve_slot(WorkerAddress(*listener.getsockname()[:2], fingerprint=NO_CERTIFICATE), "token", 0, 1, None, iter([pd.DataFrame({"id": [0]})]))
        closer.join(5)
    assert done.to_dict("records") == [{"slot": 0, "served": 0}]


def test_a_udf_past_its_worker_memory_fails_its_micro_batch_and_its_slot_gets_a_fresh_worker(spark_engine):
    # On the session's third core, with a limit of its own.
    session = spark_engine.session
    resident = ResidentWorkers(session, 1, session.agent_host(), batch_timeout=60, worker_memory=600 << 20, first_worker_wait=START_TIMEOUT)
    resident.start()
    try:
        assert resident.wait_for_workers(1, START_TIMEOUT)
        (hoarder,) = resident.worker_pids()
        tasks = stream_tasks(rich_points(8))
        with pytest.raises(WorkerOverMemory) as failure:
            resident.run(Job(sample.hoards, {"chunk_mb": 32}), tasks)
        message = str(failure.value)
        assert "UDF 'hoards'" in message and "past --worker-memory 600 MiB" in message and f"pid {hoarder}" in message, message
        # Not retried (the UDF did it): one relaunch, and the fresh worker computes.
        job = Job(moving_avg, {"field": "i", "size": 2, "as": "avg"})
        expected = [decode(o) for o in LocalEngine().run(job, tasks).to_pandas()["output"]]
        assert [decode(o) for o in resident.run(job, tasks).to_pandas()["output"]] == expected
        assert resident.launches == 2 and hoarder not in resident.worker_pids()
    finally:
        resident.stop()


class _Tenant:
    def __init__(self):
        self.waits: list[float] = []
        self.held: list[int] = []

    def slot_waited(self, seconds: float) -> None:
        self.waits.append(seconds)

    def slots_now(self, held: int) -> None:
        self.held.append(held)


def test_a_slow_tasks_micro_batch_leaves_its_neighbour_a_slot(spark_engine):
    """Two tenants on two slots: the slow one holds one slot at most, so the fast one's
    micro-batches never wait behind a slow call (before: one lock for every micro-batch)."""
    resident = spark_engine.resident
    slow, fast = _Tenant(), _Tenant()
    seconds = 3.0
    slow_job = Job(sample.sleepy, {"seconds": seconds})
    fast_job = Job(moving_avg, {"field": "i", "size": 2, "as": "avg"})
    tasks = stream_tasks(rich_points(16))  # four groups
    fast.slot_waited(0.0)  # the fast tenant is active before the slow one starts
    resident.run(fast_job, tasks, fast)
    finished: list[float] = []
    slow_thread = threading.Thread(target=lambda: (resident.run(slow_job, tasks, slow), finished.append(time.monotonic())), daemon=True)
    slow_thread.start()
    while not slow.held or slow.held[-1] == 0:
        time.sleep(0.01)
    trips = []
    for _ in range(10):
        started = time.monotonic()
        results = resident.run(fast_job, tasks, fast).to_pandas()
        trips.append(time.monotonic() - started)
        assert results["error"].isna().all()
        assert resident.held_by(slow) <= 1
    slow_thread.join(4 * seconds * 4)
    assert finished, "the slow micro-batch did not finish"
    # Every fast micro-batch finished before any slow call could have ended twice: none of
    # them waited for one.
    assert max(trips) < seconds, trips
    assert max(slow.held) == 1, slow.held
    assert sum(trips) < 4 * seconds  # the slow one (four calls on one slot) was still going


def _hold_a_core(started: str, frames):
    open(started, "w").close()
    time.sleep(30)
    yield from frames


def test_a_micro_batch_as_a_spark_job_that_gets_no_core_fails_at_the_batch_timeout(spark_engine, tmp_path):
    """No resident worker, and Spark gives the fallback job no core (a cluster that forgot
    the application looks the same): cancelled at --batch-timeout, saying so, not waited for."""
    session = spark_engine.session
    blocker_group = "test-holds-the-third-core"
    holding = tmp_path / "holding"

    def hold() -> None:
        session.tag_jobs(blocker_group)
        try:
            session.dataframes.range(0, 1, 1, 1).mapInPandas(functools.partial(_hold_a_core, str(holding)), schema="id long").collect()
        except Exception:
            pass  # cancelled below

    blocker = threading.Thread(target=hold, daemon=True)
    blocker.start()
    deadline = time.monotonic() + 60
    while not holding.exists():  # its task holds the core the resident workers leave
        assert time.monotonic() < deadline, "the blocking job never got a core"
        time.sleep(0.05)
    never_connected = ResidentWorkers(session, 1, session.agent_host(), batch_timeout=3.0)  # never started
    try:
        started = time.monotonic()
        with pytest.raises(RuntimeError, match=r"longer than --batch-timeout \(3 s\)"):
            run_until_resident(session, never_connected, Job(moving_avg, {"field": "i", "size": 2, "as": "avg"}), stream_tasks(rich_points(8)), 3.0, "test-fallback")
        assert time.monotonic() - started < 20
    finally:
        session.cancel(blocker_group)
        blocker.join(30)


def test_a_micro_batch_is_split_only_when_its_points_are_worth_it_or_a_share_asks():
    small = stream_tasks(rich_points(40))
    assert _split(small, 2) == [small]  # a few KiB: one part, whatever the workers
    parts = _split(small, 2, at_least=3)  # a slow task's share: parts, however small
    assert len(parts) == 3 and sum(part.num_rows for part in parts) == small.num_rows
    big = stream_tasks(rich_points(40_000))
    assert len(_split(big, 2)) == 2 and len(_split(big, 1)) == 1


def _by_group(points) -> list[list]:
    """The points of each group, in the order the groups first come."""
    groups: dict[str, list] = {}
    for point in points:
        groups.setdefault(point.group, []).append(point)
    return list(groups.values())


def _slices_by_group(points) -> list[StreamTasks]:
    """One packed stream slice per group, in the order the groups first come."""
    return [StreamTasks.of_table(stream_tasks(group)) for group in _by_group(points)]


def _outputs(results) -> list[tuple]:
    return [
        (output, history, emitted)
        for output, history, emitted in zip(results.output.tolist(), results.histories.tolist(), results.emitted.tolist())
    ]


def test_chained_slices_come_back_in_order_each_taken_while_the_one_before_computes(spark_engine):
    resident = spark_engine.resident
    job = Job(moving_avg, {"field": "i", "size": 3, "as": "avg"})
    slices = _slices_by_group(rich_points(40))
    assert len(slices) == 4
    tenant = _Tenant()
    following = list(slices[1:])
    held_when_asked = []

    def follow():
        held_when_asked.append(resident.held_by(tenant))
        return following.pop(0) if following else None

    chained = list(resident.chain_stream(job, slices[0], tenant, follow))
    local = LocalEngine()
    assert [_outputs(results) for results in chained] == [_outputs(local.run_stream(job, tasks)) for tasks in slices]
    # Each next slice was asked for with one out on the worker held, until None ended the chain.
    assert held_when_asked == [1, 1, 1, 1]
    assert resident.held_by(tenant) == 0


def test_a_worker_lost_mid_chain_has_each_slice_it_held_computed_once_in_order(spark_engine):
    resident = spark_engine.resident
    launches = resident.launches
    job = Job(sample.sleepy, {"seconds": 0.4})
    slices = _slices_by_group(rich_points(40))
    tenant = _Tenant()
    following = list(slices[1:])

    def follow():
        if len(following) == 3:  # the first slice computes, the second is about to be sent
            busy = [worker.pid for worker in resident._slots.workers() if worker.busy]
            _after(0.2, lambda: _signal_all(busy, signal.SIGKILL))
        return following.pop(0) if following else None

    chained = list(resident.chain_stream(job, slices[0], tenant, follow))
    echoed = [[r.point.time for r in decode(output)] for results in chained for output in results.output.tolist()]
    # The two slices out on the lost worker, every point once, in order; then the chain ended,
    # leaving the rest to its caller.
    assert echoed == [[p.time for p in group] for group in _by_group(rich_points(40))[:2]]
    assert len(following) == 2
    assert resident.launches == launches + 1
    assert resident.held_by(tenant) == 0


def test_a_chain_gives_its_worker_back_once_another_task_waits_for_one(spark_engine):
    """A task chaining slice after slice holds its worker only while no other task waits: with
    the other slot busy, a third task's micro-batch waits for the chain's next slice at most."""
    resident = spark_engine.resident
    chaining, blocking, waiting = _Tenant(), _Tenant(), _Tenant()
    slow = Job(sample.sleepy, {"seconds": 0.2})
    slices = _slices_by_group(rich_points(40))
    asked = []

    def follow():
        asked.append(time.monotonic())
        return slices[len(asked) % len(slices)] if len(asked) < 30 else None

    ended = {}

    def run(name, tenant, job, tasks):
        resident.run(job, tasks, tenant)
        ended[name] = time.monotonic()

    chain = threading.Thread(target=lambda: (list(resident.chain_stream(slow, slices[0], chaining, follow)), ended.setdefault("chain", time.monotonic())), daemon=True)
    chain.start()
    while not asked:
        time.sleep(0.01)
    blocker = threading.Thread(target=run, args=("blocker", blocking, Job(sample.sleepy, {"seconds": 2.0}), slices[0]), daemon=True)
    blocker.start()
    while not blocking.held or blocking.held[-1] == 0:
        time.sleep(0.01)
    run("waiting", waiting, Job(sample.sleepy, {"seconds": 0.05}), slices[1])
    for thread in (chain, blocker):
        thread.join(30)
    # The waiting task went before the blocker's slot freed, and the chain stopped for it.
    assert ended["waiting"] < ended["blocker"], ended
    assert len(asked) < 30, len(asked)
    assert ended["chain"] <= ended["waiting"] + 0.5, ended


def test_a_chains_pace_takes_the_next_slice_as_the_worker_ends_the_one_before_by_its_own_time():
    pace = _ChainPace()
    assert pace.take_at(100.0) is None  # nothing known yet: takes the next at once
    pace.computed(0.010)
    assert pace.computes == 0.010
    pace.computed(0.020)
    assert pace.computes == pytest.approx(0.010 + _ChainPace.WEIGHT * 0.010)
    pace.followed(0.004)
    assert pace.takes == pytest.approx(_ChainPace.WEIGHT * 0.004)
    # The slice's start, plus the worker's time, less the take's.
    assert pace.take_at(100.0) == pytest.approx(100.0 + pace.computes - pace.takes)
    began = time.monotonic()
    waited: list[float] = []
    pace.wait_to_follow(began, lambda seconds: waited.append(seconds) or False)
    assert waited and waited[0] <= pace.take_at(began) - began
    # An answer that comes first ends the wait: the estimate never holds it back.
    pace.computed(60.0)
    pace.wait_to_follow(time.monotonic(), lambda seconds: seconds > 1.0)


def test_a_chain_reads_an_answer_that_came_before_its_paces_estimate():
    # A real link: the answer is on the socket before the estimated end; the wait ends at once.

    ours, theirs = socket.socketpair()
    link = Link(ours, deadlines=True)
    pace = _ChainPace()
    pace.computed(30.0)  # a long estimate, far off
    threading.Timer(0.05, lambda: theirs.sendall(b"x")).start()
    waited_from = time.monotonic()
    pace.wait_to_follow(waited_from, link.message_waiting)
    assert time.monotonic() - waited_from < 20.0
    assert link.message_waiting(0.0)
    ours.close()
    theirs.close()


def test_a_slice_ends_when_its_worker_says_only_on_the_agents_clock_and_within_the_slice():
    assert _slice_end(10.5, 10.0, 11.0, same_clock=True) == 10.5
    assert _slice_end(10.5, 10.0, 11.0, same_clock=False) == 11.0  # another host: the answer read
    # Told outside the slice (a clock of its own after all): never trusted, never slept on.
    assert _slice_end(1010.5, 10.0, 11.0, same_clock=True) == 11.0
    assert _slice_end(9.5, 10.0, 11.0, same_clock=True) == 11.0


def test_a_chain_paces_its_slices_by_the_workers_own_account_not_by_when_its_answers_are_read(spark_engine):
    """Timed from the agent's side, a slice seemed to last until the compute thread read its
    answer: an agent slow to take the next slice made each slice look longer, so the next take
    came later still. The worker says how long each slice took; on this host, when it ended."""
    resident = spark_engine.resident
    job = Job(moving_avg, {"field": "i", "size": 3, "as": "avg"})
    slices = _slices_by_group(rich_points(40))
    tenant = _Tenant()
    slow_take = 0.2  # each answer waits this long to be read
    following = [*slices[1:], *slices]

    def follow():
        time.sleep(slow_take)
        return following.pop(0) if following else None

    chained = list(resident.chain_stream(job, slices[0], tenant, follow))
    assert len(chained) == 1 + len(slices[1:]) + len(slices)
    pace = resident._pace(tenant)
    # Timed as read, the first slice alone seemed to last slow_take.
    assert pace.computes is not None and pace.computes < slow_take / 10, pace.computes
    assert resident._pace(tenant) is pace  # kept for the task's next chain
    assert all(worker.same_clock for worker in resident._slots.workers())  # local Spark: one kernel


def test_a_stream_result_carries_the_workers_times_ahead_of_its_columns():
    payload = bytearray(b"".join(stream_result(1_500_000_000, 1_750_000_000, [b"col", b"umns"])))
    took, ended, columns = read_stream_result(payload)
    assert (took, ended, bytes(columns)) == (1.5, 1.75, b"columns")
    with pytest.raises(ValueError, match="short of its times"):
        read_stream_result(bytearray(15))
    clock = clock_id()
    assert clock and clock == clock_id()  # Linux: the running kernel's boot id
