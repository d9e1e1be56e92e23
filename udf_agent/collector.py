"""Keeping Python's full garbage collections short.

A full collection stops every thread, the reader that answers Kapacitor's keepalives included,
for as long as it takes to walk every container object in the process. Once pandas, pyarrow,
numba and PySpark are loaded that is ~100 k objects and ~50 ms on a quiet machine (100 ms and
more on a busy one): the keepalive answers of 30-110 ms seen flat out. What start-up builds
(modules, compiled code, the Spark session) lives as long as the process, so once it is built
it is moved out of the collector's sight (``gc.freeze``), and a full collection walks only
what came since. Objects frozen are still freed when nothing refers to them; only cycles
among them would outlive their use, so each moment freezes once per process (a server's later
tasks do not freeze their neighbours' objects).
"""

from __future__ import annotations

import gc
import logging
import threading

log = logging.getLogger(__name__)

_frozen: set[str] = set()
_lock = threading.Lock()


def freeze_startup_objects(moment: str) -> None:
    """Hides every object alive now from the collector, the first time ``moment`` is reached
    in this process (e.g. "hot path loaded", "Spark ready"; a resident worker's "ready")."""
    with _lock:
        if moment in _frozen:
            return
        _frozen.add(moment)
        gc.freeze()
    log.debug("%s: %d start-up objects kept out of full garbage collections", moment, gc.get_freeze_count())
