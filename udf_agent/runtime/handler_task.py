"""A Kapacitor Handler script's task, on the agent's compute thread: each micro-batch of its
requests goes to its handler where it lives (``Engine.run_handler``: a resident Spark worker),
and what the handler wrote goes out as it came back, in order.

The handler's own ``snapshot()`` is asked for every few seconds, so that a lost worker (or a
new shared server, from a checkpoint) rebuilds it from that snapshot and the few requests
since: ``compute.handlers.HandlerLog``.
"""

from __future__ import annotations

import logging
import time

from udf_agent.api import HandlerScript
from udf_agent.compute.engine import Engine, Tenant
from udf_agent.compute.handlers import HandlerCall, HandlerLog, HandlerOutcome
from udf_agent.errors import first_line
from udf_agent.wire.batches import HandlerMicroBatch

log = logging.getLogger(__name__)


class HandlerFailed(Exception):
    """The handler raised, or could not run: the message is the task's ErrorResponse."""


class HandlerTask:
    def __init__(self, script: HandlerScript):
        self.script = script
        self.log = HandlerLog()
        self.where = ""

    def compute(self, batch: HandlerMicroBatch, engine: Engine, tenant: Tenant) -> HandlerOutcome:
        """What the handler wrote for ``batch``'s requests; HandlerFailed if it raised (its
        output before the exception is in ``HandlerFailed.args[1]``)."""
        call = self.log.call(self.script, batch.frames(), time.monotonic(), init=batch.init_frame)
        outcome = self._run(call, engine, tenant)
        if outcome.error is not None:
            raise HandlerFailed(outcome.error, outcome.output)
        self.log.ran(call, outcome, time.monotonic())
        return outcome

    def checkpoint(self, engine: Engine, tenant: Tenant) -> bytes:
        """What rebuilds the handler elsewhere, as of now; the handler's own snapshot is
        taken first so that little replay is carried."""
        if self.log.snapshots_work and self.log.replay:
            call = self.log.call(self.script, b"", time.monotonic(), force_snapshot=True)
            outcome = self._run(call, engine, tenant)
            if outcome.error is None:
                self.log.ran(call, outcome, time.monotonic())
        return self.log.checkpoint()

    def adopt(self, checkpoint: bytes) -> None:
        self.log.adopt(checkpoint)

    def end(self, engine: Engine) -> None:
        """The task ended: its handler is let go."""
        engine.forget_handler(self.log.task)

    def _run(self, call: HandlerCall, engine: Engine, tenant: Tenant) -> HandlerOutcome:
        try:
            outcome = engine.run_handler(call, tenant)
        except Exception as exc:
            log.exception("the handler of %s could not run", self.script.name)
            raise HandlerFailed(f"udf-agent could not run the handler of {self.script.name}: {first_line(exc)}", b"") from exc
        self.where = outcome.where
        for line in outcome.printed.splitlines():
            log.info("%s printed: %s", self.script.name, line)
        return outcome
