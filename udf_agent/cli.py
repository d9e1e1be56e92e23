"""The ``udf-agent`` command."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

import click

from udf_agent import __version__
from udf_agent.literals import command_line_seconds
from udf_agent.tools.describe import SOCKET_DIR, builtins_help, describe, kapacitor_conf

if TYPE_CHECKING:
    from spark_backend import SparkEngine
    from udf_agent import udf_pb2
    from udf_agent.api import UDFSpec
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.engines import Engines
    from udf_agent.serve.socket_server import UnixSocketServer

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


def _connect_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if not value:  # an empty SPARK_REMOTE means none
        return None
    if not value.startswith("sc://"):
        raise click.BadParameter(f"{value!r} is not a Spark Connect URL (sc://HOST:PORT)")
    missing = _missing_modules(CONNECT_CLIENT_MODULES)
    if missing:
        raise click.UsageError(f"--remote needs Spark Connect's client, and {', '.join(missing)} is not installed here: pip install 'udf-agent[connect]'")
    return value


# What PySpark's Connect client needs beyond the agent's own dependencies, as (module, package).
CONNECT_CLIENT_MODULES = (("grpc", "grpcio"), ("grpc_status", "grpcio-status"), ("google.rpc", "googleapis-common-protos"), ("zstandard", "zstandard"))


def _missing_modules(modules: tuple[tuple[str, str], ...]) -> list[str]:
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


_allow_module_option = click.option(
    "--allow-module",
    "allow_modules",
    multiple=True,
    metavar="PREFIX",
    callback=_module_prefixes,
    help="Let stream_fn and batch_fn import the module PREFIX and its submodules (mypkg: mypkg and mypkg.mod, not mypkgx) from wherever Python finds it but the working directory; repeatable. Without it they import only modules found in the directories on this process's PYTHONPATH (in kapacitor.conf, [udf.functions.NAME.env]), never the working directory, the standard library or site-packages: whoever can define a Kapacitor task names the module, and importing a module runs its code. The TARGET of the command line itself is not restricted (it is found in the working directory too).",
)


def _tick_duration_ns(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
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


_log_format_option = click.option(
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


def _metrics_option(help_text: str) -> Callable[[CommandFunction], CommandFunction]:
    return click.option("--metrics-address", callback=_metrics_address, metavar="HOST:PORT", help=help_text)


_SERVER_METRICS = "Serve Prometheus metrics at http://HOST:PORT/metrics: per task (labels task, node, udf) points received and sent, micro-batches, compute and keepalive-answer time histograms, points skipped, dead-lettered and dropped at a stop, groups, output queued; Spark workers connected and their launches; the process's CPU and memory."


def _serve_metrics(address: str | None, agents: Callable[[], list[Agent]], describe: Callable[[], dict[str, Any]]) -> str | None:
    """Starts the metrics endpoint and returns its URL, or stops the command with one line
    saying why it cannot."""
    if address is None:
        return None
    import logging

    from udf_agent.serve.metrics import MetricsError, serve_metrics

    try:
        host, port = serve_metrics(address, agents, describe)
    except MetricsError as exc:
        raise click.ClickException(str(exc)) from None
    url = f"http://{host}:{port}/metrics"
    logging.getLogger("udf_agent.cli").info("metrics at %s", url)
    return url


def _compute_options(function: CommandFunction) -> CommandFunction:
    decorators = [
        click.option("--master", default="local[*]", show_default=True, help="Spark master URL (embedded Spark by default). A spark:// master that takes no TCP connection within 5 s fails the task with an ErrorResponse naming it and the cause."),
        click.option("--remote", envvar="SPARK_REMOTE", callback=_connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to compute on instead of --master: the agent starts no JVM (needs the 'connect' extra). Also read from SPARK_REMOTE, as PySpark does. An unreachable server fails the task with an ErrorResponse naming it and the cause."),
        click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable (with --remote: runtime settings only)."),
        click.option("--spark-dispatch", type=click.Choice(["resident", "jobs"]), default="resident", show_default=True, help="How micro-batches reach Spark: 'resident' tasks that stay up and are fed over a socket (milliseconds per micro-batch; executors must reach the agent), or a Spark 'jobs' per micro-batch (0.2-0.5 s each)."),
        click.option("--batch-timeout", type=DurationType(), default="60s", show_default=True, help="A micro-batch still computing on Spark after this long is abandoned and retried once on fresh resident workers; a second failure ends the task with an ErrorResponse."),
        click.option("--resident-slots", type=click.IntRange(min=1), default=None, help="Resident workers to launch, each holding one Spark core for as long as it lives.  [default: the cores the application has: N of local[N]; spark.cores.max on a cluster (1 on a standalone cluster unless --conf spark.cores.max=N); 1 on Spark Connect, whose cores every client shares]"),
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
        click.option("--adaptive-flush/--no-adaptive-flush", default=True, show_default=True, help="Compute buffered points at once when nothing is computing (low latency), except that while points flow in at 10 k/s or more a micro-batch gathers for --gather: under Kapacitor's feed a handful of points a micro-batch would cost a worker round trip each. With --no-adaptive-flush points wait for --flush-interval or --max-batch-points (bigger micro-batches)."),
        click.option("--gather", type=DurationType(), default="150ms", show_default=True, help="While points flow in at 10 k/s or more, how long an idle compute side lets a micro-batch gather (never past --flush-interval). A micro-batch costs mostly per group in it, so longer means less CPU a point (1,000 series under Kapacitor's feed: 50ms 8 µs, 150ms 5 µs) and up to this much more latency while such a flow lasts; a trickle is computed at once whatever this is."),
        click.option("--drain-timeout", type=DurationType(), default="5s", show_default=True, help="After input ends (EOF, SIGTERM): longest time spent computing and writing accepted points before exiting; what is left is dropped and counted in the log. Output no one takes for 1 s in that time (a task stop) is dropped at once."),
        click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="info", show_default=True),
        _log_format_option,
        _allow_module_option,
    ]
    for decorator in reversed(decorators):
        function = decorator(function)
    return function


def _load(target: str, script_args: tuple[str, ...] = ()) -> UDFSpec:
    from udf_agent.targets import TargetError, resolve_target

    try:
        # A UDF module that prints on import must not pollute our output.
        with contextlib.redirect_stdout(sys.stderr):
            return resolve_target(target, script_args)
    except TargetError as exc:
        raise click.BadParameter(str(exc), param_hint="TARGET") from None


def _engines(master: str, confs: tuple[tuple[str, str], ...], spark_dispatch: str = "resident", batch_timeout: float = 60.0, resident_slots: int | None = None, resident_idle: float = 30.0, local_while_starting: bool | None = None, local_max_points: int = 0, remote: str | None = None, worker_memory: int | None = None) -> Engines:
    from udf_agent.runtime.engines import Engines


    # Any: SparkEngine's read-only ``name`` does not yet match compute.Engine's settable one.
    def make_spark() -> Any:
        from spark_backend import SparkEngine, SparkSettings

        return SparkEngine(SparkSettings(master=master, conf=dict(confs), dispatch=spark_dispatch, batch_timeout=batch_timeout, resident_slots=resident_slots, resident_idle=resident_idle, remote=remote, worker_memory=worker_memory))

    if local_while_starting is None:
        # On a remote cluster the UDF may need the cluster's resources: Spark only, unless asked.
        local_while_starting = master.startswith("local") and remote is None
    return Engines(make_spark, local_max_points, local_while_starting)


# Built-ins declared compute=False (tests keep the two in step): named here so that a relay
# need not import the built-ins to know.
SPARK_FREE_BUILTINS = frozenset({"mirror"})

_ENGINE_OPTIONS = ("spark_dispatch", "batch_timeout", "resident_slots", "resident_idle", "local_while_starting", "local_max_points", "remote", "worker_memory")


def _split_options(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The command line's compute options: (the engines', the agent's)."""
    engine = {name: options[name] for name in _ENGINE_OPTIONS}
    return engine, {name: value for name, value in options.items() if name not in engine}


def _on_stop_signals(stop: Callable[[str], None]) -> None:
    """The first SIGTERM/SIGINT calls ``stop(reason)`` (an orderly drain); a second exits at once."""
    import logging

    received: list[int] = []

    def handle(signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if received:
            logging.getLogger("udf_agent").warning("second %s: exiting now, without draining", name)
            sys.stderr.flush()
            os._exit(128 + signum)
        received.append(signum)
        logging.getLogger("udf_agent").warning("%s received: finishing accepted work, then exiting (send it again to exit at once)", name)
        stop(f"udf-agent stopped: received {name}")

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handle)


class _TargetCommand(click.Command):
    """A command taking a TARGET: its help ends with the built-ins and their options."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        with formatter.section("Built-in TARGETs (or package.module:attribute for your own)"):
            for line in builtins_help():
                formatter.write(f"{'':>{formatter.current_indent}}{line}\n")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="udf-agent")
def main() -> None:
    """Kapacitor UDFs written in pandas, computed on Spark."""


@main.command(cls=_TargetCommand)
@click.argument("target")
@click.argument("script_args", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
@_compute_options
@click.option(
    "--own-spark",
    is_flag=True,
    envvar="UDF_AGENT_OWN_SPARK",
    help="Also set by UDF_AGENT_OWN_SPARK=1. Compute in this process on its own Spark (1.2 GB a task with the embedded Spark), instead of on the one shared Spark server of this host, which the first task starts and which every task with the same install and Spark settings then shares (see 'udf-agent shared-server --help').",
)
@click.option(
    "--shared-idle-exit",
    type=DurationType(),
    default="10m",
    show_default=True,
    help="A shared Spark server this task starts exits after serving no task for this long. A server already up keeps its own: if this option is given and differs, this task says so on its stderr.",
)
@_metrics_option(
    "Serve Prometheus metrics (see 'serve --help') at http://HOST:PORT/metrics: from the shared Spark server this task starts, or with --own-spark (and for mirror, which runs in the task's process) from this task's process. A shared server already up serves the metrics of every task on it where the task that started it asked (or none): if that is not HOST:PORT, this task says so on its stderr."
)
def run(target: str, script_args: tuple[str, ...], master: str, confs: tuple[tuple[str, str], ...], log_level: str, log_format: str, own_spark: bool, shared_idle_exit: float, metrics_address: str | None, **options: Any) -> None:
    """Serve TARGET to Kapacitor over stdin/stdout (a process UDF).

    By default the task computes on this host's shared Spark server, started on first use
    (this process then only relays Kapacitor's bytes, about 20 MB); --own-spark keeps the
    task in its own process with its own Spark. mirror, which never starts Spark, always
    runs in its own process.

    TARGET may be a script written for Kapacitor's own Python agent (path/to/script.py, its
    arguments after --): it runs unmodified, its handler computed on Spark (docs/migrating.md)."""
    engine_options, agent_options = _split_options(options)
    from udf_agent.api import names_a_script

    if names_a_script(target):
        target = os.path.abspath(target)
    elif script_args:
        raise click.UsageError(f"arguments after TARGET ({' '.join(script_args)}) are for a Kapacitor Handler script (path/to/script.py) only")
    # A built-in that never starts Spark has none to share: relaying it to the shared server
    # would only add a hop (and a server with its Spark for a task that needs none).
    if not own_spark and target not in SPARK_FREE_BUILTINS:
        settings = {"master": master, "confs": [list(conf) for conf in confs], **engine_options}
        server_args = ["--log-format", log_format, *(["--metrics-address", metrics_address] if metrics_address else [])]
        from click.core import ParameterSource

        from udf_agent.serve.relay import relay_launch
        from udf_agent.serve.shared import ServerOptions, ServerStart

        # What the command line gave: a task that gave no --shared-idle-exit asks none of a server already up.
        idle_exit_given = click.get_current_context().get_parameter_source("shared_idle_exit") is not ParameterSource.DEFAULT
        asked_of_server = ServerOptions(metrics_address, shared_idle_exit if idle_exit_given else None)
        argv = click.get_current_context().obj  # the raw command line, when entry.py parsed it
        relay_launch(target, agent_options, ServerStart(settings, shared_idle_exit, server_args), log_level, log_format, asked_of_server, argv if isinstance(argv, list) else None, script_args)
    from udf_agent.runtime.agent import Agent, AgentConfig
    from udf_agent.runtime.logs import configure_logging
    from udf_agent.runtime.transports import claim_stdio

    # Before anything else runs (the UDF's module included), so no print can reach the protocol.
    connection = claim_stdio()
    configure_logging(log_level, log_format)
    engines = _engines(master, confs, **engine_options)
    agent = Agent(None, connection, engines, AgentConfig.from_options(agent_options))
    _serve_metrics(metrics_address, lambda: [agent], engines.describe)
    _on_stop_signals(agent.stop_reading)
    # Keepalives are answered while the UDF's module (often pandas and more) imports.
    agent.start_reading()
    code = agent.run(_load(target, script_args))
    _exit(code, engines)


@main.command(cls=_TargetCommand)
@click.option("--socket", "socket_path", required=True, type=click.Path(dir_okay=False), help="Unix socket to listen on.")
@click.option("--socket-mode", default="0660", show_default=True, help="Permissions of the socket file (octal).")
@click.option("--max-connections", type=click.IntRange(min=1), default=64, show_default=True, help="Open sessions at most; a connection beyond gets an ErrorResponse saying so and is closed.")
@click.option("--init-timeout", type=DurationType(), default="60s", show_default=True, help="A connection that sends no InitRequest within this long is closed with an ErrorResponse.")
@_metrics_option(_SERVER_METRICS)
@click.argument("target")
@_compute_options
def serve(socket_path: str, socket_mode: str, max_connections: int, init_timeout: float, metrics_address: str | None, target: str, master: str, confs: tuple[tuple[str, str], ...], log_level: str, log_format: str, **options: Any) -> None:
    """Serve TARGET on a unix socket: one independent session per connection."""
    from udf_agent.runtime.agent import Agent, AgentConfig
    from udf_agent.runtime.logs import configure_logging
    from udf_agent.serve.socket_server import UnixSocketServer

    try:
        mode = int(socket_mode, 8)
    except ValueError:
        raise click.BadParameter(f"{socket_mode!r} is not an octal mode such as 0660", param_hint="--socket-mode") from None
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{socket_mode!r} is not a file mode", param_hint="--socket-mode")
    configure_logging(log_level, log_format)
    spec = _load(target)
    engine_options, agent_options = _split_options(options)
    engines = _engines(master, confs, **engine_options)
    config = AgentConfig.from_options(agent_options)
    server = UnixSocketServer(
        socket_path,
        lambda connection: Agent(spec, connection, engines, config),
        mode=mode,
        drain_timeout=config.drain_timeout,
        max_connections=max_connections,
        init_timeout=init_timeout,
        describe=lambda: {"kind": "serve", "target": target, **engines.describe()},
    )
    _serve_metrics(metrics_address, server.agents, engines.describe)
    _serve_until_stopped(server, engines, lambda: engines.warm_up(spec))


@main.command(name="shared-server")
@click.option("--socket", "socket_path", required=True, type=click.Path(dir_okay=False), help="Unix socket to listen on (mode 0600).")
@click.option("--settings", "settings_json", required=True, help="The Spark settings, as JSON: 'master', 'confs' and the engine options of 'run'.")
@click.option("--idle-exit", type=DurationType(), default="10m", show_default=True, help="Exit after serving no task for this long.")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000, show_default=True, help="Tasks at most; one beyond gets an ErrorResponse saying so.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="info", show_default=True)
@_log_format_option
@_metrics_option(_SERVER_METRICS)
def shared_server(socket_path: str, settings_json: str, idle_exit: float, max_connections: int, log_level: str, log_format: str, metrics_address: str | None) -> None:
    """The host's shared Spark server, which 'run' starts on first use: not normally run by hand.

    Every process UDF ('udf-agent run', unless --own-spark) with the same install and Spark
    settings relays its task here; the tasks share one Spark and its resident workers. It
    listens in a directory only its user may enter ($UDF_AGENT_SHARED_DIR, else
    $XDG_RUNTIME_DIR/udf-agent, else /tmp/udf-agent-UID), logs to the .log file beside
    its socket, and exits after --idle-exit with no task."""
    import json

    from udf_agent.runtime.logs import configure_logging
    from udf_agent.serve.shared_server import shared_socket_server

    try:
        settings = json.loads(settings_json)
        engines = _engines(settings.pop("master"), tuple((key, value) for key, value in settings.pop("confs")), **settings)
    except (ValueError, KeyError, TypeError) as exc:
        raise click.BadParameter(f"not the settings 'run' passes: {exc}", param_hint="--settings") from None
    configure_logging(log_level, log_format)
    server, sessions = shared_socket_server(socket_path, engines, idle_exit, max_connections)
    metrics_url = _serve_metrics(metrics_address, server.agents, engines.describe)
    if metrics_address is not None and metrics_url is not None:
        sessions.metrics = (metrics_address, metrics_url)
    _serve_until_stopped(server, engines, engines.warm_up_spark)


def _serve_until_stopped(server: UnixSocketServer, engines: Engines, warm_up: Callable[[], None]) -> None:
    """Listens (or stops the command with one line saying why it cannot), serves until a stop
    signal (or, for the shared server, its idle exit), then exits. Spark starts before the
    first connection: the first task's Init finds it warm."""
    from udf_agent.serve.socket_server import SocketServerError

    try:
        server.bind()
    except SocketServerError as exc:
        raise click.ClickException(str(exc)) from None
    _on_stop_signals(server.shutdown)
    warm_up()
    server.serve_forever()
    _exit(0, engines)


@main.command()
@click.option("--socket", "socket_path", required=True, type=click.Path(dir_okay=False), help="The socket UDF's unix socket.")
@click.option("--timeout", type=DurationType(), default="5s", show_default=True, help="Longest the whole check may take.")
def check(socket_path: str, timeout: float) -> None:
    """Check that a socket UDF answers Info and a keepalive: exit 0 when healthy, else 1 with
    one line saying why (for systemd, a readiness probe, or a person debugging)."""
    from udf_agent.tools.probe import ProbeError, probe_socket

    try:
        health = probe_socket(socket_path, timeout)
    except ProbeError as exc:
        raise click.ClickException(f"{socket_path}: {exc}") from None
    click.echo(f"OK {socket_path}: {health}")


@main.command()
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), help="A 'serve' socket. Default: every shared Spark server of this user ($UDF_AGENT_SHARED_DIR, else $XDG_RUNTIME_DIR/udf-agent, else /tmp/udf-agent-UID).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document: a list of servers, each with its tasks (for scripts).")
@click.option("--timeout", type=DurationType(), default="5s", show_default=True, help="Longest a server may take to answer.")
def status(socket_path: str | None, as_json: bool, timeout: float) -> None:
    """List the live tasks of a server: Kapacitor's task and node IDs, the UDF, uptime, points
    in and out, input rate, groups kept, where micro-batches run, the last error.

    Exit 1 with one line saying why when a server cannot be asked."""
    import json

    from udf_agent.serve.shared import SharedServerError, shared_directory
    from udf_agent.serve.status import StatusError, ask, shared_sockets, table

    if socket_path is not None:
        paths = [socket_path]
    else:
        try:
            directory = shared_directory()
        except SharedServerError as exc:
            raise click.ClickException(str(exc)) from None
        paths = shared_sockets(directory)
        if not paths:
            raise click.ClickException(f"no shared Spark server is running (none listens in {directory}; the first task started with 'udf-agent run' starts one); for a 'serve' socket give --socket PATH")
    try:
        statuses = [ask(path, timeout) for path in paths]
    except StatusError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(statuses, indent=1) if as_json else table(statuses))


@main.command(cls=_TargetCommand)
@click.argument("target")
@click.option("--input", "input_path", required=True, metavar="FILE|-", help="InfluxDB line protocol to replay, gzip or not; '-' reads stdin. A Kapacitor recording by its name: FILE.srpl ('kapacitor record stream': each point keeps its database and retention policy) or FILE.brpl ('kapacitor record batch'/'query': each recorded batch replayed as one batch, its group as recorded).")
@click.option("--option", "-o", "option_calls", multiple=True, metavar="NAME=VALUE[,VALUE...]", help="A TICKscript call .NAME(VALUE, ...), repeatable, typed as TICKscript types it: 10 INT, 1.5 DOUBLE, 'avg' or avg STRING, true BOOL, 10s DURATION.")
@click.option("--output", "output_path", default="-", show_default=True, metavar="FILE|-", help="Where the UDF's output goes, as line protocol.")
@click.option("--group-by", multiple=True, metavar="TAG", help="Group points by this tag, as groupBy() does; repeatable. Without it, all points are one group.")
@click.option("--batch-every", callback=_tick_duration_ns, metavar="DURATION", help="For batch UDFs: cut each group's points into batches of this period, aligned as window().period(d).every(d).align() cuts them. Required for batch UDFs.")
@click.option("--precision", type=click.Choice(["ns", "us", "ms", "s"]), default="ns", show_default=True, help="Unit of the input's timestamps.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png", help="Also draw each group's input and output series over time into one PNG (needs the 'plot' extra).")
@click.option("--in-process", is_flag=True, help="Compute in this process instead of on Spark (the same code Spark's workers run): no JVM, quick tries.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--remote", envvar="SPARK_REMOTE", callback=_connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to compute on instead of --master.")
@click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="warning", show_default=True)
@_allow_module_option
def replay(target: str, input_path: str, option_calls: tuple[str, ...], output_path: str, group_by: tuple[str, ...], batch_every: int | None, precision: str, plot_path: str | None, in_process: bool, master: str, remote: str | None, confs: tuple[tuple[str, str], ...], log_level: str, allow_modules: tuple[str, ...]) -> None:
    """Run TARGET over line protocol, without Kapacitor, and write its output as line protocol.

    The points go through the real agent (session, codec, micro-batches, Spark) as
    Kapacitor's would: stream UDFs get them in time order, batch UDFs per --batch-every
    window. A progress bar shows on stderr when it is a terminal.

    \b
    Example:
      udf-agent replay moving_avg --input cpu.lp.gz -o field=usage_user -o size=10 \\
          --group-by host --plot cpu.png > averaged.lp
    """
    from udf_agent.runtime.agent import AgentConfig
    from udf_agent.runtime.logs import configure_logging
    from udf_agent.runtime.transports import claim_stdout
    from udf_agent.tools.lineproto import LineProtocolError, format_point, open_input, read_points
    from udf_agent.tools.recordings import BATCH_EXTENSION, STREAM_EXTENSION, RecordingError, read_batch_recording, read_stream_recording
    from udf_agent.tools.replay import REPLAY_DRAIN_TIMEOUT, ReplayError, in_process_engines, replay_points
    from udf_agent.tools.tickscript import TickError, parse_call

    if plot_path is not None and _missing_modules((("matplotlib", "matplotlib"),)):
        raise click.UsageError("--plot needs matplotlib, which is not installed here: pip install 'udf-agent[plot]'")
    configure_logging(log_level)
    out_fd = claim_stdout() if output_path == "-" else None
    spec = _load(target)
    try:
        calls = [parse_call(call) for call in option_calls]
    except TickError as exc:
        raise click.BadParameter(str(exc), param_hint="--option") from None
    batch_recording = input_path.endswith(BATCH_EXTENSION)
    if batch_recording and (batch_every is not None or group_by):
        raise click.UsageError("a batch recording (.brpl) is replayed batch by batch as recorded, groups included: drop --batch-every and --group-by")
    if spec.wants == "batch" and batch_every is None and not batch_recording:
        raise click.UsageError(f"{spec.name} wants batches: say how to cut them with --batch-every DURATION")
    recorded_batches = None
    try:
        if batch_recording:
            recorded_batches = read_batch_recording(input_path)
            points = [point for batch in recorded_batches for point in batch.points]
        elif input_path.endswith(STREAM_EXTENSION):
            points = list(read_stream_recording(input_path, precision))
        else:
            with open_input(input_path, sys.stdin.buffer) as stream:
                points = list(read_points(stream, "stdin" if input_path == "-" else input_path, precision))
    except OSError as exc:
        raise click.BadParameter(f"cannot read {input_path!r}: {exc.strerror or exc}", param_hint="--input") from None
    except (LineProtocolError, RecordingError) as exc:
        raise click.ClickException(str(exc)) from None
    # Every micro-batch on Spark (none computed in the agent while it starts): what a task would run.
    engines = in_process_engines() if in_process else _engines(master, confs, remote=remote, local_while_starting=False)
    keep_for_plot = plot_path is not None
    written = 0
    outputs = []
    try:
        with _output_file(output_path, out_fd) as out, _progress(len(points)) as progress:
            config = AgentConfig(drain_timeout=REPLAY_DRAIN_TIMEOUT, allow_modules=allow_modules)
            replayed = replay_points(spec, engines, calls, points, group_by=group_by, batch_every_ns=batch_every, recorded_batches=recorded_batches, config=config, on_progress=progress)
            for point in replayed:
                line = format_point(point.name, point.tags, point.fields, point.time)
                if line:
                    out.write(line + "\n")
                    written += 1
                if keep_for_plot:
                    outputs.append(point)
    except (ReplayError, TickError) as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        engines.stop()
    click.echo(f"replayed {len(points)} point(s) through {spec.name}: {written} point(s) out", err=True)
    if plot_path is not None:
        from udf_agent.tools.plot import PlotError, save_replay_plot

        title = f"{spec.name}({', '.join(option_calls)})"
        try:
            save_replay_plot(plot_path, title, points, outputs, group_by, _named_fields(calls))
        except PlotError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"plot: {plot_path}", err=True)


def _named_fields(calls: list[udf_pb2.Option]) -> list[str]:
    """The string values of the options: the input fields worth plotting, when they name some."""
    from udf_agent import udf_pb2

    return [value.stringValue for call in calls for value in call.values if value.type == udf_pb2.STRING]


@contextlib.contextmanager
def _output_file(path: str, stdout_fd: int | None) -> Iterator[TextIO]:
    if stdout_fd is not None:
        with os.fdopen(stdout_fd, "w", encoding="utf-8", buffering=1 << 16) as out:
            yield out
        return
    try:
        out = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise click.BadParameter(f"cannot write {path!r}: {exc.strerror or exc}", param_hint="--output") from None
    with out:
        yield out


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr when it is a terminal (click draws none otherwise): points/s and ETA."""
    import time

    if not sys.stderr.isatty():
        yield None  # click would still print the label
        return
    started = time.monotonic()
    with click.progressbar(length=total, label="replay", file=sys.stderr, show_eta=True, show_pos=True, item_show_func=lambda rate: rate) as bar:

        def report(points_sent: int) -> None:
            elapsed = max(time.monotonic() - started, 1e-9)
            bar.update(points_sent - bar.pos, f"{points_sent / elapsed:,.0f} points/s")

        yield report


@main.command()
@click.option("--master", default="local[*]", show_default=True, help="Spark master to start, as for run.")
@click.option("--remote", envvar="SPARK_REMOTE", callback=_connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to reach instead.")
@click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable.")
@click.option("--socket-dir", default=SOCKET_DIR, show_default=True, type=click.Path(file_okay=False), help="Where socket UDFs will listen (udf-agent serve --socket).")
def doctor(master: str, remote: str | None, confs: tuple[tuple[str, str], ...], socket_dir: str) -> None:
    """Check that this machine can run UDFs: Python, Java, PySpark, a Spark started and timed,
    the socket directory. One line each, OK or what to do; exit 1 if any fails."""
    from udf_agent.runtime.logs import configure_logging
    from udf_agent.tools.doctor import run_checks

    configure_logging("error")  # the checks' lines say it all

    def make_spark() -> SparkEngine:
        from spark_backend import SparkEngine, SparkSettings

        return SparkEngine(SparkSettings(master=master, conf=dict(confs), remote=remote))

    failed = 0
    for check in run_checks(make_spark, socket_dir, uses_java=remote is None):
        click.echo(f"{'OK  ' if check.ok else 'FAIL'} {check.name}: {check.detail}")
        failed += not check.ok
    if failed:
        raise click.ClickException(f"{failed} check(s) failed")


@main.command(cls=_TargetCommand)
@click.argument("target")
@click.option("--kapacitor-conf", "conf_name", metavar="NAME", help="Print the kapacitor.conf block and a TICKscript call for NAME.")
@click.argument("script_args", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
def info(target: str, script_args: tuple[str, ...], conf_name: str | None) -> None:
    """Show TARGET's wants, provides and options."""
    spec = _load(target, script_args)
    if conf_name:
        click.echo(kapacitor_conf(conf_name, target, spec))
        return
    for line in describe(spec):
        click.echo(line)


@main.command(name="list")
def list_builtins() -> None:
    """List the built-in UDFs."""
    from udf_agent.targets import builtin_specs

    for name, spec in builtin_specs().items():
        click.echo(f"{name:<12} {spec.wants}->{spec.provides}  {spec.description}")


# Kapacitor waits for the process's exit after our output ends: Spark gets this long
# to stop cleanly; its JVM exits by itself once this process is gone.
SPARK_STOP_GRACE = 2.0


def _exit(code: int, engines: Engines) -> None:
    """Ends the process once every frame is out: Spark's JVM follows its parent down."""
    import threading

    stopper = threading.Thread(target=engines.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=SPARK_STOP_GRACE)
    sys.stderr.flush()
    os._exit(code)
