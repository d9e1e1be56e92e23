"""What a session tells the runtime to do: the events of ``Session.next_events`` and its
other methods, acted on by the agent's reader (``inbox.Inbox.dispatch``) and compute thread."""

from __future__ import annotations

from dataclasses import dataclass

from udf_agent.options import OptionValues
from udf_agent.wire.batches import BatchMicroBatch, HandlerMicroBatch, StreamMicroBatch


@dataclass(frozen=True)
class Send:
    """A frame to write now; urgent frames (keepalives) jump ahead of data."""

    frame: bytes
    urgent: bool = False
    asked_at: int | None = None  # a keepalive answer: the time Kapacitor stamped it with (ns)


@dataclass(frozen=True)
class Emit:
    """Output data, in order with the output of the micro-batches before it."""

    frames: bytes
    points: int = 1  # how many points it carries (they count against the pending budget)


@dataclass(frozen=True)
class Started:
    """Init succeeded: the runtime warms up, then sends ``reply`` (the InitResponse).

    Kapacitor sends no point before the InitResponse, so answering once the hot
    path is loaded costs one wait at task start instead of slow first points.
    """

    options: OptionValues
    reply: bytes | None  # None: a Handler script's handler makes it
    task_id: str = ""
    node_id: str = ""


@dataclass(frozen=True)
class Compute:
    """A closed micro-batch, to be computed in arrival order."""

    batch: StreamMicroBatch | BatchMicroBatch | HandlerMicroBatch


@dataclass(frozen=True)
class TakeSnapshot:
    """Reply to a SnapshotRequest once everything before it is computed."""


@dataclass(frozen=True)
class Restore:
    snapshot: bytes


@dataclass(frozen=True)
class TakeCheckpoint:
    """A relayed task's state once everything before it is computed, for its relay to carry
    the task over to a new server: as of ``input_bytes`` bytes of input, each frame acted on."""

    input_bytes: int
    init_frame: bytes  # the task's InitRequest, to start it afresh


@dataclass(frozen=True)
class Fail:
    """The peer broke the protocol: the task must end with this error."""

    message: str


Event = Send | Emit | Started | Compute | TakeSnapshot | Restore | TakeCheckpoint | Fail
