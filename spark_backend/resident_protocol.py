"""Messages between the agent and its resident workers, over a unix socket on the agent's host,
else TLS over TCP (``worker_channel.py``); both ways (``Link``).

A header (kind: 1 byte, payload length: 8 bytes; ``udf_agent/wire/links.py``), then the payload. The job (the UDF and its
options) travels once per worker, pickled by Spark's own cloudpickle as Spark ships any pandas
UDF, keyed by a digest of its pickle. A stream micro-batch's tasks and results travel packed
(``compute/packed.py``: lengths, then bytes); a Kapacitor batch's as one Arrow IPC record batch
message each, without a schema: both ends know the compute contract's (``columns.table_message``). A Kapacitor
Handler script's requests travel as HANDLER (a JSON header, then its byte strings one after
another), what its handler wrote as RESULT in the same shape.
"""

from __future__ import annotations

import json
import math
import os
import select
import socket
import ssl
import struct
import time
import traceback
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

from spark_backend.worker_channel import connect_tls
from udf_agent.wire.links import HEADER, LENGTH

if TYPE_CHECKING:
    import pyarrow as pa

    from udf_agent.compute.handlers import HandlerCall, HandlerOutcome

# HELLO, WELCOME and PROOF: the worker and the agent prove to each other that they hold the
# task's random token, by challenge and response (``worker_channel``); JOB, TASKS
# and STREAM_TASKS carry the job key first. A RESULT answers TASKS with a result table; a
# STREAM_RESULT answers STREAM_TASKS with packed result columns behind when the worker took the
# tasks in and when it answered (``stream_result``). OVER_MEMORY is a worker's last word: it
# passed its memory limit while computing, and exits.
HELLO, WELCOME, JOB, TASKS, RESULT, FAILURE, OVER_MEMORY, HANDLER, STREAM_TASKS, STREAM_RESULT, PROOF = range(1, 12)
JOB_KEY_BYTES = 16
# A STREAM_RESULT's first bytes: the worker's CLOCK_MONOTONIC (ns) when it had read the tasks
# and when it answered. Their difference is the slice's time on the worker wherever it runs;
# the times themselves are the agent's own clock too when both run on one kernel (``clock_id``).
COMPUTED = struct.Struct("<QQ")

# Jobs a worker keeps unpickled (one per UDF and options; `serve` may have many).
KEPT_JOBS = 64

# Frames of a worker's traceback told in its FAILURE message's first line.
FAILURE_FRAMES = 3

Value = TypeVar("Value")


class WorkerAddress(NamedTuple):
    """Where a resident worker reaches its agent: the agent's port, TLS pinned to the
    certificate whose SHA-256 is ``fingerprint``, or on the agent's own host its unix socket
    (``path``) when the worker can see it."""

    host: str
    port: int
    fingerprint: str
    path: str | None = None

    def connect(self) -> socket.socket:
        """A connection to the agent: its unix socket when it is on this host, else TLS over its
        port (ConnectionError if the port's certificate is not the agent's)."""
        if self.path is not None and os.path.exists(self.path):
            local = socket.socket(socket.AF_UNIX)
            try:
                local.connect(self.path)
                return local
            except OSError:  # another user's, or closed: the port says which
                local.close()
        sock = socket.create_connection((self.host, self.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            return connect_tls(sock, self.fingerprint)
        except BaseException:
            sock.close()
            raise


class JobCache(Generic[Value]):
    """The jobs a worker holds, least recently used first, at most ``KEPT_JOBS``.

    The agent keeps one per worker (keys only) and the worker the same (unpickled jobs):
    both apply the same operations, JOB adds and TASKS uses, in the order the one
    connection carries them, so the agent knows without asking which jobs the worker
    still holds and sends a job again once the worker has let it go."""

    def __init__(self, capacity: int = KEPT_JOBS):
        self.capacity = capacity
        self._entries: OrderedDict[bytes, Value] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, key: bytes, value: Value) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def use(self, key: bytes) -> Value:
        """The job for a TASKS message (KeyError if it was never sent or was let go)."""
        value = self._entries[key]
        self._entries.move_to_end(key)
        return value


def clock_id() -> str | None:
    """What names this host's CLOCK_MONOTONIC: the running kernel's boot id (Linux), None
    where there is none. A worker says it in its hello; the same id on both ends means the
    times a worker reports are the agent's own clock."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            return boot.read().strip() or None
    except OSError:
        return None


def stream_result(took_ns: int, answered_ns: int, packed: list[bytes]) -> list[bytes]:
    """A STREAM_RESULT's payload: the packed result columns behind when they were computed."""
    return [COMPUTED.pack(took_ns, answered_ns), *packed]


def read_stream_result(payload: bytearray) -> tuple[float, float, memoryview]:
    """A STREAM_RESULT's times (seconds, the worker's clock) and its packed result columns
    (ValueError if too short to hold the times)."""
    if len(payload) < COMPUTED.size:
        raise ValueError(f"a stream result of {len(payload)} bytes, short of its times")
    took, answered = COMPUTED.unpack_from(payload)
    return took / 1e9, answered / 1e9, memoryview(payload)[COMPUTED.size :]


def describe_failure(error: BaseException) -> str:
    """A worker's failure for the agent: the exception and where it was raised on the
    first line (what an ErrorResponse carries), the whole traceback after it."""
    frames = traceback.extract_tb(error.__traceback__)[-FAILURE_FRAMES:]
    where = " <- ".join(f"{frame.name} ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" for frame in reversed(frames))
    cause = "".join(traceback.format_exception_only(type(error), error)).strip().replace("\n", " ")
    whole = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return f"{cause} in {where}\n{whole}" if where else f"{cause}\n{whole}"


def handler_call_parts(call: HandlerCall, rebuild: bool) -> list[bytes]:
    """A HANDLER message's payload: the call, with what rebuilds the handler if ``rebuild``."""
    blobs = [call.frames]
    header: dict[str, object] = {"task": call.task, "snapshot": call.take_snapshot, "forget": list(call.forget), "rebuild": rebuild}
    if rebuild:
        script, how = call.script, call.rebuild
        header.update(path=script.path, args=list(script.args), has_init=how.init is not None, has_snapshot=how.snapshot is not None, replay=len(how.replay))
        blobs += [script.source.encode(), script.info, how.init or b"", how.snapshot or b"", *how.replay]
    return _framed(header, blobs)


def read_handler_call(payload: bytearray) -> tuple[HandlerCall, bool]:
    from udf_agent.api import HandlerScript
    from udf_agent.compute.handlers import HandlerCall, Rebuild

    header, blobs = _unframed(payload)
    frames = blobs[0]
    if not header["rebuild"]:
        return HandlerCall(header["task"], HandlerScript("", ""), frames, Rebuild(), header["snapshot"], tuple(header["forget"])), False
    source, info, init, snapshot, *replay = blobs[1:]
    script = HandlerScript(header["path"], source.decode(), tuple(header["args"]), info)
    rebuild = Rebuild(init if header["has_init"] else None, snapshot if header["has_snapshot"] else None, tuple(replay))
    return HandlerCall(header["task"], script, frames, rebuild, header["snapshot"], tuple(header["forget"])), True


def handler_outcome_parts(outcome: HandlerOutcome) -> list[bytes]:
    header = {"error": outcome.error, "printed": outcome.printed, "has_snapshot": outcome.snapshot is not None, "snapshot_problem": outcome.snapshot_problem, "written": outcome.written}
    return _framed(header, [outcome.output, outcome.snapshot or b""])


def read_handler_outcome(payload: bytearray) -> HandlerOutcome:
    from udf_agent.compute.handlers import HandlerOutcome

    header, (output, snapshot) = _unframed(payload)
    return HandlerOutcome(output, header["error"], header["printed"], snapshot if header["has_snapshot"] else None, header["snapshot_problem"], header["written"])


def _framed(header: Mapping[str, object], blobs: list[bytes]) -> list[bytes]:
    encoded = json.dumps({**header, "sizes": [len(blob) for blob in blobs]}).encode()
    return [LENGTH.pack(len(encoded)), encoded, *blobs]


def _unframed(payload: bytearray) -> tuple[dict[str, Any], list[bytes]]:
    view = memoryview(payload)
    (length,) = LENGTH.unpack_from(view)
    header = json.loads(bytes(view[LENGTH.size : LENGTH.size + length]))
    pos = LENGTH.size + length
    blobs = []
    for size in header["sizes"]:
        blobs.append(bytes(view[pos : pos + size]))
        pos += size
    return header, blobs


# Buffers handed to one sendmsg at most (Linux takes 1,024).
MAX_GATHERED = 512
# What one read of a link takes at most into its buffer: a trickle's whole message, header and
# payload, in one system call. A payload larger than what arrived with its header is read
# into its own buffer, not through this one.
RECEIVE_BUFFER = 64 * 1024
# The most a TLS record carries: parts smaller are joined up to it, larger ones written whole.
TLS_RECORD = 16 * 1024


class Link:
    """One end of a resident link (a unix socket, or TLS over TCP): each message out in one
    gathered write (joined up to a record over TLS), in through a buffer
    that takes whatever has arrived in one read (a slice's header and payload: one system
    call, not two).

    With ``deadlines`` (the agent's end, which never waits on a worker past the batch
    timeout) the socket is non-blocking and each call is given a deadline, by which it waits
    for the socket with poll only when it cannot go on at once: TimeoutError past it. A timeout
    set on the socket instead was two system calls a micro-batch to set it, and a poll before
    every read and write. Without (the worker's end), calls block as long as it takes."""

    def __init__(self, sock: socket.socket, deadlines: bool = False):
        self.sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        sock.setblocking(not deadlines)
        self._readable = select.poll()
        self._readable.register(sock, select.POLLIN)
        self._writable = select.poll()
        self._writable.register(sock, select.POLLOUT)
        self._buffer = bytearray(RECEIVE_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0  # the bytes received and not yet taken

    def close(self) -> None:
        self.sock.close()

    def send(self, kind: int, *parts: bytes | bytearray | memoryview | pa.Buffer, deadline: float | None = None) -> None:
        """One message whose payload is ``parts`` (bytes-like) one after another, never joined (a
        micro-batch is megabytes, and copying it holds the GIL the reader needs) but gathered by
        sendmsg: a small message is one system call, and one segment for the peer to wake to."""
        pending = [memoryview(HEADER.pack(kind, sum(len(part) for part in parts)))]
        pending += [memoryview(part).cast("B") for part in parts if len(part)]
        if self._tls:
            self._send_tls(pending, deadline)
            return
        first = 0
        while first < len(pending):
            try:
                sent = self.sock.sendmsg(pending[first : first + MAX_GATHERED])
            except BlockingIOError:
                self._wait(self._writable, deadline)
                continue
            while sent and sent >= len(pending[first]):
                sent -= len(pending[first])
                first += 1
            if sent:
                pending[first] = pending[first][sent:]

    def _send_tls(self, pending: list[memoryview], deadline: float | None) -> None:
        """``send`` over TLS, which has no gathered write: small parts joined up to a record's
        size, so that a trickle's message is still one record and one segment; larger parts
        written as they are (OpenSSL cuts them into records, copying nothing more)."""
        joined = bytearray()
        for part in pending:
            if len(part) < TLS_RECORD:
                joined += part
                if len(joined) < TLS_RECORD:
                    continue
            if joined:
                self._write_tls(memoryview(joined), deadline)
                joined = bytearray()
            if len(part) >= TLS_RECORD:
                self._write_tls(part, deadline)
        if joined:
            self._write_tls(memoryview(joined), deadline)

    def _write_tls(self, view: memoryview, deadline: float | None) -> None:
        while view:
            try:
                view = view[self.sock.send(view) :]
            except ssl.SSLWantWriteError:  # retried with the same bytes, as OpenSSL requires
                self._wait(self._writable, deadline)
            except ssl.SSLWantReadError:
                self._wait(self._readable, deadline)

    def receive(self, deadline: float | None = None, max_length: int | None = None) -> tuple[int, bytearray] | None:
        """The next message, or None at a clean end of stream (before a header); ValueError if
        its payload would be over ``max_length`` bytes (nothing of it is taken)."""
        if not self._gather(HEADER.size, deadline):
            return None
        kind, length = HEADER.unpack_from(self._buffer, self._start)
        if max_length is not None and length > max_length:
            raise ValueError(f"a message of {length} bytes, over the {max_length} expected")
        start = self._start + HEADER.size
        buffered = self._end - start
        if buffered >= length:
            payload = bytearray(self._view[start : start + length])
            self._start = start + length
            return kind, payload
        payload = bytearray(length)
        payload[:buffered] = self._view[start : self._end]
        self._start = self._end = 0
        view, received = memoryview(payload), buffered
        while received < length:
            count = self._read(view[received:], deadline)
            if count == 0:
                raise ConnectionError(f"connection closed after {received} of {length} bytes")
            received += count
        return kind, payload

    def message_waiting(self, timeout: float) -> bool:
        """Whether the peer's next message has begun to come, waiting ``timeout`` seconds at
        most for it (select: poll's milliseconds are too coarse for a slice's pace)."""
        if self._end > self._start or self._decrypted():
            return True
        return bool(select.select([self.sock], [], [], max(timeout, 0.0))[0])

    def _decrypted(self) -> bool:
        """Whether TLS holds bytes it has read and decrypted that were not taken yet: the
        socket shows nothing to poll for them."""
        return self._tls and self.sock.pending() > 0  # type: ignore[attr-defined]

    def _gather(self, size: int, deadline: float | None) -> bool:
        """At least ``size`` bytes in the buffer; False at an end of stream before any."""
        if self._end - self._start >= size:
            return True
        if self._start:  # what is left goes to the front, making room behind it
            left = self._end - self._start
            self._view[:left] = self._view[self._start : self._end]
            self._start, self._end = 0, left
        while self._end < size:
            count = self._read(self._view[self._end :], deadline)
            if count == 0:
                if self._end == 0:
                    return False
                raise ConnectionError(f"connection closed after {self._end} of {size} bytes")
            self._end += count
        return True

    def _read(self, into: memoryview, deadline: float | None) -> int:
        # Over TLS a read is tried first: a payload comes as many records, most already arrived.
        if deadline is not None and not self._tls:
            self._wait(self._readable, deadline)
        while True:
            try:
                return self.sock.recv_into(into)
            except (BlockingIOError, ssl.SSLWantReadError):  # woken for nothing, or for part of a TLS record
                self._wait(self._readable, deadline)
            except ssl.SSLWantWriteError:
                self._wait(self._writable, deadline)

    @staticmethod
    def _wait(poller: select.poll, deadline: float | None) -> None:
        if deadline is None:
            poller.poll()
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not poller.poll(math.ceil(remaining * 1000)):
            raise TimeoutError("the link's deadline passed")
