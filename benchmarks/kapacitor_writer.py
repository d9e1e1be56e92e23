#!/usr/bin/env python3
"""The writer of ``kapacitor_feed.py``, a process of its own as Kapacitor's writer goroutine
runs beside its reader: a writer thread next to the reader in one Python process would take
turns with it for the GIL, slowing the feed most for an agent whose output comes in many small
writes.

    kapacitor_writer.py FD WORKLOAD_FILE FRAME_LENGTH POINTS

Writes every point frame of WORKLOAD_FILE to FD as two writes (its length varint, then its
body), a keepalive (as two writes too) every 10 ms between points, and prints as JSON when the
first point was written and when each keepalive was (``time.monotonic()``, the same clock in
every process of a host).
"""

from __future__ import annotations

import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

from benchmarks.workload import keepalive_frame, varint_length  # noqa: E402

KEEPALIVE_INTERVAL = 0.010
KEEPALIVE_BASE = 1_000_000


def write_as_kapacitor(fd: int, frames: bytes, frame_length: int, points: int) -> dict[str, object]:
    view = memoryview(frames)
    prefix = varint_length(view)
    sent: dict[int, float] = {}
    started = time.monotonic()
    next_keepalive = started + KEEPALIVE_INTERVAL
    for offset in range(0, points * frame_length, frame_length):
        os.write(fd, view[offset : offset + prefix])
        os.write(fd, view[offset + prefix : offset + frame_length])
        now = time.monotonic()
        if now >= next_keepalive:
            stamp = KEEPALIVE_BASE + len(sent)
            keepalive = keepalive_frame(stamp)
            split = varint_length(keepalive)
            sent[stamp] = time.monotonic()
            os.write(fd, keepalive[:split])
            os.write(fd, keepalive[split:])
            next_keepalive = now + KEEPALIVE_INTERVAL
    return {"started": started, "keepalives": sent}


def main(argv: list[str]) -> int:
    fd, path, frame_length, points = int(argv[0]), argv[1], int(argv[2]), int(argv[3])
    with open(path, "rb") as source:
        frames = source.read(frame_length * points)
    print(json.dumps(write_as_kapacitor(fd, frames, frame_length, points)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
