"""What a relay keeps to carry its task over to a new shared server, sans-IO.

The shared server checkpoints a relayed task (``relay_link.checkpoint_message``): its state as
of X bytes of its input, sent in its place among the task's output, so that every output frame
before it answers input before X and every one after it input after X. The relay keeps:

- the input it sent since the last checkpoint (bytes, as Kapacitor wrote them: no frame is
  cut on the way, so keeping it costs a copy, not a parse);
- the last checkpoint (the Init frame and the snapshot);
- how many output frames, keepalive replies aside, it passed to Kapacitor since then.

When the server dies, a new one gets the Init, a Restore of the snapshot and the input kept,
and recomputes the output after X. Kapacitor has seen some of it: the first frames, as many
as were passed since the checkpoint, are dropped, and so are the replies to the Init and
Restore the relay made up; the rest goes on to Kapacitor. Each output is seen once; a UDF
that is not deterministic may compute the dropped ones differently, which nobody sees, and
the ones after differently from an uninterrupted run.

Without a checkpoint yet, the new server gets all the input from the start (Info and Init
included) and every reply Kapacitor saw is dropped the same way.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from udf_agent.wire.frames import ERROR_KEY, INIT_KEY, KEEPALIVE_KEY, RESTORE_KEY, ProtocolError, frame_spans, read_varint
from udf_agent.wire.keepalives import keepalive_request_time

if TYPE_CHECKING:  # the relay's input side imports this at its first moment: only what it needs
    from udf_agent.serve.relay_link import Checkpoint


class CarryOverError(Exception):
    """The new server would not take the task back: the message says why."""


class KeptInput:
    """Input bytes in the chunks they were read in: keeping more never copies what is kept
    (one growing buffer copied all of it, up to MAX_KEPT_INPUT, at each reallocation, while
    the relay's input thread held the GIL), and letting go of the front drops whole chunks."""

    def __init__(self) -> None:
        self._chunks: deque[bytes | memoryview] = deque()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def append(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._size += len(data)

    def drop_front(self, size: int) -> None:
        """Lets go of the first ``size`` bytes."""
        self._size -= size
        while size:
            first = self._chunks[0]
            if len(first) > size:
                self._chunks[0] = memoryview(first)[size:]
                return
            self._chunks.popleft()
            size -= len(first)

    def tail(self, start: int) -> bytes:
        """The bytes kept from ``start`` on, as one."""
        pieces: list[bytes | memoryview] = []
        for chunk in self._chunks:
            if start >= len(chunk):
                start -= len(chunk)
                continue
            pieces.append(memoryview(chunk)[start:] if start else chunk)
            start = 0
        return b"".join(pieces)


class CarryOver:
    def __init__(self) -> None:
        self._input = KeptInput()  # sent since the checkpoint
        self._input_base = 0  # where ``_input`` starts in Kapacitor's input
        self._checkpoint: Checkpoint | None = None
        self._passed = 0  # frames Kapacitor saw after the checkpoint
        self._to_drop = 0  # recomputed frames Kapacitor saw already
        self._made_up: list[int] = []  # replies to our own requests, to check and drop
        self._shift = 0  # a position in this server's input, less this, is one in Kapacitor's
        self._head = 0  # bytes the relay put before Kapacitor's input to this server
        self.checkpoints = 0

    @property
    def kept_input(self) -> int:
        """Bytes of input kept for a carry-over (sent since the last checkpoint)."""
        return len(self._input)

    @property
    def catching_up(self) -> bool:
        """Whether output Kapacitor saw is still being recomputed (and dropped)."""
        return bool(self._made_up or self._to_drop)

    def sent(self, data: bytes) -> None:
        """``data`` of Kapacitor's input went (or is going) to the server."""
        self._input.append(data)

    def checkpointed(self, checkpoint: Checkpoint) -> None:
        """The server's checkpoint, read in its place among the output."""
        if checkpoint.input_bytes < self._head:
            return  # before our Init and Restore were acted on: not a state of this task
        covered = checkpoint.input_bytes - self._shift - self._input_base
        if covered < 0 or covered > len(self._input):
            raise CarryOverError(f"a checkpoint at {checkpoint.input_bytes} bytes of input is outside what was sent ({self._input_base}-{self._input_base + len(self._input)})")
        self._input.drop_front(covered)
        self._input_base += covered
        self._checkpoint = checkpoint
        self._passed = self._to_drop  # seen already: they follow the checkpoint too
        self.checkpoints += 1

    def passed(self, frames: bytes, counted: int) -> bytes:
        """Output frames from the server in, ``counted`` of them not keepalive replies (the
        server counted them); the ones Kapacitor gets out (all of them, but while catching up),
        counting what Kapacitor saw. CarryOverError if the new server refused the Init or
        Restore the relay made up."""
        if not self.catching_up:
            self._passed += counted
            return frames
        out = bytearray()
        for start, body, end in frame_spans(frames):  # whole frames
            frame = frames[start:end]
            first = frames[body] if body < min(end, len(frames)) else -1
            if first in (ERROR_KEY, KEEPALIVE_KEY):
                # An error is never dropped: the task is ending, and Kapacitor must know why.
                # Keepalive replies are not counted; one to a replayed request is a harmless extra.
                out += frame
            elif first in self._made_up:  # replies are matched by type: they come in any order
                self._made_up.remove(first)
                _check_reply(first, frame)
            elif self._to_drop:
                self._to_drop -= 1
            else:
                out += frame
                self._passed += 1
        return bytes(out)

    def replay(self, restore_frame: bytes) -> bytes:
        """What a new server gets first: the Init and a Restore of the checkpoint (with
        ``restore_frame`` made of its snapshot), then the input since; from now on what it
        sends is read as the recomputation. Input that comes meanwhile is ``sent`` after it."""
        head = b""
        self._made_up = []
        if self._checkpoint is not None:
            head = self._checkpoint.init_frame + restore_frame
            self._made_up = [INIT_KEY, RESTORE_KEY]
        self._to_drop = self._passed
        self._head = len(head)
        self._shift = len(head) - self._input_base
        return head + self._input.tail(0)

    def keepalive_requests(self, start: int) -> tuple[list[int], int]:
        """The times of the KeepaliveRequests in the whole frames of the input kept from
        ``start`` (a frame's start: kept input begins at one), and where the next frame starts."""
        times = []
        data = self._input.tail(start)
        end = 0
        for frame_start, body, frame_end in frame_spans(data):
            if frame_end > len(data):
                break  # not whole yet
            end = frame_end
            if frame_end > body and data[body] == KEEPALIVE_KEY:
                times.append(_keepalive_time(data[frame_start:frame_end]))
        return times, start + end

    def since(self, mark: int) -> bytes:
        """Input kept past ``mark`` bytes (of what is kept now): what came during a replay."""
        return self._input.tail(mark)

    @property
    def snapshot(self) -> bytes | memoryview | None:
        return None if self._checkpoint is None else self._checkpoint.snapshot


def _check_reply(expected: int, frame: bytes) -> None:
    """The reply to the Init or Restore the relay made up: a refusal ends the carry-over."""
    from udf_agent import udf_pb2  # protobuf, only on a carry-over

    response = udf_pb2.Response()
    response.ParseFromString(_body(frame))
    kind = response.WhichOneof("message")
    wanted = "init" if expected == INIT_KEY else "restore"
    if kind != wanted:
        raise CarryOverError(f"the new server answered {kind!r} to the {wanted} that starts the task again")
    answer = getattr(response, kind)
    if not answer.success:
        raise CarryOverError(f"the new server refused the task's {wanted}: {answer.error}")


def _keepalive_time(frame: bytes) -> int:
    """KeepaliveRequest.time of a Request frame holding one (0 where it is unreadable: the
    server that takes the input says what is wrong with it)."""
    try:
        return keepalive_request_time(_body(frame))
    except ProtocolError:
        return 0


def _body(frame: bytes) -> bytes:
    """A whole frame's body: what follows its length varint."""
    return frame[read_varint(frame, 0)[1] :]
