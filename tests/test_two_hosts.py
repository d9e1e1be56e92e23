"""Across hosts, really: two Linux network namespaces joined by a veth pair stand for two
hosts (``benchmarks/hosts.py``). Host A runs a Spark standalone master, a 1-core worker and
the agent; host B a 1-core worker. They share only the veth: no route leads anywhere else,
and neither sees the other's $TMPDIR (a private mount namespace covers it), so B's resident
worker cannot take the agent's unix socket and must come over TCP, as on another machine.
A capture on B's veth end shows what crossed the wire. Needs root;
skipped otherwise."""

from __future__ import annotations

import contextlib
import random
import re
import secrets
import sys
import time

import pytest
from test_cluster import ROOT, _assert_moving_avg, _outputs, _send_points

from benchmarks.hosts import HostsUnavailable, TwoHosts, tcp_sockets, two_hosts
from udf_agent import udf_pb2
from udf_agent.testing import KapacitorDriver, grouped_point, option
from udf_agent.wire.frames import encode_frame

# One test process takes them all (pytest -n 2 --dist loadgroup): clusters come and go one at a time.
pytestmark = [pytest.mark.integration, pytest.mark.cluster, pytest.mark.xdist_group("cluster")]

READY = re.compile(r"resident worker (\d+) \(pid (\d+)\) ready: (\d+) of (\d+) resident Spark worker")


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Hosts A and B with a master on A and a 1-core worker on each, registered."""
    with contextlib.ExitStack() as stack:
        try:
            pair = stack.enter_context(two_hosts(tmp_path_factory.mktemp("two_hosts")))
        except HostsUnavailable as exc:
            pytest.skip(f"two hosts made of network namespaces are unavailable here: {exc}")
        pair.start_cluster()
        yield pair


def agent_on_a(hosts: TwoHosts, *args: str, cores: int | None = 2, env: dict[str, str] | None = None) -> KapacitorDriver:
    """``udf-agent run ARGS`` on host A against the cluster: its task takes ``cores`` cores
    (both workers': one on each host; None: as many as it grows to), and its executors reach
    it at A's address. Its resident workers stay for the test (their first launch, an
    executor's start on each host, may take longer than the 30 s idle spell after which they
    would be released and relaunched)."""
    a = hosts.a.address
    fixed = ("--conf", f"spark.cores.max={cores}") if cores is not None else ()
    return hosts.agent(
        "run", *args, "--master", hosts.master_url, "--flush-interval", "50ms", "--log-level", "info", "--resident-idle", "10m",
        *fixed, "--conf", f"spark.driver.host={a}", "--conf", f"spark.driver.bindAddress={a}",
        cwd=ROOT, env=env,
    )


def wait_for_workers(driver: KapacitorDriver, count: int, timeout: float = 120) -> dict[int, int]:
    """Slot -> pid of the resident workers once ``count`` are connected (the agent's log)."""
    deadline = time.monotonic() + timeout
    while True:
        log = driver.log()
        ready = READY.findall(log)
        if any(int(connected) >= count for _, _, connected, _ in ready):
            return {int(slot): int(pid) for slot, pid, _, _ in ready}
        assert driver.process.poll() is None and time.monotonic() < deadline, f"{count} resident workers not connected\n{log[-4000:]}"
        time.sleep(0.2)


def agent_door(hosts: TwoHosts, agent_pid: int) -> int:
    """The port the agent's resident workers connect to: the one its process listens on at A's address."""
    ports = [s.local_port for s in tcp_sockets(agent_pid) if s.state == "LISTEN" and s.local == hosts.a.address]
    assert len(ports) == 1, tcp_sockets(agent_pid)
    return ports[0]


def test_moving_avg_on_two_hosts_matches_plain_pandas_with_a_resident_worker_on_each(hosts):
    with hosts.capture(hosts.b) as capture:
        driver = agent_on_a(hosts, "moving_avg")
        assert driver.init(option("field", "v"), option("size", 4)).success
        workers = wait_for_workers(driver, 2)
        rng = random.Random(17)
        sent = _send_points(driver, rng, range(600))
        points = _outputs(driver, len(sent))
        sent += _send_points(driver, rng, range(600, 1200))
        points = _outputs(driver, len(sent))

        # The resident workers ran on both hosts: each one's pid (from its hello) is a process
        # in A's network namespace or B's, under that host's Spark worker.
        on = {pid: hosts.host_of(pid) for pid in workers.values()}
        assert sorted(host.label for host in on.values() if host is not None) == ["A", "B"], (on, driver.log()[-4000:])
        under_workers = hosts.spark_processes()
        for pid, host in on.items():
            assert pid in under_workers.get(host.label, []), (pid, host.label, under_workers)

        # B's came over TCP (it could not see A's unix socket), A's took the unix socket.
        door = agent_door(hosts, driver.process.pid)
        connections = [s for s in tcp_sockets(driver.process.pid) if s.state == "ESTABLISHED" and s.local_port == door]
        assert [s.remote for s in connections] == [hosts.b.address], connections
        assert driver.close(timeout=60) == 0, driver.log()[-4000:]

    _assert_moving_avg(points, sent, 4)
    # The traffic crossed the veth: B's worker's connection to the agent, both ways, with data.
    segments = [s for s in capture.tcp() if door in (s.sport, s.dport)]
    to_agent = [s for s in segments if (s.src, s.dst, s.dport) == (hosts.b.address, hosts.a.address, door)]
    from_agent = [s for s in segments if (s.src, s.dst, s.sport) == (hosts.a.address, hosts.b.address, door)]
    assert sum(len(s.payload) for s in to_agent) > 0 and sum(len(s.payload) for s in from_agent) > 0, segments[:20]
    # Without Spark's own encryption its RPC crosses in clear (this is what makes the
    # auditor's test below one that can fail).
    assert SPARK_RPC_MARKER in capture.captured_bytes()


def test_a_cpu_bound_stream_micro_batch_computes_on_both_hosts_each_groups_order_kept(hosts):
    # 20 groups of a UDF spending 5 ms of CPU a call: 100 ms a micro-batch, worth a part per core.
    driver = agent_on_a(hosts, "tests.udfs.sample:busy_pid")
    assert driver.init(option("seconds", 0.005)).success, driver.log()[-4000:]
    wait_for_workers(driver, 2)
    groups, rounds = 20, 15
    sent = 0
    for round_number in range(rounds):
        driver.send_raw(b"".join(encode_frame(udf_pb2.Request(point=grouped_point((round_number * groups + g) * 1_000_000, f"g{g}", 1.0))) for g in range(groups)))
        sent += groups
        driver.responses.wait_for("point", sent, timeout=120)  # a micro-batch of every group each round
    outputs = driver.responses.of("point")
    assert len(outputs) == groups * rounds
    by_group: dict[str, list[int]] = {}
    for output in outputs:
        by_group.setdefault(output.tags["group"], []).append(output.time)
    assert by_group == {f"g{g}": [(r * groups + g) * 1_000_000 for r in range(rounds)] for g in range(groups)}
    # Parts of one micro-batch ran on each host's worker (the first micro-batches, nothing
    # measured yet, on one).
    late = outputs[-groups:]
    where = [hosts.host_of(int(output.fieldsDouble["pid"])) for output in late]
    assert {host.label if host else None for host in where} == {"A", "B"}, (where, driver.log()[-4000:])
    assert driver.close(timeout=60) == 0, driver.log()[-4000:]


def test_a_task_whose_workers_are_busy_grows_onto_the_other_host_and_gives_the_core_back_when_idle(hosts):
    """Default flags: one core to start. Fed as fast as it computes (its workers never wait
    for input), it grows to a slot on each host, computes on both, and, once its input stops,
    shrinks to one slot and Spark's dynamic allocation gives the other executor back."""
    driver = agent_on_a(hosts, "tests.udfs.sample:busy_pid", cores=None)
    assert driver.init(option("seconds", 0.005)).success, driver.log()[-4000:]
    wait_for_workers(driver, 1)
    groups, sent, round_number = 20, 0, 0
    deadline = time.monotonic() + 180
    both_hosts: set[str | None] = set()
    while both_hosts != {"A", "B"}:
        # Three micro-batches' worth outstanding at most: a worker that ends one finds the next.
        while sent - len(driver.responses.of("point")) < 3 * groups:
            driver.send_raw(b"".join(encode_frame(udf_pb2.Request(point=grouped_point((round_number * groups + g) * 1_000_000, f"g{g}", 1.0))) for g in range(groups)))
            sent, round_number = sent + groups, round_number + 1
        driver.responses.wait_for("point", sent - 2 * groups, timeout=120)
        late = driver.responses.of("point")[-groups:]
        both_hosts = {host.label if host else None for host in (hosts.host_of(int(output.fieldsDouble["pid"])) for output in late)}
        assert time.monotonic() < deadline, f"no micro-batch computed on both hosts\n{driver.log()[-6000:]}"
    assert "growing to 2 resident slot(s): growing: its 1 worker(s) busy" in driver.log()
    driver.responses.wait_for("point", sent, timeout=120)
    outputs = driver.responses.of("point")
    by_group: dict[str, list[int]] = {}
    for output in outputs:
        by_group.setdefault(output.tags["group"], []).append(output.time)
    assert by_group == {f"g{g}": [(r * groups + g) * 1_000_000 for r in range(round_number)] for g in range(groups)}
    # Idle: one slot again, and Spark holds one core for it (an executor's idle timeout after).
    stopped_at, idle_deadline = len(driver.log()), time.monotonic() + 90
    while not re.search(r"Spark holds [01] core\(s\) of executors for 1 resident slot\(s\)", driver.log()[stopped_at:]):
        assert time.monotonic() < idle_deadline, f"still holding more than one core 90 s after the input stopped\n{driver.log()[-6000:]}"
        time.sleep(0.5)
    assert "shrinking to 1 resident slot(s)" in driver.log()[stopped_at:]
    assert driver.close(timeout=60) == 0, driver.log()[-4000:]


# The endpoint an executor talks to its driver through, named in each of Spark's RPC messages
# to it (the job itself travels compressed: no name of ours shows in it, even in clear).
SPARK_RPC_MARKER = b"CoarseGrainedScheduler"


def test_an_auditor_capturing_between_the_hosts_finds_no_point_no_field_name_no_secret(tmp_path):
    """Spark's authentication and encryption on (the secret in spark-defaults.conf, as
    docs/deployment.md advises), the resident worker on host B only, so every point crosses
    the wire: a capture of all that crossed holds none of the points' tag values, not their
    field name, not Spark's secret, not Spark's RPC; the workers' channel is TLS. The
    capture's own bytes from B to the agent's port, played again from B, are refused."""
    secret = secrets.token_hex(24)
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    defaults = conf_dir / "spark-defaults.conf"
    defaults.write_text(f"spark.authenticate true\nspark.authenticate.secret {secret}\nspark.network.crypto.enabled true\n")
    defaults.chmod(0o600)
    field = f"usage_{secrets.token_hex(12)}"
    racks = [f"rack-{secrets.token_hex(12)}-{n}" for n in range(5)]
    with contextlib.ExitStack() as stack:
        try:
            pair = stack.enter_context(two_hosts(tmp_path / "hosts"))
        except HostsUnavailable as exc:
            pytest.skip(f"two hosts made of network namespaces are unavailable here: {exc}")
        pair.start_cluster(workers=[pair.b], conf_dir=conf_dir)
        with pair.capture(pair.b) as capture:
            driver = agent_on_a(pair, "moving_avg", cores=1, env={"SPARK_CONF_DIR": str(conf_dir)})
            assert driver.init(option("field", field), option("size", 4)).success
            (pid,) = wait_for_workers(driver, 1).values()
            assert pair.host_of(pid) is pair.b
            rng = random.Random(23)
            sent = [(t, rng.randrange(5), rng.uniform(-100, 100)) for t in range(1_500)]
            for t, rack, value in sent:
                driver.point(time=t, name="m", group=f"rack={racks[rack]}", dimensions=["rack"], tags={"rack": racks[rack]}, fieldsDouble={field: value})
            points = _outputs(driver, len(sent))
            door = agent_door(pair, driver.process.pid)
            log = driver.log()
            assert driver.close(timeout=60) == 0, log[-4000:]
        crossed = capture.captured_bytes()
        # The points did cross, encrypted: more bytes went to B's worker than their tag values hold.
        to_worker = sum(len(s.payload) for s in capture.tcp() if (s.src, s.sport, s.dst) == (pair.a.address, door, pair.b.address))
        assert to_worker > sum(len(racks[rack]) for _, rack, _ in sent), (to_worker, len(capture.frames()))
        assert not [rack for rack in racks if rack.encode() in crossed]
        assert field.encode() not in crossed and secret.encode() not in crossed and SPARK_RPC_MARKER not in crossed
        assert secret not in log
        _assert_moving_avg(points, [(t, racks[rack], value) for t, rack, value in sent], 4)

        # The worker's bytes to the agent, as captured, played again from B: refused.
        first = min((s for s in capture.tcp() if (s.src, s.dst, s.dport) == (pair.b.address, pair.a.address, door) and s.flags & 0x02), key=lambda s: s.time)
        recorded = b"".join(s.payload for s in capture.tcp() if (s.src, s.sport, s.dport) == (pair.b.address, first.sport, door))
        replay = tmp_path / "replay"
        replay.write_bytes(recorded)
        again = agent_on_a(pair, "moving_avg", cores=1, env={"SPARK_CONF_DIR": str(conf_dir)})
        assert again.init(option("field", field), option("size", 4)).success
        wait_for_workers(again, 1)
        door = agent_door(pair, again.process.pid)
        played = pair.b.run(sys.executable, "-c", REPLAY, pair.a.address, str(door), str(replay), capture_output=True, text=True, timeout=60)
        assert played.returncode == 0, played.stderr
        deadline = time.monotonic() + 30
        while "refused a connection on the resident workers' port" not in again.log():
            assert time.monotonic() < deadline, again.log()[-3000:]
            time.sleep(0.1)
        assert len(READY.findall(again.log())) == 1, again.log()[-3000:]  # no second worker joined
        assert again.close(timeout=60) == 0


# Sends a file's bytes to HOST PORT and reads until the peer closes, or resets (argv: HOST PORT FILE).
REPLAY = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20) as sock:
    try:
        sock.sendall(open(sys.argv[3], "rb").read())
        sock.shutdown(socket.SHUT_WR)  # all there is: the door need not wait for more
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass  # refused before it had read everything
"""
