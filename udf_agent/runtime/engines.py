"""Where tasks run: the small interface every compute engine implements.

An engine takes the tasks of one micro-batch (an Arrow table of
``compute.TASK_SCHEMA``) and returns one result row per task, an Arrow table of
``compute.RESULT_SCHEMA``
(``compute.RESULT_COLUMNS``), in task order. ``start`` returns at once:
engines warm up in the background while the agent keeps answering Kapacitor.
Nothing heavy is imported here, so the Info path stays fast.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from udf_agent.api import UDFSpec

if TYPE_CHECKING:  # pyarrow and the compute module load only when a micro-batch is computed
    import pyarrow as pa

    from udf_agent.compute.run import Job

log = logging.getLogger(__name__)


class EngineStartError(RuntimeError):
    """The engine cannot start (Spark unreachable, no Java): the message says why and what to
    do, and a traceback would add nothing to it."""


class Engine(Protocol):
    name: str  # where its micro-batches are computed, for the logs

    def start(self) -> None: ...

    def ready(self) -> bool:
        """Whether ``run`` would start at once (not wait for the engine to start)."""

    def run(self, job: Job, tasks: pa.Table) -> pa.Table:
        """Tasks of ``compute.TASK_SCHEMA`` in, results of ``compute.RESULT_SCHEMA`` out, in task order."""

    def stop(self) -> None: ...


class LocalEngine:
    """Runs tasks in this process: UDFs that compute nothing, and small micro-batches."""

    name = "in the agent"

    def start(self) -> None:
        pass

    def ready(self) -> bool:
        return True

    def run(self, job: Job, tasks: pa.Table) -> pa.Table:
        from udf_agent.compute.run import compute_tasks

        return compute_tasks(job, tasks)

    def stop(self) -> None:
        pass


class Engines:
    """Gives each micro-batch the engine it needs; at most one Spark engine per process.

    UDFs declared with ``compute=False`` run locally and never start Spark. With
    ``local_while_starting``, every micro-batch that arrives while Spark is still
    starting (seconds) runs locally, and with ``local_max_points`` > 0 so do
    micro-batches of at most that many points: the same code as in Spark's workers.
    """

    def __init__(self, spark_factory: Callable[[], Engine], local_max_points: int = 0, local_while_starting: bool = False):
        self._spark_factory = spark_factory
        self.local_max_points = local_max_points
        self.local_while_starting = local_while_starting
        self._spark: Engine | None = None
        self._local = LocalEngine()
        self._lock = threading.Lock()

    def warm_up(self, spec: UDFSpec) -> None:
        """Creates and starts the engine in the background (imports included)."""
        if spec.passthrough:
            return  # its points are never computed
        threading.Thread(target=self._warm_up, args=(spec,), name="engine-warm-up", daemon=True).start()

    def engine_for(self, spec: UDFSpec, points: int | None = None) -> Engine:
        """The engine for a micro-batch of ``points`` points (None: the UDF's Spark engine)."""
        if not spec.compute:
            return self._local
        with self._lock:
            if self._spark is None:
                self._spark = self._spark_factory()
            spark = self._spark
        if points is None:
            return spark
        if (self.local_while_starting and not spark.ready()) or points <= self.local_max_points:
            return self._local
        return spark

    def stop(self) -> None:
        with self._lock:
            if self._spark is not None:
                self._spark.stop()

    def _warm_up(self, spec: UDFSpec) -> None:
        try:
            self.engine_for(spec).start()
        except Exception:
            # The compute thread meets the same failure and reports it to Kapacitor.
            log.exception("engine warm-up failed")
