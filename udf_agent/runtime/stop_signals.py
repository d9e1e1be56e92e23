"""SIGTERM and SIGINT: the first asks for an orderly drain, a second exits at once."""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("udf_agent")


def on_stop_signals(stop: Callable[[str], None], what_follows: str) -> None:
    """The first SIGTERM or SIGINT logs that it came and ``what_follows``, then calls
    ``stop`` with a reason naming the signal; a second exits at once (128 + its number)."""
    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if received:
            log.warning("second %s: exiting now, without draining", name)
            sys.stderr.flush()
            os._exit(128 + signum)
        received.append(signum)
        log.warning("%s received: %s (send it again to exit at once)", name, what_follows)
        stop(f"udf-agent stopped: received {name}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handle)
