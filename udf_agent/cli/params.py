"""The command line's own types, checks and shared options (click); nothing here computes."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

from udf_agent.literals import command_line_seconds
from udf_agent.tools.describe import builtins_help

CommandFunction = TypeVar("CommandFunction", bound=Callable[..., None])


class DurationType(click.ParamType[float]):
    """A duration such as 500ms, 1s or 2m, in seconds."""

    name = "duration"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)):
            return float(value)
        seconds = command_line_seconds(value)
        if seconds is None:
            self.fail(f"{value!r} is not a duration (examples: 250ms, 1s, 2m)", param, ctx)
        if seconds <= 0:
            self.fail("must be greater than zero", param, ctx)
        return seconds


class ByteSizeType(click.ParamType[int]):
    """A size such as 512m, 4g or 1500000 (bytes); 0 for none."""

    name = "size"
    UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower().removesuffix("b").removesuffix("i")
        number, unit = text.rstrip("kmgt"), text[len(text.rstrip("kmgt")) :]
        try:
            size = float(number) * self.UNITS[unit]
        except (ValueError, KeyError):
            self.fail(f"{value!r} is not a size (examples: 512m, 4g, 0 for no limit)", param, ctx)
        if size < 0:
            self.fail("must not be negative", param, ctx)
        return int(size)


class ErrorPolicyType(click.ParamType[tuple[str, "str | None"]]):
    """fail | skip | dead-letter:DIR, as (policy, directory); the directory is created if needed."""

    name = "fail|skip|dead-letter:DIR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str | None]:
        if isinstance(value, tuple):
            return value
        if value in ("fail", "skip"):
            return value, None
        policy, sep, directory = value.partition(":")
        if policy != "dead-letter" or not sep:
            self.fail(f"{value!r} is not one of fail, skip, dead-letter:DIR", param, ctx)
        if not directory.strip():
            self.fail("dead-letter needs a directory: dead-letter:DIR", param, ctx)
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            self.fail(f"cannot create the dead-letter directory {directory!r}: {exc.strerror}", param, ctx)
        if not os.access(directory, os.W_OK | os.X_OK):
            self.fail(f"the dead-letter directory {directory!r} is not writable", param, ctx)
        return "dead-letter", os.path.abspath(directory)


class ConfType(click.ParamType[tuple[str, str]]):
    name = "key=value"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value
        key, sep, val = value.partition("=")
        if not sep or not key.strip():
            self.fail(f"{value!r} is not of the form key=value", param, ctx)
        return key.strip(), val.strip()


def connect_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if not value:  # an empty SPARK_REMOTE means none
        return None
    if not value.startswith("sc://"):
        raise click.BadParameter(f"{value!r} is not a Spark Connect URL (sc://HOST:PORT)")
    from udf_agent.versions import missing_connect_client

    missing = missing_connect_client()
    if missing:
        verb = "is" if len(missing) == 1 else "are"
        raise click.UsageError(f"--remote needs Spark Connect's client, and {', '.join(missing)} {verb} not installed here: pip install 'udf-agent[connect]'")
    return value


def missing_modules(modules: tuple[tuple[str, str], ...]) -> list[str]:
    """The packages of ``modules`` (module, package) not installed here. Found, not imported:
    a task's relay stays light, and what is found is imported where it is used."""
    import importlib.util

    missing = []
    for module, package in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a parent package missing; a module blocked (None in sys.modules)
            found = False
        if not found:
            missing.append(package)
    return missing


def _module_prefixes(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for prefix in value:
        if not all(part.isidentifier() for part in prefix.split(".")):
            raise click.BadParameter(f"{prefix!r} is not a module name such as mypkg or mypkg.functions")
    return value


allow_module_option = click.option(
    "--allow-module",
    "allow_modules",
    multiple=True,
    metavar="PREFIX",
    callback=_module_prefixes,
    help="Let stream_fn and batch_fn import the module PREFIX and its submodules (mypkg: mypkg and mypkg.mod, not mypkgx) from wherever Python finds it but the working directory; repeatable. Without it they import only modules found in the directories on this process's PYTHONPATH (in kapacitor.conf, [udf.functions.NAME.env]), never the working directory, the standard library or site-packages: whoever can define a Kapacitor task names the module, and importing a module runs its code. The TARGET of the command line itself is not restricted (it is found in the working directory too).",
)


def tick_duration_ns(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A TICKscript duration (10s, 5m, 1h, 1d, 1w) in nanoseconds."""
    if value is None:
        return None
    from udf_agent.options import Duration

    try:
        ns = Duration(value).ns
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if ns <= 0:
        raise click.BadParameter("must be greater than zero")
    return ns


log_format_option = click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="How stderr lines look: 'json' writes one JSON object a line (time, level, pid, logger, taskID, nodeID, udf, message, exception) for log pipelines; Kapacitor copies a UDF's stderr into its own log either way. A line logged for a task names it. A shared Spark server logs, to its own file, in the format of the task that started it, and sends each task what it logs for that task, which the task's process logs on its stderr in the task's own format (and at its --log-level, down to info).",
)


def _metrics_address(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    from udf_agent.serve.metrics import parse_address

    try:
        parse_address(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


def metrics_option(help_text: str) -> Callable[[CommandFunction], CommandFunction]:
    return click.option("--metrics-address", callback=_metrics_address, metavar="HOST:PORT", help=help_text)


SERVER_METRICS = "Serve Prometheus metrics at http://HOST:PORT/metrics: per task (labels task, node, udf) points received and sent, micro-batches, compute and keepalive-answer time histograms, points skipped, dead-lettered and dropped at a stop, groups, output queued; Spark workers connected and their launches; the process's CPU and memory."


# The compute options of 'run' and 'serve' that set up the engines rather than the agent.
ENGINE_OPTIONS = ("spark_dispatch", "batch_timeout", "resident_slots", "resident_idle", "local_while_starting", "local_max_points", "remote", "worker_memory", "max_cores")


def split_engine_options(options: dict[str, Any], confs: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A command line's compute options: (the engines', the agent's). --max-cores bounds
    cores that grow: with cores fixed by hand it would mean nothing, so it is refused."""
    engine = {name: options[name] for name in ENGINE_OPTIONS}
    if engine["max_cores"] is not None:
        fixed = "--resident-slots" if engine["resident_slots"] is not None else "--conf spark.cores.max" if any(key == "spark.cores.max" for key, _ in confs) else None
        if fixed is not None:
            raise click.UsageError(f"--max-cores bounds cores that grow with the load; {fixed} fixes them: give one or the other")
    return engine, {name: value for name, value in options.items() if name not in engine}


def compute_options(function: CommandFunction) -> CommandFunction:
    decorators = [
        click.option("--master", default="local[*]", show_default=True, help="Spark master URL (embedded Spark by default). A spark:// master that takes no TCP connection within 5 s fails the task with an ErrorResponse naming it and the cause."),
        click.option("--remote", envvar="SPARK_REMOTE", callback=connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to compute on instead of --master: the agent starts no JVM (needs the 'connect' extra). Also read from SPARK_REMOTE, as PySpark does. An unreachable server fails the task with an ErrorResponse naming it and the cause."),
        click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable (with --remote: runtime settings only). A setting whose name says secret, password, token or key is shown redacted in logs and errors; rather than on a command line, which anyone on the host can read, put such a value in $SPARK_CONF_DIR/spark-defaults.conf."),
        click.option("--spark-dispatch", type=click.Choice(["resident", "jobs"]), default="resident", show_default=True, help="How micro-batches reach Spark: 'resident' tasks that stay up and are fed over a socket (milliseconds per micro-batch; executors must reach the agent), or a Spark 'jobs' per micro-batch (0.2-0.5 s each)."),
        click.option("--batch-timeout", type=DurationType(), default="60s", show_default=True, help="A micro-batch still computing on Spark after this long is abandoned and retried once on fresh resident workers; a second failure ends the task with an ErrorResponse."),
        click.option("--resident-slots", type=click.IntRange(min=1), default=None, help="Resident workers to launch, each holding one Spark core for as long as it lives.  [default: the cores the application has: N of local[N]; on a standalone cluster one, growing with the load (--max-cores), or spark.cores.max if given; 1 on Spark Connect, whose cores every client shares]"),
        click.option("--max-cores", type=click.IntRange(min=1), default=None, help="On a standalone cluster, the most cores (resident slots, each a one-core executor) the task or shared server grows to. It starts with one, takes one more while its workers are busy over 85% of 5 s, and gives one back once its work fits in fewer for 10 s, and every one when idle (--resident-idle); Spark's dynamic allocation starts and ends the executors. Refused with --resident-slots or --conf spark.cores.max, which fix the cores.  [default: what the cluster has free]"),
        click.option("--resident-idle", type=DurationType(), default="30s", show_default=True, help="Resident workers that get no micro-batch for this long end, giving their cores back to Spark (and on a standalone cluster their executor back to the cluster, 10 s later). The next micro-batch relaunches them: on an embedded Spark it waits about a second for them; on a cluster or Spark Connect it runs as a Spark job (0.2-0.5 s, more while an executor starts) until they connect. State lives in the agent: nothing is lost."),
        click.option("--worker-memory", type=ByteSizeType(), default=None, help="Resident memory a resident Spark Python worker may reach while it computes (512m, 4g; 0: no limit). Past it the worker ends, its micro-batch fails with an error saying so (retried never: the UDF did it), and a fresh worker takes its slot: a UDF that allocates without bound costs its own task, not the host's JVM or shared server to the out-of-memory killer. Embedded Spark and standalone clusters whose executors run Linux.  [default: half the host's memory shared by the resident slots, at least 1g]"),
        click.option("--local-while-starting/--no-local-while-starting", default=None, help="Compute micro-batches in the agent process (the same code Spark runs) while Spark starts, instead of holding them until it is up.  [default: on with a local master, else off]"),
        click.option("--local-max-points", type=click.IntRange(min=0), default=0, show_default=True, help="Micro-batches of at most this many points are computed in the agent process instead of on Spark. 0: all on Spark once it is up."),
        click.option("--flush-interval", type=DurationType(), default="500ms", show_default=True, help="Longest time a point waits in a micro-batch."),
        click.option("--max-batch-points", type=click.IntRange(min=1), default=50_000, show_default=True, help="Points that close a micro-batch."),
        click.option("--max-pending-points", type=click.IntRange(min=1), default=500_000, show_default=True, help="Points accepted but not yet computed before input is held back: past it one read every 5 ms (so keepalives are still answered) up to a tenth more, then none until compute makes room."),
        click.option("--on-error", "on_error", type=ErrorPolicyType(), default="fail", show_default=True, help="When the UDF fails on a group (or a micro-batch): 'fail' ends the task with an ErrorResponse (Kapacitor's convention); 'skip' drops those points, logged and counted, and goes on; 'dead-letter:DIR' also writes them to a new file in DIR as line protocol headed by the error."),
        click.option("--max-groups", type=click.IntRange(min=1), default=1_000_000, show_default=True, help="Groups whose history and state are kept; past it the least recently seen group's are dropped (logged), and it starts afresh if it comes back."),
        click.option("--max-frame-size", type=click.IntRange(min=1024), default=64 * 1024 * 1024, show_default=True, help="Largest frame accepted from Kapacitor, in bytes."),
        click.option("--adaptive-flush/--no-adaptive-flush", default=True, show_default=True, help="Compute what was read as soon as the input pauses (nothing more waiting to be read: a burst, a trickle's point) and nothing is computing; while bytes are still waiting (a flow that does not pause), a micro-batch gathers for --gather: under Kapacitor's feed flat out a handful of points a micro-batch would cost a worker round trip each. With --no-adaptive-flush points wait for --flush-interval or --max-batch-points (bigger micro-batches)."),
        click.option("--gather", type=DurationType(), default="150ms", show_default=True, help="While input keeps arriving without a pause, how long an idle compute side lets a micro-batch gather (never past --flush-interval). A micro-batch costs mostly per group in it, so longer means less CPU a point (1,000 series under Kapacitor's feed: 50ms 8 µs, 150ms 5 µs) and up to this much more latency while such a flow lasts; a burst or a trickle is computed as soon as the input pauses, whatever this is."),
        click.option("--drain-timeout", type=DurationType(), default="5s", show_default=True, help="After input ends (EOF, SIGTERM): longest time spent computing and writing accepted points before exiting; what is left is dropped and counted in the log. Output no one takes for 1 s in that time (a task stop) is dropped at once."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="info", show_default=True),
        log_format_option,
        allow_module_option,
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


class TargetCommand(click.Command):
    """A command taking a TARGET: its help ends with the built-ins and their options."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Built-in TARGETs (or package.module:attribute for your own)"):
            for line in builtins_help():
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")
