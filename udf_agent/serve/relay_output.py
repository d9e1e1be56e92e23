"""A relay's stdout, Kapacitor's end of the task: whatever is written goes whole, as fast as
Kapacitor reads (backpressure), and while no server answers Kapacitor's watchdog the relay
answers it itself, a KeepaliveResponse a second. One lock: a frame is never cut by another.
"""

from __future__ import annotations

import os
import threading
import time

from udf_agent.runtime.stdio import PIPE_SIZE, size_pipe
from udf_agent.wire.keepalives import keepalive_frame

# How often the relay answers Kapacitor's watchdog itself while no server does.
HEARTBEAT_INTERVAL = 1.0
# After Kapacitor closed our input, output it takes none of for this long is dropped: a task
# abort stops reading first (as the agent's own writer does at a stop).
STOPPED_READER_TIMEOUT = 1.0
# While Kapacitor's end of the output is full, the relay writes again after this long: the
# pipe (PIPE_SIZE, 256 KiB) holds 40 ms of output at 6 MB/s (60 k points/s), so Kapacitor
# never finds it empty meanwhile, and the relay wakes ~200 times a second, not ~600.
OUTPUT_DRAIN_PAUSE = 0.005


class OutputAbandoned(Exception):
    """Kapacitor closed the input and stopped reading the output: the task was aborted."""


class KapacitorOutput:
    """The relay's one way to Kapacitor: the output loop's frames and the heartbeats' replies,
    each written whole under one lock."""

    def __init__(self, fd: int, input_ended: threading.Event):
        self._fd = fd
        self._input_ended = input_ended
        self._lock = threading.Lock()  # the output loop and the heartbeats write
        self._heartbeats: set[str] = set()  # why the relay answers Kapacitor's watchdog itself now
        self._heartbeat_wake = threading.Condition(self._lock)

    def open(self) -> None:
        os.set_blocking(self._fd, False)  # a write must notice an abort (see write_to_kapacitor)
        # Kapacitor reads 4 KiB at a time: through a default pipe each read would wake the
        # relay for 4 KiB more, thousands of times a second under its feed.
        size_pipe(self._fd, PIPE_SIZE)

    def write(self, data: bytes) -> None:
        """All of ``data``: ``write_to_kapacitor``."""
        with self._lock:
            write_to_kapacitor(self._fd, data, self._input_ended)

    def heartbeat(self, reason: str, on: bool) -> None:
        """Answers Kapacitor's watchdog with a KeepaliveResponse a second while any reason
        holds (any reply resets it: kapacitor-udf-facts.md), from a thread started for it.
        Each reason is set and cleared by one thread (the output loop's on every chunk), so
        clearing one that is not set is decided without the lock."""
        if not on and reason not in self._heartbeats:
            return
        with self._heartbeat_wake:
            idle = not self._heartbeats
            if on:
                self._heartbeats.add(reason)
            else:
                self._heartbeats.discard(reason)
            self._heartbeat_wake.notify_all()
        if on and idle:
            threading.Thread(target=self._beat, name="relay-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        with self._heartbeat_wake:
            while self._heartbeats:
                try:
                    write_to_kapacitor(self._fd, keepalive_frame(time.time_ns()), self._input_ended)
                except (OSError, OutputAbandoned):
                    return
                self._heartbeat_wake.wait(HEARTBEAT_INTERVAL)


def write_to_kapacitor(fd: int, data: bytes, input_ended: threading.Event) -> None:
    """Writes all of ``data`` to ``fd`` (non-blocking), waiting for Kapacitor to read as long as
    it may (backpressure); OutputAbandoned once ``input_ended`` is set and no byte is taken
    for STOPPED_READER_TIMEOUT. A full pipe is left to drain for OUTPUT_DRAIN_PAUSE between
    writes: Kapacitor frees it 4 KiB a read, and a writer woken as soon as there is room
    would wake for every one of them."""
    view = memoryview(data)
    stalled_since: float | None = None
    while view:
        try:
            view = view[os.write(fd, view) :]
            stalled_since = None
            continue
        except BlockingIOError:
            pass
        time.sleep(OUTPUT_DRAIN_PAUSE)
        if input_ended.is_set():
            now = time.monotonic()
            stalled_since = stalled_since or now
            if now - stalled_since >= STOPPED_READER_TIMEOUT:
                raise OutputAbandoned
