"""The only way out: every frame the agent sends is made or checked here (keepalive
replies, which need no protobuf, in ``wire/keepalives``).

Kapacitor crashes (the whole kapacitord, not only the task) on an empty
Response, an EndBatch with no open BeginBatch and a negative BeginBatch.size,
and it takes an unrequested Info/Init/Snapshot/Restore reply as the answer to
its next request of that type. Management replies pass ``OutputGuard``, which
knows what was asked; data frames are produced only by ``encode_points`` and
``encode_batch``, which by construction never emit those shapes.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable

from udf_agent import udf_pb2
from udf_agent.wire.frames import encode_frame, point_frame

log = logging.getLogger(__name__)

_ANSWERS = {"info", "init", "snapshot", "restore"}
_DATA = {"begin", "point", "end"}


class OutputGuard:
    """Admits a management reply only when Kapacitor is waiting for one of its type."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._awaited: Counter[str] = Counter()

    def expect(self, kind: str) -> None:
        """Records that a request of ``kind`` arrived and awaits its reply."""
        if kind in _ANSWERS:
            with self._lock:
                self._awaited[kind] += 1

    def reply(self, response: udf_pb2.Response) -> bytes | None:
        """The frame for a management reply, or None when sending it would harm Kapacitor."""
        kind = response.WhichOneof("message")
        if kind is None:
            log.error("internal error: refusing to send an empty Response")
            return None
        if kind in _DATA:
            raise ValueError("data frames are made by encode_points/encode_batch, not sent as replies")
        if kind in _ANSWERS:
            with self._lock:
                if self._awaited[kind] <= 0:
                    log.error("internal error: refusing to send an unrequested %s response", kind)
                    return None
                self._awaited[kind] -= 1
        return encode_frame(response)




def encode_points(points: Iterable[udf_pb2.Point]) -> bytes:
    """Frames for output points, each a Response whose only field is the point.

    The envelope is written around the point's own bytes: wrapping each point
    in a Response message would copy it first, and this is the output hot path.
    """
    return b"".join(point_frame(point.SerializeToString()) for point in points)


def encode_batch(
    *,
    name: str,
    group: str,
    tags: dict[str, str],
    tmax: int,
    by_name: bool,
    points: list[udf_pb2.Point],
) -> bytes:
    """Frames for one whole output batch: BeginBatch, its points, EndBatch."""
    begin = udf_pb2.BeginBatch(name=name, group=group, tags=tags, size=len(points), byName=by_name)
    end = udf_pb2.EndBatch(name=name, group=group, tags=tags, tmax=tmax, byName=by_name)
    return b"".join(
        [
            encode_frame(udf_pb2.Response(begin=begin)),
            encode_points(points),
            encode_frame(udf_pb2.Response(end=end)),
        ]
    )


def error_frame(message: str) -> bytes:
    """An ErrorResponse: it fails the task, so it is always the last frame sent."""
    return encode_frame(udf_pb2.Response(error=udf_pb2.ErrorResponse(error=message or "unknown error")))

