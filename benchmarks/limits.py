"""What any per-point Python path can reach on this machine, timed in-process on the cached frames.

``framing`` only splits the stream into frames (a tight varint loop over
4 MiB reads); ``parse`` also parses every Request with protobuf and
re-serialises its point into a Response frame, the least a per-point agent does.
"""

from __future__ import annotations

import time

from benchmarks.framing import count_frames_in_file, frames_in_file
from benchmarks.workload import Workload
from udf_agent.wire.frames import encode_varint

# Varint prefixes of every length a point frame can have, looked up instead of encoded.
_PREFIXES = [encode_varint(n) for n in range(1 << 14)]


def framing_pps(workload: Workload) -> float:
    path = workload.path()
    started = time.perf_counter()
    frames = count_frames_in_file(path)
    elapsed = time.perf_counter() - started
    if frames != workload.points:
        raise AssertionError(f"split {frames:,} frames from {workload.points:,} points")
    return frames / elapsed


def parse_pps(workload: Workload) -> float:
    from udf_agent import udf_pb2

    path = workload.path()
    request_from = udf_pb2.Request.FromString
    response = udf_pb2.Response
    prefixes = _PREFIXES
    points = 0
    started = time.perf_counter()
    for data, spans in frames_in_file(path):
        out: list[bytes] = []
        for start, end in spans:
            # A fresh message per frame: a reused one keeps growing under upb.
            body = response(point=request_from(data[start:end]).point).SerializeToString()
            out.append(prefixes[len(body)] if len(body) < 1 << 14 else encode_varint(len(body)))
            out.append(body)
            points += 1
        b"".join(out)  # what a writer would hand to one write()
    elapsed = time.perf_counter() - started
    if points != workload.points:
        raise AssertionError(f"parsed {points:,} points from {workload.points:,}")
    return points / elapsed
