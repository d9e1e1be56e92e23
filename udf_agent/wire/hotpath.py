"""Where the runtime chooses between the compiled kernels and their plain-Python twins.

The compiled frame scanner and point codec (numba, compiled once per machine into its cache)
load off the Info path. Until the scanner has loaded, or where it cannot, the reference
``frames.FrameSplitter`` cuts frames, slower. The point codec has no such twin in production
(``columns`` is the tests' reference): a UDF that computes needs it, and ``doctor`` checks it
loads. Nothing heavy is imported here: loading is what the ``load_*`` functions do.
"""

from __future__ import annotations

from udf_agent.wire.frames import FrameSplitter

_scanner_loaded = False


def load_scanner() -> None:
    """Loads the compiled frame scanner and its kernels; raises what loading raised."""
    global _scanner_loaded
    from udf_agent.wire import scanner

    scanner.warm_up()
    _scanner_loaded = True


def load_point_codec() -> None:
    """Loads the compiled point decoder and encoder (UDFs whose points are computed)."""
    from udf_agent.wire import pointcodec

    pointcodec.warm_up()


def scanner_loaded() -> bool:
    """Whether the compiled frame scanner (and its kernels) can be used in this process."""
    return _scanner_loaded


def compiled_splitter(splitter: FrameSplitter) -> FrameSplitter:
    """The compiled scanner, taking over mid-stream from ``splitter`` (``scanner_loaded`` first)."""
    from udf_agent.wire.scanner import FastFrameSplitter

    return FastFrameSplitter.continuing(splitter)


def handler_run_splitter(splitter: FrameSplitter) -> FrameSplitter:
    """For a Kapacitor Handler script's session: the compiled scanner of the runs of requests
    its handler takes as they came, taking over mid-stream from ``splitter`` (``scanner_loaded``
    first)."""
    from udf_agent.wire.scanner import RequestRunSplitter

    return RequestRunSplitter.continuing(splitter)
