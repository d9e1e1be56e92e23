"""Prometheus metrics of a server with many tasks (``serve``, the shared server), at
``http://HOST:PORT/metrics`` with ``--metrics-address HOST:PORT``.

Read at each scrape from what the tasks count anyway (``stats.TaskStats``): nothing is counted
twice and a task that ended leaves the scrape with its session.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from udf_agent.runtime.agent import Agent

TASK_LABELS = ("task", "node", "udf")


class MetricsError(Exception):
    """The metrics endpoint cannot listen; the message says why."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:9100`` for IPv6, ``:9100`` for every interface, port 0 for any free
    one) as (host, port)."""
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9100)")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


class _TasksCollector:
    """Each live task's counts, labelled by Kapacitor's task and node IDs and the UDF, and
    the process's Spark workers."""

    def __init__(self, agents: Callable[[], list[Agent]], describe: Callable[[], dict[str, Any]]):
        self._agents = agents
        self._describe = describe

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        def counter(name: str, text: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"udf_agent_{name}", text, labels=TASK_LABELS)

        received = counter("points_received", "Points Kapacitor sent the task")
        sent = counter("points_sent", "Points the task sent Kapacitor")
        batches = counter("micro_batches", "Micro-batches computed")
        skipped = counter("points_skipped", "Points dropped by --on-error skip")
        dead_lettered = counter("points_dead_lettered", "Points written out by --on-error dead-letter")
        dropped = counter("points_dropped_at_stop", "Accepted points not computed within the drain timeout at a stop")
        groups = GaugeMetricFamily("udf_agent_groups", "Groups whose history and state the task keeps", labels=TASK_LABELS)
        queued = GaugeMetricFamily("udf_agent_output_queued_bytes", "Output waiting to be written to Kapacitor", labels=TASK_LABELS)
        compute = HistogramMetricFamily("udf_agent_compute_seconds", "Time to compute a micro-batch, from taking it to queueing its output", labels=TASK_LABELS)
        keepalive = HistogramMetricFamily("udf_agent_keepalive_answer_seconds", "From Kapacitor's stamp on a keepalive to its answer queued first", labels=TASK_LABELS)
        slot_wait = HistogramMetricFamily("udf_agent_slot_wait_seconds", "Time a part of a micro-batch waited for a resident slot of the shared engine", labels=TASK_LABELS)
        slots_held = GaugeMetricFamily("udf_agent_slots_held", "Resident slots the task holds now", labels=TASK_LABELS)
        behind = GaugeMetricFamily("udf_agent_falling_behind", "1 while the task's input waits for compute longer than it may gather (a slow UDF or a busy engine)", labels=TASK_LABELS)
        for agent in self._agents():
            labels = [agent.labels.task_id, agent.labels.node_id, agent.labels.udf]
            stats = agent.stats
            received.add_metric(labels, stats.points_in)
            sent.add_metric(labels, agent.status()["points_out"])
            batches.add_metric(labels, stats.micro_batches)
            policy = agent.config.on_error
            skipped.add_metric(labels, stats.skipped if policy == "skip" else 0)
            dead_lettered.add_metric(labels, stats.skipped if policy == "dead-letter" else 0)
            dropped.add_metric(labels, stats.dropped_at_stop)
            groups.add_metric(labels, len(agent.runner.groups))
            queued.add_metric(labels, agent.writer.queued_bytes)
            compute.add_metric(labels, stats.compute_seconds.cumulative(), stats.compute_seconds.sum)
            keepalive.add_metric(labels, stats.keepalive_seconds.cumulative(), stats.keepalive_seconds.sum)
            slot_wait.add_metric(labels, stats.slot_wait_seconds.cumulative(), stats.slot_wait_seconds.sum)
            slots_held.add_metric(labels, stats.slots_held)
            behind.add_metric(labels, int(agent.falling_behind()))
        yield from (received, sent, batches, skipped, dead_lettered, dropped, groups, queued, compute, keepalive, slot_wait, slots_held, behind)
        spark = self._describe()
        workers = GaugeMetricFamily("udf_agent_spark_workers_connected", "Spark's resident Python workers connected to this process")
        workers.add_metric([], spark.get("resident_workers", 0))
        launches = CounterMetricFamily("udf_agent_spark_worker_launches", "Launches of the resident workers (the first, then each relaunch)")
        launches.add_metric([], spark.get("resident_launches", 0))
        losses = CounterMetricFamily("udf_agent_resident_worker_losses", "Resident workers lost while computing or serving (crashed, killed, stuck past --batch-timeout, over --worker-memory)")
        losses.add_metric([], spark.get("resident_worker_losses", 0))
        slots = GaugeMetricFamily("udf_agent_resident_slots", "Resident slots wanted now (each a core), labelled with why so many: starting, fixed, growing, grown, steady, shrinking, capped or released", labels=["state"])
        if "resident_slots" in spark:
            slots.add_metric([spark["resident_slots_why"].split(":", 1)[0]], spark["resident_slots"])
        cores = GaugeMetricFamily("udf_agent_spark_executor_cores", "Cores of the executors Spark holds for this process's resident slots (on a standalone cluster whose slots grow)")
        if "spark_cores" in spark:
            cores.add_metric([], spark["spark_cores"])
        yield from (workers, launches, losses, slots, cores)


class _ProcessTreeMemoryCollector:
    """Resident memory of this process and all its descendants: Spark's JVM and its Python
    workers are child processes, which the default process collector does not count."""

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily

        tree = GaugeMetricFamily("udf_agent_process_tree_resident_memory_bytes", "Resident memory of this process and its descendants (Spark's JVM and Python workers)")
        tree.add_metric([], process_tree_resident_bytes(os.getpid()))
        yield tree


def process_tree_resident_bytes(pid: int) -> int:
    """RSS of ``pid`` and every descendant, from /proc (pages shared between them are
    counted in each). A few small reads per process: cheap enough for every scrape."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    pending = [pid]
    while pending:
        process = pending.pop()
        try:  # any of these reads fails for a process or thread that ended meanwhile
            with open(f"/proc/{process}/statm", "rb") as statm:
                total += int(statm.read().split()[1]) * page
            threads = os.listdir(f"/proc/{process}/task")
        except OSError:
            continue
        for thread in threads:  # a child is listed under the thread that started it
            try:
                with open(f"/proc/{process}/task/{thread}/children", "rb") as children:
                    pending.extend(int(child) for child in children.read().split())
            except OSError:
                pass
    return total


def serve_metrics(address: str, agents: Callable[[], list[Agent]], describe: Callable[[], dict[str, Any]]) -> tuple[str, int]:
    """Starts the endpoint on a thread of its own; where it listens (the port, if 0 was asked)."""
    from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

    host, port = parse_address(address)
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    registry.register(_TasksCollector(agents, describe))
    registry.register(_ProcessTreeMemoryCollector())
    try:
        server, _ = start_http_server(port, host, registry=registry)
    except (OSError, socket.gaierror) as exc:
        raise MetricsError(f"cannot serve metrics on {address}: {exc.strerror or exc}") from None
    bound_host, bound_port = server.server_address[:2]
    return str(bound_host), int(bound_port)
