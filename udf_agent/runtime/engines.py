"""Which engine computes a micro-batch: the UDF's Spark engine, or this process.

Nothing heavy is imported here, so the Info path stays fast.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from udf_agent.api import UDFSpec
from udf_agent.compute.engine import Engine, LocalEngine

log = logging.getLogger(__name__)


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
        if spec.passthrough or not spec.compute:
            return  # its points are never computed, or not on Spark
        self.warm_up_spark()

    def warm_up_spark(self) -> None:
        """Starts the Spark engine in the background, whichever UDF will use it."""
        threading.Thread(target=self._warm_up, name="engine-warm-up", daemon=True).start()

    def engine_for(self, spec: UDFSpec, points: int | None = None) -> Engine:
        """The engine for a micro-batch of ``points`` points (None: the UDF's Spark engine)."""
        if not spec.compute:
            return self._local
        spark = self._spark_engine()
        if points is None:
            return spark
        if (self.local_while_starting and not spark.ready()) or points <= self.local_max_points:
            return self._local
        return spark

    def describe(self) -> dict[str, Any]:
        """The Spark engine's state, as ``udf-agent status`` shows it."""
        with self._lock:
            spark = self._spark
        if spark is None:
            return {"spark": "not started"}
        found: dict[str, Any] = {"spark": "ready" if spark.ready() else "starting", "micro_batches_run": spark.name}
        resident = getattr(spark, "resident", None)  # a SparkEngine's resident workers, if it dispatches so
        if resident is not None:
            found["resident_workers"] = len(resident.worker_pids())
            found["resident_launches"] = resident.launches
            found["resident_worker_losses"] = resident.worker_losses
            holding = resident.holding()
            found["resident_slots"] = holding.wanted
            found["resident_slots_why"] = holding.reason
            if holding.cores is not None:
                found["spark_cores"] = holding.cores
        return found

    def stop(self) -> None:
        with self._lock:
            if self._spark is not None:
                self._spark.stop()

    def _spark_engine(self) -> Engine:
        with self._lock:
            if self._spark is None:
                self._spark = self._spark_factory()
            return self._spark

    def _warm_up(self) -> None:
        try:
            self._spark_engine().start()
        except Exception:
            # The compute thread meets the same failure and reports it to Kapacitor.
            log.exception("engine warm-up failed")


# Kapacitor waits for the process's exit after our output ends: Spark gets this long
# to stop cleanly; its JVM exits by itself once this process is gone.
SPARK_STOP_GRACE = 2.0


def exit_process(code: int, engines: Engines) -> NoReturn:
    """Ends the process once every frame is out: Spark's JVM follows its parent down."""
    stopper = threading.Thread(target=engines.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=SPARK_STOP_GRACE)
    sys.stderr.flush()
    os._exit(code)
