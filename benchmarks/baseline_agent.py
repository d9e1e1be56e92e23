"""A per-point UDF agent built the way Kapacitor's official Python agent works.

    python benchmarks/baseline_agent.py echo|moving_avg

One reader thread reads stdin through a buffered file (the varint length one
byte at a time, then the body), parses each Request with protobuf, answers
Info, Init and keepalives itself and calls the handler once per point; the
handler builds one Response per point and writes it under a lock to buffered
stdout, flushed after every response (Kapacitor's sample configuration runs
Python agents with ``-u``, where every write reaches the pipe at once).

Deliberately a little kinder than the official agent, so ratios against it are
not inflated: a fresh Request per frame (the official agent reuses one, which
grows without bound in memory and runs slower) and one flush per response
instead of one unbuffered write per varint byte.

Only the project's generated protobuf module (the wire schema) is used.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import BinaryIO

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from udf_agent import udf_pb2  # noqa: E402  (the wire schema only)
from udf_agent.wire.frames import encode_varint  # noqa: E402

log = logging.getLogger("baseline_agent")


class EndOfInput(Exception):
    pass


def read_uvarint32(stream: BinaryIO) -> int:
    """One varint read byte by byte from a buffered stream, as the official agent reads lengths."""
    result = 0
    shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise EndOfInput
        value = byte[0]
        result |= (value & 0x7F) << shift
        if value < 0x80:
            return result & 0xFFFFFFFF
        shift += 7
        if shift >= 32:
            raise ValueError("varint longer than a 32-bit length")


class Agent:
    """Reads requests on one thread and hands points to ``handler``; writes are serialised by a lock."""

    def __init__(self, stdin: BinaryIO, stdout: BinaryIO):
        self._in = stdin
        self._out = stdout
        self._write_lock = threading.Lock()
        self.handler: Handler | None = None

    def write_response(self, response: udf_pb2.Response) -> None:
        data = response.SerializeToString()
        with self._write_lock:
            self._out.write(encode_varint(len(data)))
            self._out.write(data)
            self._out.flush()

    def run(self) -> None:
        reader = threading.Thread(target=self._read_loop, name="reader")
        reader.start()
        reader.join()
        self._out.close()

    def _read_loop(self) -> None:
        assert self.handler is not None
        handler = self.handler
        kind = "unknown"
        while True:
            try:
                size = read_uvarint32(self._in)
                request = udf_pb2.Request()
                request.ParseFromString(self._in.read(size))
                kind = request.WhichOneof("message")
                if kind == "point":
                    handler.point(request.point)
                elif kind == "keepalive":
                    self.write_response(udf_pb2.Response(keepalive=udf_pb2.KeepaliveResponse(time=request.keepalive.time)))
                elif kind == "info":
                    self.write_response(handler.info())
                elif kind == "init":
                    self.write_response(handler.init(request.init))
                elif kind == "snapshot":
                    self.write_response(udf_pb2.Response(snapshot=udf_pb2.SnapshotResponse(snapshot=b"")))
                elif kind == "restore":
                    self.write_response(udf_pb2.Response(restore=udf_pb2.RestoreResponse(success=True)))
                else:
                    raise ValueError(f"{kind} is not supported by a stream agent")
            except EndOfInput:
                return
            except Exception as exc:
                log.exception("request of type %s failed", kind)
                self.write_response(udf_pb2.Response(error=udf_pb2.ErrorResponse(error=f"error processing request of type {kind}: {exc}")))
                return


class Handler:
    def __init__(self, agent: Agent):
        self.agent = agent

    def info(self) -> udf_pb2.Response:
        response = udf_pb2.Response()
        response.info.wants = udf_pb2.STREAM
        response.info.provides = udf_pb2.STREAM
        return response

    def init(self, request: udf_pb2.InitRequest) -> udf_pb2.Response:
        return udf_pb2.Response(init=udf_pb2.InitResponse(success=True))

    def point(self, point: udf_pb2.Point) -> None:
        raise NotImplementedError


class EchoHandler(Handler):
    """Returns every point unchanged."""

    def point(self, point: udf_pb2.Point) -> None:
        response = udf_pb2.Response()
        response.point.CopyFrom(point)
        self.agent.write_response(response)


class MovingAverageHandler(Handler):
    """Per group, the mean of the last min(n, size) values of ``field``, as the double field ``as``."""

    def __init__(self, agent: Agent):
        super().__init__(agent)
        self.field = ""
        self.size = 0
        self.output = "avg"
        self.windows: dict[str, deque[float]] = {}

    def info(self) -> udf_pb2.Response:
        response = super().info()
        response.info.options["field"].valueTypes.append(udf_pb2.STRING)
        response.info.options["size"].valueTypes.append(udf_pb2.INT)
        response.info.options["as"].valueTypes.append(udf_pb2.STRING)
        return response

    def init(self, request: udf_pb2.InitRequest) -> udf_pb2.Response:
        for option in request.options:
            if option.name == "field":
                self.field = option.values[0].stringValue
            elif option.name == "size":
                self.size = option.values[0].intValue
            elif option.name == "as":
                self.output = option.values[0].stringValue
        problems = []
        if not self.field:
            problems.append("field is required")
        if self.size <= 0:
            problems.append("size must be > 0")
        if not self.output:
            problems.append("as must not be empty")
        return udf_pb2.Response(init=udf_pb2.InitResponse(success=not problems, error="; ".join(problems)))

    def point(self, point: udf_pb2.Point) -> None:
        window = self.windows.get(point.group)
        if window is None:
            window = self.windows[point.group] = deque(maxlen=self.size)
        window.append(point.fieldsDouble[self.field])
        response = udf_pb2.Response()
        out = response.point
        out.CopyFrom(point)
        out.ClearField("fieldsDouble")
        out.ClearField("fieldsInt")
        out.ClearField("fieldsString")
        out.ClearField("fieldsBool")
        # Each window summed afresh (not a running mean), like the project's moving_avg.
        out.fieldsDouble[self.output] = sum(window) / len(window)
        self.agent.write_response(response)


HANDLERS: dict[str, Callable[[Agent], Handler]] = {"echo": EchoHandler, "moving_avg": MovingAverageHandler}


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if len(argv) != 1 or argv[0] not in HANDLERS:
        log.error("usage: baseline_agent.py %s", "|".join(HANDLERS))
        return 2
    agent = Agent(sys.stdin.buffer, sys.stdout.buffer)
    agent.handler = HANDLERS[argv[0]](agent)
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
