"""The process's stdin and stdout, claimed for the protocol, and the pipes sized.

Imports little: a relay claims them at its process's first moment, before anything else loads.
"""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import sys

log = logging.getLogger(__name__)

# Linux pipes hold 64 KiB by default: every read and write then moves only a few hundred
# points, and the per-call costs dominate. Bigger is not better either: a keepalive waits
# behind everything queued in the pipe (the agent sizes its input pipe for the UDF's pace).
PIPE_SIZE = 256 * 1024


def size_pipe(fd: int, size: int) -> None:
    """Sizes the pipe ``fd`` is an end of (nothing for any other file)."""
    if not stat.S_ISFIFO(os.fstat(fd).st_mode) or not hasattr(fcntl, "F_SETPIPE_SZ"):
        return
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError as exc:  # over /proc/sys/fs/pipe-max-size, not permitted, or (shrinking) fuller than size: only slower
        log.debug("cannot size the pipe on fd %d to %d bytes: %s", fd, size, exc)


def claim_stdio_fds() -> tuple[int, int]:
    """The real stdin and stdout as new fds; fd 0 then reads nothing and fd 1 is stderr."""
    protocol_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    return protocol_in, claim_stdout()


def claim_stdout() -> int:
    """Keeps the real stdout (returned, as a new fd) for this process's own output and
    points fd 1 and ``sys.stdout`` at stderr, so nothing else can write there."""
    ours = os.dup(1)
    sys.stdout.flush()
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return ours
