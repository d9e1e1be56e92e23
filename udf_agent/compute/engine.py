"""Where tasks run: the small interface every compute engine implements.

An engine takes the tasks of one micro-batch (an Arrow table of
``compute.contract.TASK_SCHEMA``) and returns one result row per task, an Arrow table of
``compute.contract.RESULT_SCHEMA``, in task order; a stream micro-batch's, the same packed
(``compute.packed``: no Arrow on a small micro-batch's way). ``start`` returns at once:
engines warm up in the background while the agent keeps answering Kapacitor.
Nothing heavy is imported here, so the Info path stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    # pyarrow and the compute module load only when a micro-batch is computed
    import pyarrow as pa

    from udf_agent.compute.contract import Job
    from udf_agent.compute.handlers import HandlerCall, HandlerHosts, HandlerOutcome
    from udf_agent.compute.packed import ResultColumns, StreamTasks


# The most a slice chained behind another may carry (``Engine.chain_stream``). It is sent while
# the worker may be writing the answer before it, which the agent reads only after: a slice
# larger than the link's buffers would wait for a worker that waits for the agent (both
# writing, neither reading) until the batch timeout.
CHAINED_SLICE_BYTES = 32 * 1024


class ComputeFailed(RuntimeError):
    """The engine computed a micro-batch and it failed for good: the UDF crashed a fresh worker
    after it had crashed one, or passed its memory limit. Computed again, it would take another
    worker down with it, perhaps one a neighbour's micro-batch needs: the caller does not."""


class EngineStartError(RuntimeError):
    """The engine cannot start (Spark unreachable, no Java): the message says why and what to
    do, and a traceback would add nothing to it."""


class Tenant(Protocol):
    """A task as an engine shared by many tasks sees it: slots are shared out per tenant,
    and its waits and holdings are counted here (the task's metrics and status)."""

    def slot_waited(self, seconds: float) -> None:
        """A part of its micro-batch waited ``seconds`` for a slot."""

    def slots_now(self, held: int) -> None:
        """It holds ``held`` slots from now on."""


class Engine(Protocol):
    @property
    def name(self) -> str:
        """Where its micro-batches are computed, for the logs."""

    def start(self) -> None: ...

    def ready(self) -> bool:
        """Whether ``run`` would start at once (not wait for the engine to start)."""

    def run(self, job: Job, tasks: pa.Table, tenant: Tenant | None = None) -> pa.Table:
        """Tasks of ``compute.contract.TASK_SCHEMA`` in, results of ``compute.RESULT_SCHEMA`` out,
        in task order; ``tenant``, the task whose they are, for an engine that shares slots."""

    def run_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None = None) -> ResultColumns:
        """``run`` of a stream micro-batch's slice, tasks and results packed (``compute.packed``):
        what the agent hands a stream task's engine."""

    def chain_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None, follow: Callable[[], StreamTasks | None]) -> Generator[ResultColumns, None, None]:
        """``run_stream`` of ``tasks``, then of each slice ``follow()`` gives, the results of each
        in turn: an engine that can sends the next slice while one computes (asking ``follow``
        then; None ends the chain), so a trickle's micro-batches do not wait for the agent's
        work between them. One that cannot gives ``tasks``' results alone, never asking.
        ``follow`` gives slices of at most ``CHAINED_SLICE_BYTES``."""

    def run_handler(self, call: HandlerCall, tenant: Tenant | None = None) -> HandlerOutcome:
        """A micro-batch of a Kapacitor Handler script's requests, fed to the task's handler
        where it lives (built there, or rebuilt, from ``call.rebuild`` when it is not)."""

    def forget_handler(self, task: str) -> None:
        """The task ended: its handler may be let go."""

    def stop(self) -> None: ...


class LocalEngine:
    """Runs tasks in this process: UDFs that compute nothing, and small micro-batches."""

    name = "in the agent"

    def __init__(self) -> None:
        self._handlers: HandlerHosts | None = None

    def start(self) -> None:
        pass

    def ready(self) -> bool:
        return True

    def run(self, job: Job, tasks: pa.Table, tenant: Tenant | None = None) -> pa.Table:
        from udf_agent.compute.run import compute_tasks

        return compute_tasks(job, tasks)

    def run_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None = None) -> ResultColumns:
        from udf_agent.compute.run import compute_stream

        return compute_stream(job, tasks)

    def chain_stream(self, job: Job, tasks: StreamTasks, tenant: Tenant | None, follow: Callable[[], StreamTasks | None]) -> Generator[ResultColumns, None, None]:
        # In this process, nothing would compute while the agent works: no chain.
        yield self.run_stream(job, tasks, tenant)

    def run_handler(self, call: HandlerCall, tenant: Tenant | None = None) -> HandlerOutcome:
        from udf_agent.compute.handlers import HandlerHosts

        if self._handlers is None:
            self._handlers = HandlerHosts()
        outcome = self._handlers.call(call, rebuild=call.task not in self._handlers)
        outcome.where = self.name
        return outcome

    def forget_handler(self, task: str) -> None:
        if self._handlers is not None:
            self._handlers.forget(task)

    def stop(self) -> None:
        pass
