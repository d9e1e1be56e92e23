"""The shared server's output to a task's relay: whole Kapacitor frames in length-prefixed chunks.

The relay passes Kapacitor whole frames only, so that a server that dies in the middle of a
write still leaves the task a well-formed last frame. Finding where frames end would cost the
relay a step per frame (a third of its CPU under Kapacitor's feed); the server knows already,
since each of its writes is whole frames. So each write goes out as one chunk behind its length,
and the relay passes on whole chunks without looking inside them.
"""

from __future__ import annotations

import struct

from udf_agent.runtime.connection import Deadline, WriteTimeout
from udf_agent.runtime.transports import SocketConnection, no_deadline

HEADER = struct.Struct("<Q")


class RelayedConnection(SocketConnection):
    """A task's connection from its relay: output leaves as chunks of whole frames."""

    def write(self, data: bytes, deadline: Deadline = no_deadline) -> None:
        """``data``, whole frames, as one chunk."""
        try:
            super().write(HEADER.pack(len(data)) + data, deadline)
        except WriteTimeout as exc:  # counted in frames' bytes, the header not included
            raise WriteTimeout(max(0, exc.written - HEADER.size)) from None


class ChunkSplitter:
    """Sans-IO, the relay's side: bytes as received in, the frames of the chunks they complete out."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self.last_chunk = b""  # the last whole chunk's frames: its last frame says how the task ended

    @property
    def buffered(self) -> int:
        """Bytes of a chunk not yet whole."""
        return len(self._buffer)

    def feed(self, data: bytes) -> bytes:
        """The frames of every chunk ``data`` completes, in order."""
        buffer = self._buffer
        buffer += data
        pos, size = 0, len(buffer)
        chunks: list[bytes] = []
        while size - pos >= HEADER.size:
            (length,) = HEADER.unpack_from(buffer, pos)
            end = pos + HEADER.size + length
            if end > size:
                break
            chunks.append(bytes(buffer[pos + HEADER.size : end]))
            pos = end
        del buffer[:pos]
        if chunks:
            self.last_chunk = chunks[-1]
        return b"".join(chunks)
