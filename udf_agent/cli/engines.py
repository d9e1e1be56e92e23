"""The engines a command computes on: Spark as its options describe it, started on first use.

Built here, above the runtime and the Spark engine both, so that neither imports the other:
the runtime sees only ``compute.Engine``.
"""

from __future__ import annotations

from typing import Any

from udf_agent.runtime.engines import Engines


def spark_engines(
    master: str,
    confs: tuple[tuple[str, str], ...],
    spark_dispatch: str = "resident",
    batch_timeout: float = 60.0,
    resident_slots: int | None = None,
    resident_idle: float = 30.0,
    local_while_starting: bool | None = None,
    local_max_points: int = 0,
    remote: str | None = None,
    worker_memory: int | None = None,
    max_cores: int | None = None,
) -> Engines:
    """Engines computing on the Spark these settings describe, started on first use."""

    # Any: SparkEngine's read-only ``name`` does not yet match compute.Engine's settable one.
    def make_spark() -> Any:
        from spark_backend import SparkEngine, SparkSettings

        return SparkEngine(SparkSettings(master=master, conf=dict(confs), dispatch=spark_dispatch, batch_timeout=batch_timeout, resident_slots=resident_slots, resident_idle=resident_idle, remote=remote, worker_memory=worker_memory, max_cores=max_cores))

    if local_while_starting is None:
        # On a remote cluster the UDF may need the cluster's resources: Spark only, unless asked.
        local_while_starting = master.startswith("local") and remote is None
    return Engines(make_spark, local_max_points, local_while_starting)
