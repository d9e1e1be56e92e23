"""The commands for people: check, status, replay, doctor, info, list."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TextIO

import click

from udf_agent.cli.group import load_target, main
from udf_agent.cli.params import ConfType, DurationType, TargetCommand, allow_module_option, connect_url, missing_modules, tick_duration_ns
from udf_agent.tools.describe import SOCKET_DIR, describe, kapacitor_conf

if TYPE_CHECKING:
    from spark_backend import SparkEngine


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


@main.command(cls=TargetCommand)
@click.argument("target")
@click.option("--input", "input_path", required=True, metavar="FILE|-", help="InfluxDB line protocol to replay, gzip or not; '-' reads stdin. A Kapacitor recording by its name: FILE.srpl ('kapacitor record stream': each point keeps its database and retention policy) or FILE.brpl ('kapacitor record batch'/'query': each recorded batch replayed as one batch, its group as recorded).")
@click.option("--option", "-o", "option_calls", multiple=True, metavar="NAME=VALUE[,VALUE...]", help="A TICKscript call .NAME(VALUE, ...), repeatable, typed as TICKscript types it: 10 INT, 1.5 DOUBLE, 'avg' or avg STRING, true BOOL, 10s DURATION.")
@click.option("--output", "output_path", default="-", show_default=True, metavar="FILE|-", help="Where the UDF's output goes, as line protocol.")
@click.option("--group-by", multiple=True, metavar="TAG", help="Group points by this tag, as groupBy() does; repeatable. Without it, all points are one group.")
@click.option("--batch-every", callback=tick_duration_ns, metavar="DURATION", help="For batch UDFs: cut each group's points into batches of this period, aligned as window().period(d).every(d).align() cuts them. Required for batch UDFs.")
@click.option("--precision", type=click.Choice(["ns", "us", "ms", "s"]), default="ns", show_default=True, help="Unit of the input's timestamps.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), metavar="FILE.png", help="Also draw each group's input and output series over time into one PNG (needs the 'plot' extra).")
@click.option("--in-process", is_flag=True, help="Compute in this process instead of on Spark (the same code Spark's workers run): no JVM, quick tries.")
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--remote", envvar="SPARK_REMOTE", callback=connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to compute on instead of --master.")
@click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False), default="warning", show_default=True)
@allow_module_option
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
    from udf_agent.cli.engines import spark_engines
    from udf_agent.logs import configure_logging
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.stdio import claim_stdout
    from udf_agent.tools.lineproto import LineProtocolError, format_point
    from udf_agent.tools.recordings import BATCH_EXTENSION, RecordingError
    from udf_agent.tools.replay import REPLAY_DRAIN_TIMEOUT, ReplayError, in_process_engines, read_replay_input, replay_points
    from udf_agent.tools.tickscript import TickError, parse_call

    if plot_path is not None and missing_modules((("matplotlib", "matplotlib"),)):
        raise click.UsageError("--plot needs matplotlib, which is not installed here: pip install 'udf-agent[plot]'")
    configure_logging(log_level)
    out_fd = claim_stdout() if output_path == "-" else None
    spec = load_target(target)
    try:
        calls = [parse_call(call) for call in option_calls]
    except TickError as exc:
        raise click.BadParameter(str(exc), param_hint="--option") from None
    batch_recording = input_path.endswith(BATCH_EXTENSION)
    if batch_recording and (batch_every is not None or group_by):
        raise click.UsageError("a batch recording (.brpl) is replayed batch by batch as recorded, groups included: drop --batch-every and --group-by")
    if spec.wants == "batch" and batch_every is None and not batch_recording:
        raise click.UsageError(f"{spec.name} wants batches: say how to cut them with --batch-every DURATION")
    try:
        points, recorded_batches = read_replay_input(input_path, precision, sys.stdin.buffer)
    except OSError as exc:
        raise click.BadParameter(f"cannot read {input_path!r}: {exc.strerror or exc}", param_hint="--input") from None
    except (LineProtocolError, RecordingError) as exc:
        raise click.ClickException(str(exc)) from None
    # Every micro-batch on Spark (none computed in the agent while it starts): what a task would run.
    engines = in_process_engines() if in_process else spark_engines(master, confs, remote=remote, local_while_starting=False)
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
        from udf_agent.tools.plot import PlotError, fields_named_by, save_replay_plot

        title = f"{spec.name}({', '.join(option_calls)})"
        try:
            save_replay_plot(plot_path, title, points, outputs, group_by, fields_named_by(calls))
        except PlotError as exc:
            raise click.ClickException(str(exc)) from None
        click.echo(f"plot: {plot_path}", err=True)


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
@click.option("--remote", envvar="SPARK_REMOTE", callback=connect_url, metavar="sc://HOST:PORT", help="A Spark Connect server to reach instead.")
@click.option("--conf", "confs", type=ConfType(), multiple=True, help="Spark configuration, repeatable.")
@click.option("--socket-dir", default=SOCKET_DIR, show_default=True, type=click.Path(file_okay=False), help="Where socket UDFs will listen (udf-agent serve --socket).")
def doctor(master: str, remote: str | None, confs: tuple[tuple[str, str], ...], socket_dir: str) -> None:
    """Check that this machine can run UDFs: Python, Java, PySpark, a Spark started and timed,
    the socket directory. One line each, OK or what to do; exit 1 if any fails."""
    from udf_agent.logs import configure_logging
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


@main.command()
def prepare() -> None:
    """Build the class archive of Spark's JVM for this machine's Java and PySpark: every later
    Spark start (a task's, the shared server's) maps it instead of loading and checking its
    classes, and takes about half as long. Takes a minute or two (two Spark starts).

    Run it as the user Kapacitor runs UDFs as (sudo -u kapacitor udf-agent prepare), or with
    the same UDF_AGENT_CACHE_DIR; again after upgrading Java or udf-agent, whose new archive it
    builds (a start without its archive goes on as before)."""
    from spark_backend.class_archive import ArchiveError, build
    from spark_backend.java import JavaError, check_java

    try:
        java, _ = check_java()
        archive = build(java, lambda line: click.echo(line, err=True))
    except (JavaError, ArchiveError) as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(f"cannot write the archive: {exc}") from None
    click.echo(f"Spark's class archive: {archive.path} ({archive.size / 2**20:.0f} MiB)")


@main.command(cls=TargetCommand)
@click.argument("target")
@click.option("--kapacitor-conf", "conf_name", metavar="NAME", help="Print the kapacitor.conf block and a TICKscript call for NAME.")
@click.argument("script_args", nargs=-1, metavar="[-- SCRIPT_ARGS...]")
def info(target: str, script_args: tuple[str, ...], conf_name: str | None) -> None:
    """Show TARGET's wants, provides and options."""
    spec = load_target(target, script_args)
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
