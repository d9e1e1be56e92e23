"""What a task's agent is told: the options of 'run' and 'serve' that shape micro-batches,
backpressure, failures and the drain."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from udf_agent.runtime.flushing import GATHER
from udf_agent.wire.frames import DEFAULT_MAX_FRAME_SIZE


@dataclass
class AgentConfig:
    max_batch_points: int = 50_000
    flush_interval: float = 0.5
    max_frame_size: int = DEFAULT_MAX_FRAME_SIZE
    # Points accepted but not yet computed before the reader stops reading:
    # enough to ride out Spark's start-up and slow micro-batches at full rate.
    max_pending_points: int = 500_000
    # Groups whose history and state are kept; past it the least recently seen are dropped.
    max_groups: int = 1_000_000
    # What a failing UDF call does: "fail" the task (Kapacitor's convention), "skip" the
    # failed groups' points (logged and counted), or "dead-letter" them into dead_letter_dir.
    on_error: str = "fail"
    dead_letter_dir: str | None = None
    # After input ends (EOF, SIGTERM) accepted work is computed and written for
    # at most this long: Kapacitor waits for the UDF's exit without limit.
    drain_timeout: float = 5.0
    # An idle compute side takes what is buffered at once; without this, points
    # wait for flush_interval or max_batch_points.
    adaptive_flush: bool = True
    # How long an adaptive flush lets a micro-batch gather while points flow in fast.
    gather: float = GATHER
    # Module prefixes stream_fn and batch_fn may import besides what PYTHONPATH holds (--allow-module).
    allow_modules: tuple[str, ...] = ()

    @classmethod
    def from_options(cls, options: dict[str, Any]) -> AgentConfig:
        """From options named after its fields, ``on_error`` as (policy, dead-letter directory):
        the command line's, or those a relay's handshake carries to the shared server."""
        policy, directory = options["on_error"]
        own = {name: value for name, value in options.items() if name not in ("on_error", "allow_modules")}
        # A handshake carries a list (JSON), and a launch remembered by an earlier version none.
        return cls(**own, on_error=policy, dead_letter_dir=directory, allow_modules=tuple(options.get("allow_modules", ())))
