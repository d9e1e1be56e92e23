"""The udf-agent command line, through click's CliRunner."""

import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from udf_agent import __version__
from udf_agent.cli import main

ROOT = os.path.dirname(os.path.dirname(__file__))


@pytest.fixture
def runner():
    return CliRunner()


def test_version(runner):
    result = runner.invoke(main, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_list_shows_every_builtin(runner):
    result = runner.invoke(main, ["list"])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert [line.split()[0] for line in lines] == ["mirror", "moving_avg", "outliers", "ewma", "zscore", "mad", "resample", "forecast", "ttest", "stream_fn", "batch_fn"]
    assert "stream->stream" in lines[0] and "batch->batch" in lines[2]


def test_info_lists_options_with_types_and_defaults(runner):
    result = runner.invoke(main, ["info", "moving_avg"])
    assert result.exit_code == 0
    assert "wants: stream   provides: stream" in result.output
    assert ".field(STRING)  required" in result.output
    assert ".size(INT)  required" in result.output
    assert ".as(STRING)  default 'avg'" in result.output
    outliers = runner.invoke(main, ["info", "outliers"]).output
    assert ".scale(DOUBLE)  default 1.5" in outliers and "wants: batch   provides: batch" in outliers


def test_kapacitor_conf_for_a_builtin(runner):
    result = runner.invoke(main, ["info", "moving_avg", "--kapacitor-conf", "movingAvg"])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "[udf.functions.movingAvg]"
    prog = lines[1].split('"')[1]
    assert os.path.isabs(prog)
    assert lines[2] == '  args = ["run", "moving_avg"]'
    assert lines[3] == '  timeout = "10s"'
    assert "@movingAvg().field('usage_user').size(10).as('avg')" in result.output
    assert "PYTHONPATH" not in result.output
    # The socket form too, commented out: the serve command and the block that goes with it.
    assert f"#   {prog} serve --socket /var/run/udf-agent/movingAvg.sock moving_avg" in lines
    assert lines[lines.index("# [udf.functions.movingAvg]") + 1] == '#   socket = "/var/run/udf-agent/movingAvg.sock"'


def test_kapacitor_conf_writes_a_duration_default_as_a_tickscript_duration(runner):
    result = runner.invoke(main, ["info", "resample", "--kapacitor-conf", "resample"])
    assert result.exit_code == 0, result.output
    assert "@resample().every(1m)" in result.output and "Duration(" not in result.output


def test_kapacitor_conf_names_the_installed_console_script():
    script = os.path.join(os.path.dirname(sys.executable), "udf-agent")
    if not os.path.exists(script):
        pytest.skip("the console script is not installed next to this interpreter")
    output = subprocess.run([script, "info", "moving_avg", "--kapacitor-conf", "movingAvg"], capture_output=True, text=True, check=True).stdout
    assert f'  prog = "{script}"' in output


def test_kapacitor_conf_for_a_user_udf_sets_its_import_path(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = runner.invoke(main, ["info", "tests.udfs.sample:Scale", "--kapacitor-conf", "scale"])
    assert result.exit_code == 0, result.output
    assert '  args = ["run", "tests.udfs.sample:Scale"]' in result.output
    assert f'    PYTHONPATH = "{ROOT}"' in result.output
    assert "@scale().field('value').factor(2.0)" in result.output


@pytest.mark.parametrize(
    "target, message",
    [
        ("nope", "neither a built-in"),
        ("no_such_module_xyz:udf", "cannot import module 'no_such_module_xyz'"),
        ("tests.udfs.sample:missing", "has no attribute 'missing'"),
        ("tests.udfs.sample:not_a_udf", "is not a UDF"),
        ("tests.udfs.sample:", "package.module:attribute"),
    ],
)
@pytest.mark.parametrize("command", [["info"], ["run"], ["serve", "--socket", "never-created.sock"]], ids=["info", "run", "serve"])
def test_a_bad_target_is_a_usage_error(runner, monkeypatch, tmp_path, command, target, message):
    monkeypatch.chdir(ROOT)
    result = subprocess.run([sys.executable, "-m", "udf_agent", *command, target], capture_output=True, text=True, cwd=ROOT, stdin=subprocess.DEVNULL)
    assert result.returncode == 2
    assert message in result.stderr
    if command == ["run"]:
        assert result.stdout == ""
    assert not os.path.exists(os.path.join(ROOT, "never-created.sock"))
    assert "Traceback" not in result.stderr


def test_bad_durations_and_conf_are_usage_errors(runner):
    for args, message in (
        (["run", "mirror", "--flush-interval", "soon"], "is not a duration"),
        (["run", "mirror", "--conf", "novalue"], "key=value"),
        (["run", "mirror", "--max-batch-points", "0"], "max-batch-points"),
        (["run", "mirror", "--drain-timeout", "0s"], "greater than zero"),
        (["serve", "--socket", "/tmp/x.sock", "--socket-mode", "rw", "mirror"], "octal"),
        (["run", "mirror", "--max-cores", "2", "--resident-slots", "2"], "--max-cores bounds cores that grow with the load; --resident-slots fixes them"),
        (["run", "mirror", "--max-cores", "2", "--conf", "spark.cores.max=3"], "--conf spark.cores.max fixes them"),
        (["serve", "--socket", "/tmp/x.sock", "--max-cores", "2", "--resident-slots", "1", "mirror"], "--resident-slots fixes them"),
        (["run", "mirror", "--max-cores", "0"], "max-cores"),
    ):
        result = runner.invoke(main, args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output



@pytest.mark.parametrize("text, seconds", [("250ms", 0.25), ("1.5s", 1.5), ("2m", 120.0), ("1h", 3600.0), ("500 us", 0.0005), ("10µs", 1e-5), ("7ns", 7e-9)])
def test_command_line_durations_take_decimals_and_go_units(text, seconds):
    from udf_agent.cli.params import DurationType

    assert DurationType().convert(text, None, None) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["1d", "1w", "10u", "-1s", "soon"])
def test_command_line_durations_refuse_what_tickscript_alone_takes(runner, text):
    result = runner.invoke(main, ["run", "mirror", "--flush-interval", text])
    assert result.exit_code == 2 and "is not a duration" in result.output

def test_kapacitor_conf_prints_defaults_as_tickscript_literals(runner, monkeypatch):
    monkeypatch.chdir(ROOT)
    result = runner.invoke(main, ["info", "tests.udfs.sample:tick_defaults", "--kapacitor-conf", "t"])
    assert result.exit_code == 0, result.output
    assert "@t().every(5s).tiny(0.0000001).pair(2, 1500ms)" in result.output


@pytest.mark.parametrize("command", ["run", "serve"])
def test_help_documents_the_stop_and_hot_path_options(runner, command):
    result = runner.invoke(main, [command, "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "--drain-timeout" in text and "[default: 5s]" in text
    assert "--adaptive-flush / --no-adaptive-flush" in text
    assert "--local-max-points" in text
    assert "--local-while-starting / --no-local-while-starting" in text and "on with a local master, else off" in text
    assert "--spark-dispatch [resident|jobs]" in text and "[default: resident]" in text
    assert "--batch-timeout" in text and "[default: 60s]" in text


def test_engine_options_reach_the_spark_engine():
    from udf_agent.cli.engines import spark_engines

    engines = spark_engines("local[2]", (("spark.x", "1"),), spark_dispatch="jobs", batch_timeout=2.5)
    settings = engines._spark_factory().settings
    assert (settings.dispatch, settings.batch_timeout, settings.conf) == ("jobs", 2.5, {"spark.x": "1"})


def test_an_unknown_dispatch_is_a_usage_error(runner):
    result = runner.invoke(main, ["run", "mirror", "--spark-dispatch", "barrier"])
    assert result.exit_code == 2 and "--spark-dispatch" in result.output


def test_a_negative_local_budget_is_a_usage_error(runner):
    result = runner.invoke(main, ["run", "mirror", "--local-max-points", "-1"])
    assert result.exit_code == 2 and "--local-max-points" in result.output


def test_serve_help_documents_the_connection_limits(runner):
    result = runner.invoke(main, ["serve", "--help"])
    text = " ".join(result.output.split())
    assert "--max-connections" in text and "[default: 64;" in text
    assert "--init-timeout" in text and "[default: 60s]" in text


@pytest.mark.parametrize(
    ("value", "message"),
    [("bogus", "is not one of fail, skip, dead-letter:DIR"), ("dead-letter:", "needs a directory"), ("dead-letter", "is not one of")],
)
def test_a_bad_error_policy_is_a_usage_error(runner, value, message):
    result = runner.invoke(main, ["run", "mirror", "--on-error", value])
    assert result.exit_code == 2 and message in result.output


def test_the_dead_letter_directory_is_created_and_reaches_the_agent(tmp_path):
    from udf_agent.cli.params import ErrorPolicyType
    from udf_agent.runtime.config import AgentConfig

    directory = tmp_path / "letters" / "new"
    policy = ErrorPolicyType().convert(f"dead-letter:{directory}", None, None)
    assert directory.is_dir()
    config = AgentConfig.from_options({"on_error": policy})
    assert (config.on_error, config.dead_letter_dir) == ("dead-letter", str(directory))


@pytest.mark.parametrize("args, env", [(["--remote", "http://h:15002"], {}), ([], {"SPARK_REMOTE": "spark://h:7077"})])
def test_remote_must_be_a_spark_connect_url(runner, args, env):
    result = runner.invoke(main, ["run", "moving_avg", *args], env=env)
    assert result.exit_code == 2
    assert "is not a Spark Connect URL (sc://HOST:PORT)" in result.output


@pytest.mark.parametrize("command", ["run", "serve", "replay", "info"])
def test_help_of_commands_taking_a_target_lists_every_builtin_and_its_options(command):
    from udf_agent.targets import builtin_specs

    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0
    built_in = result.output.split("Built-in TARGETs", 1)[1]
    for name, spec in builtin_specs().items():
        assert f"\n  {name}: " in built_in
        for option in spec.options:
            assert f".{option.name}({', '.join(option.type_names())})" in built_in
    assert ".size(INT)  required" in built_in


def info_of_failing_target(tmp_path, monkeypatch, target, modules=None):
    """``udf-agent info TARGET`` run in TMP_PATH holding MODULES ({file name: source}): it must fail with exit code 2."""
    for name, source in (modules or {}).items():
        (tmp_path / name).write_text(source)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["info", target])
    assert result.exit_code == 2
    return result


def test_a_target_whose_import_fails_shows_the_users_traceback_not_ours(tmp_path, monkeypatch):
    result = info_of_failing_target(tmp_path, monkeypatch, "broken_udf:fn", {"broken_udf.py": "def helper():\n    return 1 / 0\n\nhelper()\n"})
    assert "Traceback (most recent call last):" in result.output
    assert 'broken_udf.py", line 2, in helper' in result.output
    assert "ZeroDivisionError: division by zero" in result.output
    assert "importlib" not in result.output and "targets.py" not in result.output


def test_a_target_module_not_found_gets_a_pythonpath_hint_with_kapacitors_env_block(tmp_path, monkeypatch):
    result = info_of_failing_target(tmp_path, monkeypatch, "nowhere_pkg.mod:fn")
    assert "No module named 'nowhere_pkg'" in result.output
    assert "Python looked for 'nowhere_pkg.mod' in sys.path:" in result.output
    assert str(tmp_path) in result.output
    assert "[udf.functions.NAME.env]" in result.output and "PYTHONPATH" in result.output


def test_a_missing_dependency_of_the_target_shows_where_it_is_imported(tmp_path, monkeypatch):
    result = info_of_failing_target(tmp_path, monkeypatch, "needs_lib:fn", {"needs_lib.py": "import not_an_installed_library\n"})
    assert 'needs_lib.py", line 1, in <module>' in result.output
    assert "No module named 'not_an_installed_library'" in result.output


def test_gather_reaches_the_agent_and_its_session():
    import socket

    from udf_agent.cli.params import split_engine_options
    from udf_agent.cli.tasks import run
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines
    from udf_agent.runtime.flushing import GATHER
    from udf_agent.runtime.transports import SocketConnection

    context = run.make_context("run", ["moving_avg", "--gather", "20ms"])
    command_only = {"target", "script_args", "master", "confs", "log_level", "log_format", "metrics_address", "own_spark", "shared_idle_exit"}
    _, agent_options = split_engine_options({name: value for name, value in context.params.items() if name not in command_only}, ())
    ours, theirs = socket.socketpair()
    with ours, theirs:
        agent = Agent(None, SocketConnection(theirs), Engines(LocalEngine), AgentConfig.from_options(agent_options))
        assert agent.inbox.flush_policy.gather == pytest.approx(0.02) != GATHER


@pytest.mark.parametrize("command", ["run", "serve", "replay"])
def test_remote_without_the_connect_client_says_what_to_install_before_doing_any_work(runner, monkeypatch, command):
    from udf_agent import versions

    present = versions.installed
    monkeypatch.setattr(versions, "installed", lambda package: None if package == "grpcio" else present(package))  # as after the README's plain install
    args = {"run": ["run", "moving_avg"], "serve": ["serve", "--socket", "/nonexistent/x.sock", "moving_avg"], "replay": ["replay", "moving_avg", "--input", "/nonexistent.lp"]}[command]
    result = runner.invoke(main, [*args, "--remote", "sc://localhost:15002"])
    assert result.exit_code == 2
    assert "--remote needs Spark Connect's client, and grpcio is not installed here: pip install 'udf-agent[connect]'" in result.output
    assert "Traceback" not in result.output


def test_allow_module_reaches_the_session_through_a_relays_handshake():
    import json
    import socket

    from udf_agent.cli.params import split_engine_options
    from udf_agent.cli.tasks import run
    from udf_agent.compute.engine import LocalEngine
    from udf_agent.runtime.agent import Agent
    from udf_agent.runtime.config import AgentConfig
    from udf_agent.runtime.engines import Engines
    from udf_agent.runtime.transports import SocketConnection

    context = run.make_context("run", ["stream_fn", "--allow-module", "mypkg", "--allow-module", "other.functions"])
    command_only = {"target", "script_args", "master", "confs", "log_level", "log_format", "metrics_address", "own_spark", "shared_idle_exit"}
    _, agent_options = split_engine_options({name: value for name, value in context.params.items() if name not in command_only}, ())
    handshake = json.loads(json.dumps({"agent": agent_options}))["agent"]  # as the shared server reads it
    ours, theirs = socket.socketpair()
    with ours, theirs:
        agent = Agent(None, SocketConnection(theirs), Engines(LocalEngine), AgentConfig.from_options(handshake))
        assert agent.session.binding.allow_modules == ("mypkg", "other.functions")
    # A launch remembered before the option existed carries none.
    assert AgentConfig.from_options({"on_error": ("fail", None)}).allow_modules == ()


@pytest.mark.parametrize("prefix", ["my-pkg", "mypkg.", "", "mypkg:fn"])
def test_an_allow_module_that_is_no_module_name_is_a_usage_error(runner, prefix):
    result = runner.invoke(main, ["run", "stream_fn", "--allow-module", prefix])
    assert result.exit_code == 2 and "is not a module name such as mypkg or mypkg.functions" in result.output


@pytest.mark.parametrize("command", ["run", "serve", "replay"])
def test_help_says_what_allow_module_allows_and_the_default(runner, command):
    text = " ".join(runner.invoke(main, [command, "--help"]).output.split())
    assert "--allow-module PREFIX" in text
    assert "(mypkg: mypkg and mypkg.mod, not mypkgx)" in text
    assert "Without it they import only modules found in the directories on this process's PYTHONPATH" in text


@pytest.mark.parametrize("target", ["stream_fn", "batch_fn"])
def test_kapacitor_conf_of_a_function_target_shows_pythonpath_and_allow_module(runner, target):
    shown = runner.invoke(main, ["info", target, "--kapacitor-conf", "pyFn"])
    assert shown.exit_code == 0, shown.output
    assert f'args = ["run", "{target}"]' in shown.output
    assert "imports the modules .fn() names only from the directories on PYTHONPATH" in shown.output
    assert f'#   args = ["run", "--allow-module", "mypkg", "{target}"]' in shown.output
    assert '[udf.functions.pyFn.env]\n    PYTHONPATH = "/path/to/your/functions"' in shown.output
    serve_line = next(line for line in shown.output.splitlines() if "serve --socket" in line)
    assert serve_line.startswith("#   PYTHONPATH=/path/to/your/functions ") and serve_line.endswith(f"/pyFn.sock {target}")


@pytest.mark.parametrize(
    ("argv", "environ", "sure"),
    [
        (["run", "moving_avg"], {}, True),
        (["run", "--flush-interval", "10ms", "moving_avg", "--log-level", "debug"], {}, True),
        (["run", "path/to/script.py", "--", "--window", "5"], {}, True),
        (["run", "moving_avg"], {"UDF_AGENT_OWN_SPARK": "0"}, True),
        (["run", "moving_avg"], {"UDF_AGENT_OWN_SPARK": " False "}, True),
        (["run", "moving_avg"], {"UDF_AGENT_OWN_SPARK": ""}, True),
        (["run", "moving_avg"], {"UDF_AGENT_OWN_SPARK": "1"}, False),
        (["run", "moving_avg"], {"UDF_AGENT_OWN_SPARK": "yes"}, False),
        (["run", "moving_avg", "--own-spark"], {}, False),
        (["run", "mirror"], {}, False),
        (["run", "--master", "spark://mirror:7077", "moving_avg"], {}, True),
        (["run", "--master", "mirror", "moving_avg"], {}, False),  # a master named so: relayed once parsed
        (["run", "moving_avg", "--help"], {}, False),
        (["run", "-h"], {}, False),
        (["run"], {}, False),
        (["serve", "moving_avg"], {}, False),
        ([], {}, False),
    ],
)
def test_a_run_is_relayed_from_the_first_moment_only_when_its_command_line_cannot_say_otherwise(argv, environ, sure):
    from udf_agent.cli.tasks import run
    from udf_agent.serve.placement import SPARK_FREE_BUILTINS, relays_for_sure

    assert relays_for_sure(argv, environ) is sure
    if sure:  # click, parsing the same command line, sends it to the shared server too
        with pytest.MonkeyPatch.context() as patch:
            for name, value in environ.items():
                patch.setenv(name, value)
            if "UDF_AGENT_OWN_SPARK" not in environ:
                patch.delenv("UDF_AGENT_OWN_SPARK", raising=False)
            params = run.make_context("run", argv[1:]).params
        assert not params["own_spark"] and params["target"] not in SPARK_FREE_BUILTINS
