"""How late a timed wait of ours may end: Linux lets a thread's sleeps and timed waits run over
by its *timer slack* (50 µs by default) so that the kernel can batch wake-ups. At a trickle the
agent paces itself by waits of a fraction of a millisecond (when to take the next chained slice,
when a micro-batch is due), and on this project's reference VM a 0.5 ms sleep ended 76 µs late
at the median with the default slack and 26 µs late with 1 µs (docs/hot-path.md, "Timer
slack"). A point waits out each of those overruns.

The slack is per thread and inherited by the threads a thread starts, so it is set once, early
in the process, before any of ours exist. Elsewhere than Linux there is nothing to set.
"""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger(__name__)

# What our threads' timed waits may run over, in nanoseconds.
TIMER_SLACK_NS = 1_000
_PR_SET_TIMERSLACK = 29  # <linux/prctl.h>


def tighten_timer_slack() -> bool:
    """Sets the calling thread's timer slack (and so that of every thread it starts later) to
    ``TIMER_SLACK_NS``; whether it was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        failed = libc.prctl(_PR_SET_TIMERSLACK, ctypes.c_ulong(TIMER_SLACK_NS), 0, 0, 0) != 0
    except (OSError, AttributeError) as exc:  # no C library to call: the default slack stays
        log.debug("timer slack left as it was: %s", exc)
        return False
    if failed:
        log.debug("timer slack left as it was: prctl failed with errno %d", ctypes.get_errno())
    return not failed
