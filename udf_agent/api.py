"""What UDF authors write against: decorators, a base class, and the context.

A UDF is a pandas function ``fn(df, ctx) -> DataFrame | None`` called once
per group (stream) or once per Kapacitor batch (batch). The runtime owns the
protocol, grouping, history, state, snapshots and Spark.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from udf_agent.errors import first_line
from udf_agent.options import Option, OptionsError, OptionValues, parse_options, timedelta_ns

if TYPE_CHECKING:  # the Info path imports this module: pandas and numpy load with the first micro-batch
    import numpy as np
    import pandas as pd

    from udf_agent import udf_pb2

EDGES = ("stream", "batch")

# Rows, a duration (a pandas.Timedelta is a timedelta), or what the options make of either.
HistoryWindow = int | _dt.timedelta | None
History = HistoryWindow | Callable[[OptionValues], HistoryWindow]
Reads = Sequence[str] | Callable[[OptionValues], Sequence[str]] | None
# A UDF's body: the group's rows and its context in, output rows (or None: no output) out.
# What it returns is checked at run time, so a mistyped result gets a clear error, not a crash.
UDFFunction = Callable[["pd.DataFrame", "Context"], Any]


def names_a_script(target: str) -> bool:
    """Whether TARGET names a Kapacitor Handler script (path/to/script.py)."""
    return target.endswith(".py") and ":" not in target


@dataclass(frozen=True)
class HandlerScript:
    """A Kapacitor Handler script (``kapacitor.udf.agent``): its path, its source (shipped to
    where it computes, maybe another host), the arguments its ``__main__`` block sees, and the
    InfoResponse its handler gives, serialised."""

    path: str
    source: str
    args: tuple[str, ...] = ()
    info: bytes = b""

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]


class BindError(Exception):
    """A UDF cannot start with the options of an InitRequest; the message says why."""


@dataclass(frozen=True)
class UDFSpec:
    """Everything the runtime needs to know about one UDF."""

    name: str
    function: UDFFunction
    wants: str = "stream"
    provides: str = "stream"
    options: tuple[Option, ...] = ()
    history: History = None
    compute: bool = True
    description: str = ""
    # The function returns every point unchanged: the runtime forwards point
    # frames as received (byte-identical as Responses) and never calls it.
    passthrough: bool = False
    # Called once per partition with many groups' rows (see Context.group_starts),
    # so nothing in the call scales with the number of groups.
    vectorized: bool = False
    # The frame's columns the function reads (tags and fields, as the frame names them), or a
    # function of the options giving them: the frame then holds ``time`` and those of them the
    # points carry, and is quicker to make. None: every tag and field.
    reads: Reads = None
    # Checks the options together, at Init: None when fine, else the problem (a string).
    check_options: Callable[[OptionValues], str | None] | None = None
    # A target that names its function in its options (``stream_fn``, ``batch_fn``): at Init,
    # Kapacitor's options and the module prefixes the operator allowed (--allow-module) in,
    # the UDF the task runs and the options to check it with out.
    resolve: Callable[[Sequence[udf_pb2.Option], Sequence[str]], tuple[UDFSpec, list[udf_pb2.Option]]] | None = None
    # A Kapacitor Handler script (``udf-agent run script.py``): its handler takes every request
    # but keepalives and Info, in order, and makes every response (``compute/handlers.py``).
    handler: HandlerScript | None = None

    def __post_init__(self) -> None:
        for edge in (self.wants, self.provides):
            if edge not in EDGES:
                raise ValueError(f"UDF {self.name!r}: edge type must be 'stream' or 'batch', got {edge!r}")
        names = [o.name for o in self.options]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"UDF {self.name!r} declares option(s) twice: {', '.join(duplicates)}")
        if self.history is not None and self.wants != "stream":
            raise ValueError(f"UDF {self.name!r}: history applies to stream UDFs only")
        if self.passthrough and (self.wants, self.provides, self.history) != ("stream", "stream", None):
            raise ValueError(f"UDF {self.name!r}: passthrough is for stream-to-stream UDFs without history")
        if self.vectorized and (self.wants, self.provides) != ("stream", "stream"):
            raise ValueError(f"UDF {self.name!r}: vectorized is for stream-to-stream UDFs")

    def bind(self, given: Sequence[udf_pb2.Option], allow_modules: Sequence[str] = ()) -> tuple[UDFSpec, OptionValues]:
        """At Init: the UDF the task runs (a ``resolve`` target's, else this one) and Kapacitor's
        options ``given`` parsed and checked for it; BindError saying why it cannot start."""
        spec = self
        try:
            if spec.resolve is not None:  # stream_fn, batch_fn: the task runs the UDF they name
                spec, given = spec.resolve(given, allow_modules)
            options = parse_options(spec.options, given)
            problem = spec.check_options(options) if spec.check_options is not None else None
            if problem:
                raise OptionsError([problem])
            spec.history_window(options)
            spec.frame_columns(options)
        except OptionsError as exc:
            raise BindError(f"invalid options for UDF {spec.name!r}: {exc}") from exc
        except Exception as exc:
            raise BindError(f"UDF {spec.name!r} cannot start with these options: {exc}") from exc
        return spec, options

    def frame_columns(self, options: OptionValues) -> frozenset[str] | None:
        """The columns the UDF's frames hold besides ``time`` (``reads``), or None for all."""
        columns = self.reads(options) if callable(self.reads) else self.reads
        if columns is None:
            return None
        if isinstance(columns, str) or not all(isinstance(column, str) for column in columns):
            raise TypeError(f"UDF {self.name!r}: reads must be a list of column names, got {columns!r}")
        return frozenset(columns)

    def history_window(self, options: OptionValues) -> dict[str, int] | None:
        """The per-group history to keep: {"rows": n} or {"ns": duration}, or None."""
        window = self.history(options) if callable(self.history) else self.history
        if window is None:
            return None
        if isinstance(window, bool):
            raise TypeError(f"UDF {self.name!r}: history must be a row count or a duration")
        if isinstance(window, int):
            return {"rows": max(0, window)} if window > 0 else None
        if isinstance(window, _dt.timedelta):  # pandas.Timedelta is a timedelta
            ns = timedelta_ns(window)
            return {"ns": ns} if ns > 0 else None
        raise TypeError(f"UDF {self.name!r}: history must be a row count or a duration, got {window!r}")


@dataclass
class Context:
    """What a UDF call knows besides its DataFrame.

    ``state`` is this group's own dict of JSON values: the runtime keeps it
    between calls and puts it in snapshots. ``history_rows`` counts the rows
    at the top of the frame that were already seen in earlier micro-batches;
    results for them are dropped by the runtime.

    A vectorized UDF's call holds many groups: those of ``groups``, group ``i``
    in rows ``group_starts[i]:group_starts[i + 1]`` (its history rows first,
    ``history_rows`` being 0 and ``group`` "" there). It keeps no ``state``.

    ``task_id`` and ``node_id`` are Kapacitor's names for the task and the UDF node
    (from its InitRequest); ``database`` and ``retention_policy`` give each row's own,
    as Kapacitor sent them with the point.
    """

    options: OptionValues
    group: str
    tags: dict[str, str]
    name: str = ""
    tmax: pd.Timestamp | None = None  # batch UDFs: the batch's end
    state: dict[str, Any] = field(default_factory=dict)  # JSON values
    history_rows: int = 0
    groups: tuple[str, ...] = ()
    group_starts: np.ndarray | None = None  # int64, len(groups) + 1 entries
    task_id: str = ""
    node_id: str = ""
    # Built on first use: a string per row is a cost most UDFs need not pay.
    row_databases: Callable[[], pd.Series] | None = field(default=None, repr=False)
    row_retention_policies: Callable[[], pd.Series] | None = field(default=None, repr=False)

    @property
    def database(self) -> pd.Series | None:
        """Each row's database, a pandas Series aligned with the DataFrame's rows."""
        return self.row_databases() if self.row_databases is not None else None

    @property
    def retention_policy(self) -> pd.Series | None:
        """Each row's retention policy, a pandas Series aligned with the DataFrame's rows."""
        return self.row_retention_policies() if self.row_retention_policies is not None else None


def stream_udf(
    *,
    options: Sequence[Option] = (),
    history: History = None,
    provides: str = "stream",
    name: str | None = None,
    compute: bool = True,
    vectorized: bool = False,
    check_options: Callable[[OptionValues], str | None] | None = None,
    reads: Reads = None,
) -> Callable[[UDFFunction], UDFSpec]:
    """Declares a STREAM-in UDF called once per group of each micro-batch, or with
    ``vectorized=True`` once per partition of it, many groups at a time. ``reads`` names the
    columns its frames need (``UDFSpec.reads``)."""

    def wrap(function: UDFFunction) -> UDFSpec:
        return UDFSpec(
            name=name or function.__name__,
            function=function,
            wants="stream",
            provides=provides,
            options=tuple(options),
            history=history,
            compute=compute,
            vectorized=vectorized,
            check_options=check_options,
            reads=reads,
            description=first_line(function.__doc__),
        )

    return wrap


def batch_udf(
    *,
    options: Sequence[Option] = (),
    provides: str = "batch",
    name: str | None = None,
    compute: bool = True,
    reads: Reads = None,
) -> Callable[[UDFFunction], UDFSpec]:
    """Declares a BATCH-in UDF called once per Kapacitor batch; ``reads`` as ``stream_udf``'s."""

    def wrap(function: UDFFunction) -> UDFSpec:
        return UDFSpec(
            name=name or function.__name__,
            function=function,
            wants="batch",
            provides=provides,
            options=tuple(options),
            compute=compute,
            reads=reads,
            description=first_line(function.__doc__),
        )

    return wrap


class UDF:
    """Base class for UDFs written as classes.

    Subclasses set ``wants``, ``provides``, ``options``, ``history`` and ``reads`` as class
    attributes and implement ``process(self, df, ctx)``. One instance is made
    per worker process and reused; keep per-group state in ``ctx.state``.
    """

    wants: str = "stream"
    provides: str = "stream"
    options: Sequence[Option] = ()
    history: History = None
    reads: Reads = None

    def process(self, df: pd.DataFrame, ctx: Context) -> Any:
        raise NotImplementedError

    @classmethod
    def spec(cls) -> UDFSpec:
        return UDFSpec(
            name=cls.__name__,
            function=_ClassCall(cls),
            wants=cls.wants,
            provides=cls.provides,
            options=tuple(cls.options),
            history=cls.history,
            reads=cls.reads,
            description=first_line(cls.__doc__),
        )


_instances: dict[type, UDF] = {}


class _ClassCall:
    """Calls a UDF subclass's process on one instance per worker process."""

    def __init__(self, cls: type[UDF]):
        self.cls = cls

    def __call__(self, df: pd.DataFrame, ctx: Context) -> Any:
        instance = _instances.get(self.cls)
        if instance is None:
            instance = _instances[self.cls] = self.cls()
        return instance.process(df, ctx)


def as_spec(obj: object, default_name: str = "") -> UDFSpec:
    """Turns what a TARGET names (a spec, or a UDF subclass) into a UDFSpec."""
    if isinstance(obj, UDFSpec):
        return obj
    if isinstance(obj, type) and issubclass(obj, UDF):
        return obj.spec()
    raise TypeError(
        f"{default_name or obj!r} is not a UDF: decorate a function with @stream_udf/@batch_udf "
        "or subclass udf_agent.UDF"
    )
