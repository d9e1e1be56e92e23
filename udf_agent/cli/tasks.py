"""The commands that serve Kapacitor: run (a process UDF), serve (a socket UDF) and the
shared Spark server that 'run' starts."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from udf_agent.cli.group import load_target, main
from udf_agent.cli.params import SERVER_METRICS, DurationType, TargetCommand, compute_options, log_format_option, metrics_option, split_engine_options

if TYPE_CHECKING:
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.engines import Engines
    from udf_agent.serve.socket_server import UnixSocketServer


@main.command(cls=TargetCommand)
@click.argument("target")
@click.argument("script_args", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
@compute_options
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
@metrics_option(
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
    engine_options, agent_options = split_engine_options(options, confs)
    from udf_agent.api import names_a_script
    from udf_agent.serve.placement import Invocation, relays

    if names_a_script(target):
        target = os.path.abspath(target)
    elif script_args:
        raise click.UsageError(f"arguments after TARGET ({' '.join(script_args)}) are for a Kapacitor Handler script (path/to/script.py) only")
    invocation = click.get_current_context().obj  # when entry.py parsed the command line
    invocation = invocation if isinstance(invocation, Invocation) else None
    if relays(target, own_spark):
        settings = {"master": master, "confs": [list(conf) for conf in confs], **engine_options}
        server_args = ["--log-format", log_format, *(["--metrics-address", metrics_address] if metrics_address else [])]
        from click.core import ParameterSource

        from udf_agent.serve.relay import relay_launch
        from udf_agent.serve.shared import ServerOptions, ServerStart

        # What the command line gave: a task that gave no --shared-idle-exit asks none of a server already up.
        idle_exit_given = click.get_current_context().get_parameter_source("shared_idle_exit") is not ParameterSource.DEFAULT
        asked_of_server = ServerOptions(metrics_address, shared_idle_exit if idle_exit_given else None)
        relay_launch(target, agent_options, ServerStart(settings, shared_idle_exit, server_args), log_level, log_format, asked_of_server, invocation.argv if invocation else None, script_args, invocation.relay_input if invocation else None)
    assert invocation is None or invocation.relay_input is None, "placement.relays_for_sure took this run for a relayed one"
    from udf_agent.cli.engines import spark_engines
    from udf_agent.logs import configure_logging
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import exit_process
    from udf_agent.runtime.stop_signals import on_stop_signals
    from udf_agent.runtime.transports import claim_stdio

    # Before anything else runs (the UDF's module included), so no print can reach the protocol.
    connection = claim_stdio()
    configure_logging(log_level, log_format)
    engines = spark_engines(master, confs, **engine_options)
    agent = Agent(None, connection, engines, AgentConfig.from_options(agent_options))
    _serve_metrics(metrics_address, lambda: [agent], engines.describe)
    on_stop_signals(agent.stop_reading, "finishing accepted work, then exiting")
    # Keepalives are answered while the UDF's module (often pandas and more) imports.
    agent.start_reading()
    code = agent.run(load_target(target, script_args))
    exit_process(code, engines)


@main.command(cls=TargetCommand)
@click.option("--socket", "socket_path", required=True, type=click.Path(dir_okay=False), help="Unix socket to listen on.")
@click.option("--socket-mode", default="0660", show_default=True, help="Permissions of the socket file (octal).")
@click.option("--max-connections", type=click.IntRange(min=1), default=64, show_default=True, help="Open sessions at most; a connection beyond gets an ErrorResponse saying so and is closed.")
@click.option("--init-timeout", type=DurationType(), default="60s", show_default=True, help="A connection that sends no InitRequest within this long is closed with an ErrorResponse.")
@metrics_option(SERVER_METRICS)
@click.argument("target")
@compute_options
def serve(socket_path: str, socket_mode: str, max_connections: int, init_timeout: float, metrics_address: str | None, target: str, master: str, confs: tuple[tuple[str, str], ...], log_level: str, log_format: str, **options: Any) -> None:
    """Serve TARGET on a unix socket: one independent session per connection."""
    from udf_agent.cli.engines import spark_engines
    from udf_agent.logs import configure_logging
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.serve.socket_server import UnixSocketServer

    try:
        mode = int(socket_mode, 8)
    except ValueError:
        raise click.BadParameter(f"{socket_mode!r} is not an octal mode such as 0660", param_hint="--socket-mode") from None
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{socket_mode!r} is not a file mode", param_hint="--socket-mode")
    configure_logging(log_level, log_format)
    spec = load_target(target)
    engine_options, agent_options = split_engine_options(options, confs)
    engines = spark_engines(master, confs, **engine_options)
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
@click.option("--settings", "settings_json", required=True, help="The Spark settings, as JSON: 'master', 'confs' and the engine options of 'run'; '-' reads them from stdin (how 'run' passes them: a --conf may hold a secret, and a command line is anyone's to read).")
@click.option("--idle-exit", type=DurationType(), default="10m", show_default=True, help="Exit after serving no task for this long.")
@click.option("--max-connections", type=click.IntRange(min=1), default=1000, show_default=True, help="Tasks at most; one beyond gets an ErrorResponse saying so.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="info", show_default=True)
@log_format_option
@metrics_option(SERVER_METRICS)
def shared_server(socket_path: str, settings_json: str, idle_exit: float, max_connections: int, log_level: str, log_format: str, metrics_address: str | None) -> None:
    """The host's shared Spark server, which 'run' starts on first use: not normally run by hand.

    Every process UDF ('udf-agent run', unless --own-spark) with the same install and Spark
    settings relays its task here; the tasks share one Spark and its resident workers. It
    listens in a directory only its user may enter ($UDF_AGENT_SHARED_DIR, else
    $XDG_RUNTIME_DIR/udf-agent, else /tmp/udf-agent-UID), logs to the .log file beside
    its socket, and exits after --idle-exit with no task."""
    import json
    import sys

    from udf_agent.cli.engines import spark_engines
    from udf_agent.logs import configure_logging
    from udf_agent.serve.shared_server import shared_socket_server

    try:
        settings = json.loads(sys.stdin.read() if settings_json == "-" else settings_json)
        engines = spark_engines(settings.pop("master"), tuple((key, value) for key, value in settings.pop("confs")), **settings)
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
    from udf_agent.runtime.engines import exit_process
    from udf_agent.runtime.stop_signals import on_stop_signals
    from udf_agent.serve.socket_server import SocketServerError

    try:
        server.bind()
    except SocketServerError as exc:
        raise click.ClickException(str(exc)) from None
    on_stop_signals(server.shutdown, "finishing accepted work, then exiting")
    warm_up()
    server.serve_forever()
    exit_process(0, engines)


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
