"""What the runtime needs of a byte pipe to Kapacitor, whatever the transport."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

Deadline = Callable[[], "float | None"]

# The most ``write_now`` writes: a pipe takes a write of up to PIPE_BUF (4096 on Linux) whole
# or not at all, and a unix socket one that fits a single buffer the same way.
ATOMIC_WRITE = 4096


class WriteTimeout(OSError):
    """Output was not written by the writer's deadline; ``written`` bytes of it were."""

    def __init__(self, written: int):
        super().__init__(f"output not written by the deadline ({written} byte(s) of it were)")
        self.written = written


class Connection(Protocol):
    """A byte pipe to Kapacitor: stdin/stdout or one unix socket connection."""

    def read_into(self, buffer: memoryview) -> int:
        """Reads what has come, up to ``len(buffer)`` bytes, into ``buffer``; 0 at end of input.
        One buffer reused for every read: a fresh bytes object of the read's size (MBs) costs
        a mapping of memory and its page faults on every read."""

    def read_ready_into(self, buffer: memoryview) -> int | None:
        """Reads what has come without waiting for more: None if nothing has (or the read
        side was aborted, or broke: the blocking ``read_into`` reports those), else the
        bytes read, 0 at end of input."""

    def input_waiting(self, within: float = 0.0) -> bool:
        """Whether input (or its end) is waiting to be read, or comes ``within`` seconds, seen
        without reading: when none is after a read, the peer's writes have paused."""

    def write(self, data: bytes | bytearray, deadline: Deadline = ...) -> None:
        """Writes all of ``data``; raises WriteTimeout once ``deadline()`` (a monotonic time, read afresh) passes."""

    def write_now(self, data: bytes) -> bool:
        """Writes ``data`` whole, if it is at most ``ATOMIC_WRITE`` bytes and the peer has room
        for it now; else writes nothing. Whether it wrote."""

    def close_write(self) -> None: ...

    def abort_read(self) -> None: ...

    def limit_unread_input(self, size: int) -> None:
        """Lets the peer queue about ``size`` bytes we have not read yet (where the transport can)."""

    def input_closed(self) -> bool:
        """Whether the peer has closed its side, seen without reading (input may still be buffered)."""
