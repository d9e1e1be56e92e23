"""Where tasks run: the small interface every compute engine implements.

An engine takes the tasks of one micro-batch (a pandas DataFrame with the
columns of ``compute.TASK_COLUMNS``) and returns one result row per task
(``compute.RESULT_COLUMNS``), in task order. ``start`` returns at once:
engines warm up in the background while the agent keeps answering Kapacitor.
Nothing heavy is imported here, so the Info path stays fast.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Protocol

from udf_agent.api import UDFSpec

log = logging.getLogger(__name__)


class Engine(Protocol):
    def start(self) -> None: ...

    def run(self, job: Any, tasks: Any) -> Any: ...

    def stop(self) -> None: ...


class LocalEngine:
    """Runs tasks in this process; for UDFs that compute nothing (such as mirror)."""

    def start(self) -> None:
        pass

    def run(self, job: Any, tasks: Any) -> Any:
        from udf_agent.compute import run_partition

        (results,) = run_partition(job, iter([tasks]))
        return results

    def stop(self) -> None:
        pass


class Engines:
    """Gives each agent the engine its UDF needs; at most one Spark engine per process.

    UDFs declared with ``compute=False`` run locally and never start Spark.
    """

    def __init__(self, spark_factory: Callable[[], Engine]):
        self._spark_factory = spark_factory
        self._spark: Engine | None = None
        self._local = LocalEngine()
        self._lock = threading.Lock()

    def warm_up(self, spec: UDFSpec) -> None:
        """Creates and starts the engine in the background (imports included)."""
        if spec.passthrough:
            return  # its points are never computed
        threading.Thread(target=self._warm_up, args=(spec,), name="engine-warm-up", daemon=True).start()

    def engine_for(self, spec: UDFSpec) -> Engine:
        if not spec.compute:
            return self._local
        with self._lock:
            if self._spark is None:
                self._spark = self._spark_factory()
            return self._spark

    def stop(self) -> None:
        with self._lock:
            if self._spark is not None:
                self._spark.stop()

    def _warm_up(self, spec: UDFSpec) -> None:
        try:
            import udf_agent.compute  # noqa: F401  (pandas and pyarrow, off the reader's path)

            self.engine_for(spec).start()
        except Exception:
            # The compute thread meets the same failure and reports it to Kapacitor.
            log.exception("engine warm-up failed")
