"""What ``udf-agent info`` and the help of commands taking a TARGET print: a UDF's
description and options, and the kapacitor.conf block (with a TICKscript call) that runs it."""

from __future__ import annotations

import os
import shutil
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from udf_agent.api import UDFSpec

# Where socket UDFs listen by default: what `info --kapacitor-conf` prints and `doctor` checks.
SOCKET_DIR = "/var/run/udf-agent"
# Where stream_fn's functions live, in the block `info --kapacitor-conf` prints: the reader's to fill in.
FUNCTIONS_DIR = "/path/to/your/functions"


def describe(spec: UDFSpec) -> list[str]:
    """A UDF's description, edges and options, one per line, as ``info`` prints them."""
    from udf_agent.tools.tickscript import render_arguments

    lines = [f"{spec.name}: {spec.description}" if spec.description else spec.name, f"  wants: {spec.wants}   provides: {spec.provides}"]
    if spec.handler is not None:
        from udf_agent import udf_pb2

        declared = udf_pb2.InfoResponse.FromString(spec.handler.info).options
        names = {udf_pb2.BOOL: "BOOL", udf_pb2.INT: "INT", udf_pb2.DOUBLE: "DOUBLE", udf_pb2.STRING: "STRING", udf_pb2.DURATION: "DURATION"}
        calls = [f"    .{name}({', '.join(names[t] for t in declared[name].valueTypes)})" for name in sorted(declared)]
        return [*lines, "  options (checked by the script's own init()):" if calls else "  options: none", *calls]
    if not spec.options:
        return [*lines, "  options: none"]
    lines.append("  options:")
    for option in spec.options:
        if option.multiple:
            default = "repeatable"
        elif option.required:
            default = "required"
        else:
            default = f"default {render_arguments(option.default_value(), option)}"
        line = f"    .{option.name}({', '.join(option.type_names())})  {default}"
        lines.append(f"{line}  {option.help}" if option.help else line)
    return lines


def builtins_help() -> list[str]:
    """Every built-in UDF with its edges and options, for the help of commands taking a TARGET."""
    from udf_agent.targets import builtin_specs

    return [line for spec in builtin_specs().values() for line in describe(spec)]


def kapacitor_conf(name: str, target: str, spec: UDFSpec) -> str:
    """The kapacitor.conf block that runs TARGET as the UDF NAME (process and socket forms),
    and a TICKscript that calls it."""
    from udf_agent.targets import builtin_specs
    from udf_agent.tools.tickscript import render_arguments, render_example

    prog, args = agent_command()
    if spec.handler is not None:
        target = spec.handler.path
    args = [*args, "run", target, *(["--", *spec.handler.args] if spec.handler is not None and spec.handler.args else [])]
    lines = [
        f"[udf.functions.{name}]",
        f'  prog = "{prog}"',
        "  args = [" + ", ".join(f'"{a}"' for a in args) + "]",
        '  timeout = "10s"',
    ]
    environment = ""
    if spec.handler is not None:
        lines += [
            "  # Or, as for Kapacitor's own agent (the script imports udf-agent's kapacitor.udf.agent):",
            f'  # prog = "{sys.executable}"',
            "  # args = [" + ", ".join(f'"{a}"' for a in ["-u", spec.handler.path, *spec.handler.args]) + "]",
        ]
    elif target not in builtin_specs():
        lines += [f"  [udf.functions.{name}.env]", f'    PYTHONPATH = "{import_root(target)}"']
        environment = f"PYTHONPATH={import_root(target)} "
    elif spec.resolve is not None:
        allowing = [*args[:-1], "--allow-module", "mypkg", target]
        lines += [
            f"  # {target} imports the modules .fn() names only from the directories on PYTHONPATH,",
            "  # never from the working directory, the standard library or site-packages: whoever",
            "  # defines a task names the module, and importing it runs its code. To allow a package",
            "  # installed elsewhere (and its submodules):",
            "  #   args = [" + ", ".join(f'"{a}"' for a in allowing) + "]",
            f"  [udf.functions.{name}.env]",
            f'    PYTHONPATH = "{FUNCTIONS_DIR}"',
        ]
        environment = f"PYTHONPATH={FUNCTIONS_DIR} "
    socket_path = os.path.join(SOCKET_DIR, f"{name}.sock")
    serve = " ".join([prog, *args[:-2], "serve", "--socket", socket_path, target])
    lines += [
        "",
        "# Or a socket UDF: one server, its Spark shared by every task. Run",
        f"#   {environment}{serve}",
        "# and use this block instead of the one above:",
        f"# [udf.functions.{name}]",
        f'#   socket = "{socket_path}"',
        '#   timeout = "10s"',
    ]
    # A repeatable option shows one call when it has an example (stream_fn's .opt()).
    call = "".join(
        f".{o.name}({render_arguments(o.example, o) if o.multiple else render_example(o)})" for o in spec.options if not o.multiple or o.example is not None
    ) if spec.handler is None else _handler_calls(spec.handler.info)
    source = "stream\n    |from()\n        .measurement('cpu')" if spec.wants == "stream" else "batch\n    |query('SELECT * FROM \"telegraf\".\"autogen\".\"cpu\"')\n        .period(1m)\n        .every(1m)"
    lines += ["", "// TICKscript", f"{source}\n    @{name}(){call}"]
    return "\n".join(lines)


def _handler_calls(info: bytes) -> str:
    """TICKscript calls for the options a Handler's InfoResponse declares, a value of each type."""
    from udf_agent import udf_pb2

    examples = {udf_pb2.BOOL: "TRUE", udf_pb2.INT: "10", udf_pb2.DOUBLE: "1.5", udf_pb2.STRING: "'value'", udf_pb2.DURATION: "10s"}
    declared = udf_pb2.InfoResponse.FromString(info).options
    return "".join(f".{name}({', '.join(examples[t] for t in declared[name].valueTypes)})" for name in sorted(declared))


def import_root(target: str) -> str:
    """The directory Kapacitor's PYTHONPATH needs for TARGET's module (already imported) to import."""
    module_name = target.partition(":")[0]
    path = os.path.abspath(sys.modules[module_name].__file__ or os.curdir)
    if os.path.basename(path) == "__init__.py":
        path = os.path.dirname(path)
    for _ in module_name.split("."):
        path = os.path.dirname(path)
    return path


def agent_command() -> tuple[str, list[str]]:
    """How Kapacitor should start this agent: the console script, else ``python -m``."""
    if os.path.basename(sys.argv[0]) == "udf-agent":
        return os.path.abspath(shutil.which(sys.argv[0]) or sys.argv[0]), []
    beside = os.path.join(os.path.dirname(sys.executable), "udf-agent")
    script = beside if os.access(beside, os.X_OK) else shutil.which("udf-agent")
    if script:
        return os.path.abspath(script), []
    return sys.executable, ["-m", "udf_agent"]
