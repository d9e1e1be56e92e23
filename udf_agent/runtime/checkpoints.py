"""A relayed task's checkpoints: when one is due, and where it goes.

The reader asks ``due`` as it reads and queues a ``TakeCheckpoint`` behind the input it covers;
the compute thread takes the state, sends it (``sink``) and says how long that took, which
spaces the next one (``took``). A task that is not relayed has none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from udf_agent.runtime.writer import LinkMessage

# A relayed task is checkpointed at most this often, and sooner once this much input has come
# since the last one: what its relay keeps to replay after a failover.
CHECKPOINT_INTERVAL = 5.0
CHECKPOINT_INPUT_BYTES = 16 * 1024 * 1024
# ... but a checkpoint that takes long (many groups) is taken no more than this share of the time.
CHECKPOINT_TIME_SHARE = 0.02


class CheckpointSink(Protocol):
    """Where a relayed task's checkpoints go: its link to the relay, which carries the task
    over to a new server if this one dies."""

    def checkpoint_message(self, input_bytes: int, init_frame: bytes, write_state: Callable[[bytearray], None]) -> LinkMessage:
        """The checkpoint's message, the state written into it by ``write_state``."""


class Checkpoints:
    """A relayed task's checkpoint schedule and sink. The reader calls ``due`` and ``queued``;
    the compute thread ``took`` (one float attribute crosses threads)."""

    def __init__(self, sink: CheckpointSink, now: float):
        self.sink = sink
        self.interval = CHECKPOINT_INTERVAL
        self._next_at = now + CHECKPOINT_INTERVAL
        self._input_bytes = 0  # input the last queued checkpoint covers

    def due(self, now: float, input_bytes: int) -> bool:
        """Whether a checkpoint of ``input_bytes`` of input is due: by time or by input."""
        return now >= self._next_at or input_bytes - self._input_bytes >= CHECKPOINT_INPUT_BYTES

    def queued(self, now: float, input_bytes: int) -> None:
        """A checkpoint of ``input_bytes`` of input was queued: the next is an interval away."""
        self._input_bytes = input_bytes
        self._next_at = now + self.interval

    def took(self, seconds: float) -> None:
        """A checkpoint took ``seconds`` to take and send: the interval keeps that share small."""
        self.interval = max(CHECKPOINT_INTERVAL, seconds / CHECKPOINT_TIME_SHARE)
