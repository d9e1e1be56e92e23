"""The session's input: bytes as read, cut into the frames it acts on, in order, sans-IO.

A fault in the framing is held until the frames cut before it are taken: what was accepted
before a violation is still acted on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from udf_agent.wire.frames import FrameSplitter, Piece, PointRun, ProtocolError, RequestRun, varint_size


class FramedInput:
    def __init__(self, max_frame_size: int):
        self._splitter = FrameSplitter(max_frame_size)
        self._compiled_splitter: Callable[[FrameSplitter], FrameSplitter] | None = None
        self._pieces: deque[Piece] = deque()
        self._error: ProtocolError | None = None
        self._error_told = False
        self.frames_taken = 0
        self.bytes_taken = 0  # of whole frames, length prefixes included

    def use_compiled_splitter(self, continuing: Callable[[FrameSplitter], FrameSplitter]) -> None:
        """Cuts frames with the compiled scanner from the next ``feed`` on (it takes over
        mid-frame). Safe to call from another thread, which is where it loads."""
        self._compiled_splitter = continuing

    def feed(self, data: bytes | memoryview) -> None:
        """Bytes as read, cut anywhere; nothing past a framing fault is read."""
        if self._error is not None:
            return
        if self._compiled_splitter is not None:
            self._splitter = self._compiled_splitter(self._splitter)
            self._compiled_splitter = None
        try:
            pieces = self._splitter.feed(data)
        except ProtocolError as exc:
            pieces, self._error = exc.decoded, exc
        self._pieces.extend(pieces)

    def __len__(self) -> int:
        """Frames (or runs of them) cut and not taken yet."""
        return len(self._pieces)

    def take(self) -> Piece:
        """The next frame (a message without its length prefix) or run of frames, counted."""
        piece = self._pieces.popleft()
        if isinstance(piece, (PointRun, RequestRun)):
            self.frames_taken += piece.count
            self.bytes_taken += len(piece.frames)
        else:
            self.frames_taken += 1
            self.bytes_taken += len(piece) + varint_size(len(piece))
        return piece

    def drop(self) -> None:
        """The session failed: what is left is never acted on."""
        self._pieces.clear()

    @property
    def broken(self) -> bool:
        """Whether the bytes broke the framing (nothing after the fault is read)."""
        return self._error is not None

    def fault(self) -> ProtocolError | None:
        """The framing fault, once: when every frame before it has been taken."""
        if self._pieces or self._error is None or self._error_told:
            return None
        self._error_told = True
        return self._error

    def close(self) -> None:
        """End of input: ProtocolError if a frame was left unfinished."""
        self._splitter.close()
