"""What the compute thread does next, in the order the input asked for it.

The queue's Condition is the agent's one lock: it also guards the session's protocol state,
which the reader acts on and the compute thread flushes, so that whatever closed a
micro-batch, it is queued in input order. Nothing here waits on the writer or on compute.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from udf_agent.runtime.events import Compute, Emit, Restore, TakeCheckpoint, TakeSnapshot


class Finish:
    """The end of the work: ``error`` goes out as the last frame, then the agent exits with ``code``."""

    def __init__(self, error: str | None = None, code: int = 1):
        self.error = error
        self.code = code if error is not None else 0


class InitReply:
    """The InitResponse, sent once the hot path has loaded (``loader`` ended, or a wait passed):
    in the work's order, so that no output of a later point goes before it. Kapacitor sends
    points only after it; a relay replaying a task to a new server does not wait."""

    def __init__(self, reply: bytes, loader: threading.Thread):
        self.reply = reply
        self.loader = loader


Work = Compute | Emit | TakeSnapshot | Restore | TakeCheckpoint | InitReply | Finish


class WorkQueue:
    """The work in order; each method but ``take`` is called holding ``cond``."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self._items: deque[Work] = deque()
        self._busy = False  # the compute thread holds an item
        self._computing = False  # ... and it is a micro-batch
        self._micro_batches = 0  # queued (a passthrough task may queue many frames to send, none of them)
        self._reader_waits = False  # the reader leaves input unread meanwhile (``reader_waits_while``)
        # When the compute thread, waiting for work, looks at the open micro-batch by itself;
        # -inf while it is not waiting.
        self._wakes_at = float("-inf")

    def put(self, item: Work) -> None:
        self._items.append(item)
        self._micro_batches += isinstance(item, Compute)

    def __bool__(self) -> bool:
        return bool(self._items)

    def idle(self) -> bool:
        """Nothing queued and nothing being worked on: output may go straight to the writer."""
        return not self._items and not self._busy

    def clear(self) -> None:
        self._items.clear()
        self._micro_batches = 0

    def points(self) -> int:
        """Points queued, computed or passed through."""
        return sum(item.batch.count if isinstance(item, Compute) else item.points for item in self._items if isinstance(item, (Compute, Emit)))

    def opened(self) -> list[float]:
        """When each queued micro-batch got its first point."""
        return [item.batch.opened_at for item in self._items if isinstance(item, Compute)]

    def computing(self) -> bool:
        """Whether a micro-batch is queued or being computed: input read now would wait for the next one."""
        return self._computing or self._micro_batches > 0

    def reader_waits_while(self, busy: Callable[[], bool], until: Callable[[], float]) -> None:
        """The reader's wait while ``busy()``, asked again once the compute thread has no
        micro-batch left to compute, until ``until()`` (monotonic, asked again at each wake) at
        most."""
        self._reader_waits = True
        try:
            while busy() and (left := until() - time.monotonic()) > 0:
                self.cond.wait(left)
        finally:
            self._reader_waits = False

    def reader_waits(self) -> bool:
        """Whether the reader is leaving input unread while a micro-batch computes."""
        return self._reader_waits

    def wake_for(self, due: float | None) -> None:
        """Wakes the compute thread if work is queued, or if the open micro-batch is ``due``
        before it would look by itself: under Kapacitor's feed a micro-batch gathers over many
        reads, and waking the thread for each costs CPU a point."""
        if self._items or (due is not None and due < self._wakes_at):
            self.cond.notify_all()

    def take_micro_batch_now(self, due: Callable[[float], float | None], close_due: Callable[[], None]) -> Compute | None:
        """The compute thread, with a micro-batch out on its engine, takes the next work now if
        that is a micro-batch: queued, or the open one if ``due`` now (``close_due`` closes it).
        Never past other work, whose order the input set. None if there is no such micro-batch."""
        with self.cond:
            if not self._items:
                deadline = due(time.monotonic())
                if deadline is None or time.monotonic() < deadline:
                    return None
                close_due()
            if not self._items or not isinstance(self._items[0], Compute):
                return None
            item = self._items.popleft()
            assert isinstance(item, Compute)
            self._micro_batches -= 1
            self._wake_reader()
            return item

    def take(self, due: Callable[[float], float | None], close_due: Callable[[], None], abandoned: Callable[[], bool]) -> Work:
        """The compute thread's next item: waits for one, closing the open micro-batch
        (``close_due``) once ``due`` says it is time; Finish once the work is ``abandoned``.
        The reader gathering input is woken when there is nothing to compute (then the input
        it left, if the compute thread did not read it ahead, is read now)."""
        with self.cond:
            self._busy = self._computing = False  # the previous item is done
            while not self._items:
                if abandoned():
                    return Finish()
                now = time.monotonic()
                deadline = due(now)
                if deadline is not None and now >= deadline:
                    close_due()
                    continue
                if self._reader_waits:
                    self.cond.notify_all()  # nothing to compute: the reader reads again
                # With nothing open, the reader wakes this thread for the next micro-batch.
                self._wakes_at = float("inf") if deadline is None else deadline
                self.cond.wait(None if deadline is None else deadline - now)
                self._wakes_at = float("-inf")
            item = self._items.popleft()
            self._busy = True
            self._computing = isinstance(item, Compute)
            self._micro_batches -= self._computing
            self._wake_reader()
            return item

    def _wake_reader(self) -> None:
        """The compute thread took an item: that made room for a reader waiting for it. A
        reader gathering input (``reader_waits_while``) is left to wait while a micro-batch
        still computes: woken, it would only find that and wait again, having cost the compute
        thread a preemption and the GIL (caller holds the lock)."""
        if not (self._reader_waits and self.computing()):
            self.cond.notify_all()
