"""Resolving a TARGET: a built-in name or ``package.module:attribute``."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import threading
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from udf_agent.api import UDFSpec, as_spec, names_a_script
from udf_agent.literals import literal
from udf_agent.options import Option, OptionsError, parse_options

if TYPE_CHECKING:
    from udf_agent import udf_pb2


class TargetError(Exception):
    """TARGET names no UDF; the message says why."""


def builtin_specs() -> dict[str, UDFSpec]:
    from udf_agent.library.builtins import BUILTINS

    return {**BUILTINS, **FUNCTION_TARGETS}


def resolve_target(target: str, script_args: Sequence[str] = (), *, working_directory: bool = True) -> UDFSpec:
    builtins = builtin_specs()
    if target in builtins:
        return builtins[target]
    if names_a_script(target):
        return script_spec(target, tuple(script_args))
    if script_args:
        raise TargetError(f"arguments after TARGET ({' '.join(script_args)}) are for a Kapacitor Handler script (TARGET ending in .py) only")
    if ":" not in target:
        raise TargetError(
            f"{target!r} is neither a built-in ({', '.join(sorted(builtins))}), nor of the form package.module:attribute, nor a Kapacitor Handler script (path/to/script.py)"
        )
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise TargetError(f"{target!r} must be of the form package.module:attribute")
    # Like `python -m`, let modules in the working directory be found (not .fn()'s: see
    # check_function_module).
    if working_directory and os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name):
            raise TargetError(f"cannot import module {module_name!r}: {exc}\n{_path_hint(module_name)}") from None
        raise TargetError(f"importing module {module_name!r} failed:\n{_user_traceback(exc)}{_path_hint(module_name)}") from None
    except Exception as exc:
        raise TargetError(f"importing module {module_name!r} failed:\n{_user_traceback(exc)}") from None
    obj = module
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise TargetError(f"module {module_name!r} has no attribute {attribute!r}") from None
    try:
        return as_spec(obj, target)
    except TypeError as exc:
        raise TargetError(str(exc)) from None


def script_spec(path: str, args: tuple[str, ...] = ()) -> UDFSpec:
    """A Kapacitor Handler script as a UDF: its ``__main__`` block runs here once, for its
    handler's Info (the edges and options it declares); each task gets a handler of its own
    where it computes."""
    from udf_agent import udf_pb2
    from udf_agent.compute.handlers import ScriptError, load_script

    try:
        script = load_script(path, args)
    except ScriptError as exc:
        raise TargetError(str(exc)) from None
    info = udf_pb2.InfoResponse.FromString(script.info)
    edges = {udf_pb2.STREAM: "stream", udf_pb2.BATCH: "batch"}

    def never_called(df: Any, ctx: Any) -> None:
        raise AssertionError(f"{script.name} runs as a Kapacitor Handler")

    return UDFSpec(
        name=script.name,
        function=never_called,
        wants=edges.get(info.wants, "stream"),
        provides=edges.get(info.provides, "stream"),
        description=f"Kapacitor Handler script {script.path}",
        handler=script,
    )


_fresh: dict[tuple[str, tuple[str, ...]], tuple[UDFSpec, float | None]] = {}
_fresh_lock = threading.Lock()


def resolve_fresh(target: str, script_args: Sequence[str] = (), *, working_directory: bool = True) -> UDFSpec:
    """``resolve_target``, but a user module (or Handler script) changed on disk since it was
    loaded is loaded afresh: a long-lived server (the shared one, or ``stream_fn``'s
    functions) runs a task redefined after an edit with the new code, while tasks already
    running keep theirs."""
    key = (target, tuple(script_args))
    with _fresh_lock:
        cached = _fresh.get(key)
        if cached is not None and cached[1] == _module_mtime(cached[0]):
            return cached[0]
        if cached is not None and cached[0].handler is None:
            # A new module object, not a reload: the functions of running tasks keep the
            # module (its globals) they were imported with.
            sys.modules.pop(cached[0].function.__module__, None)
        spec = resolve_target(target, script_args, working_directory=working_directory)
        _fresh[key] = (spec, _module_mtime(spec))
        return spec


def _module_mtime(spec: UDFSpec) -> float | None:
    if spec.handler is not None:
        path: str | None = spec.handler.path
    else:
        module = sys.modules.get(getattr(spec.function, "__module__", "") or "")
        path = getattr(module, "__file__", None)
    try:
        return os.stat(path).st_mtime if path else None
    except OSError:
        return None


# ---- stream_fn and batch_fn: the function named in TICKscript, imported at each task's Init ----

_FN_OPTIONS = (
    Option("fn", str, help="the function to run, package.module:attribute (imported at each task's Init)", example="mypkg.mymod:rolling_sum"),
    Option("opt", (str, str), multiple=True, help="one of the function's own options: its name, then its value as text (typed by its declaration)", example=("window", "10s")),
)


def _function_target(edge: str) -> UDFSpec:
    name = f"{edge}_fn"

    def never_called(df: Any, ctx: Any) -> None:
        raise AssertionError(f"{name} runs the function its 'fn' option names")

    def resolve(given: Sequence[udf_pb2.Option], allow_modules: Sequence[str]) -> tuple[UDFSpec, list[udf_pb2.Option]]:
        own = parse_options(_FN_OPTIONS, [option for option in given if option.name in ("fn", "opt")])
        unexpected = sorted({option.name for option in given} - {"fn", "opt"})
        if unexpected:
            raise OptionsError([f"{name} takes .fn() and .opt(NAME, VALUE) only; give {', '.join(repr(n) for n in unexpected)} as .opt({unexpected[0]!r}, ...)"])
        target = own["fn"]
        if names_a_script(target):  # a script's __main__ block runs as it loads: never on a TICKscript's word
            raise OptionsError([f"fn {target!r}: a Kapacitor Handler script is a UDF of its own (udf-agent run path/to/script.py in kapacitor.conf), not a function for {name}"])
        module_name, colon, _ = target.partition(":")
        try:
            if colon and module_name:
                check_function_module(module_name, allow_modules)
            spec = resolve_fresh(target, working_directory=False)
        except TargetError as exc:
            raise OptionsError([f"fn {target!r}: {exc}"]) from None
        if spec.resolve is not None or (spec.wants, spec.provides) != (edge, edge):
            kind = "a function target" if spec.resolve is not None else f"a {spec.wants} -> {spec.provides} UDF"
            raise OptionsError([f"fn {target!r} is {kind}; {name} runs {edge} -> {edge} UDFs"])
        problems: list[str] = []
        options = [_typed_option(spec, option_name, text, problems) for option_name, text in own["opt"]]
        if problems:
            raise OptionsError(problems)
        return spec, options

    return UDFSpec(
        name=name,
        function=never_called,
        wants=edge,
        provides=edge,
        options=_FN_OPTIONS,
        description=f"Runs the {edge} -> {edge} UDF named by .fn('package.module:attribute'), imported at each task's Init (a new or edited function needs only a task redefinition), with its options as .opt('name', 'value').",
        resolve=resolve,
    )


def check_function_module(module_name: str, allow_modules: Sequence[str]) -> None:
    """Raises TargetError unless ``.fn()`` may import MODULE_NAME; decided before anything is
    imported, for whoever can define a Kapacitor task names the module and its top-level code
    runs as it imports. Allowed: a module under an ``--allow-module`` prefix, or one whose
    top-level package Python finds in a directory on PYTHONPATH and whose name is not the
    standard library's; never one Python finds in the working directory (Kapacitor's, often
    ``/``), unless PYTHONPATH names that directory."""
    parts = module_name.split(".")
    if not all(part.isidentifier() for part in parts):
        raise TargetError(f"{module_name!r} is not a module name")
    top = parts[0]
    pythonpath = _pythonpath()
    directories = _directories_holding(top)
    working_directory = os.path.realpath(os.getcwd())
    on_pythonpath = f"PYTHONPATH={os.pathsep.join(pythonpath)}" if pythonpath else "PYTHONPATH is not set"
    policy = f".fn() imports only modules found in the directories on udf-agent's PYTHONPATH ({on_pythonpath}): not the working directory, the standard library or site-packages"
    if directories is not None and working_directory in directories and working_directory not in pythonpath:
        raise TargetError(f"module {top!r} is in the working directory ({working_directory}); {policy}; to import it, put the directory that holds it on PYTHONPATH ({_ENV_BLOCK})")
    if any(module_name == prefix or module_name.startswith(f"{prefix}.") for prefix in allow_modules):
        return
    if directories and all(directory in pythonpath for directory in directories) and top not in _STANDARD_NAMES:
        return
    if top in _STANDARD_NAMES:
        where = "it is in Python's standard library"
    elif directories is None:
        raise TargetError(f"module {top!r} is found in no directory on PYTHONPATH; {policy}; to import it, put the directory that holds it on PYTHONPATH ({_ENV_BLOCK})")
    else:
        where = f"Python finds it in {', '.join(directories)}"
    raise TargetError(f"module {module_name!r} is not under PYTHONPATH ({where}); {policy}; to allow it, add --allow-module {module_name} to udf-agent's arguments ({_ARGS_LIST})")


_STANDARD_NAMES = sys.stdlib_module_names | frozenset(sys.builtin_module_names)
_ENV_BLOCK = "in kapacitor.conf under [udf.functions.NAME.env]"
_ARGS_LIST = "in kapacitor.conf, the args of [udf.functions.NAME]"


def _pythonpath() -> list[str]:
    """The directories the operator put on PYTHONPATH, resolved. An empty entry (as from
    PYTHONPATH=/opt/fns:$PYTHONPATH with none set) names no directory, not the working one."""
    return [os.path.realpath(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def _directories_holding(top: str) -> list[str] | None:
    """The directories the import of the top-level module TOP would take it from (several for
    a namespace package; none for one built into Python), found without importing it; None
    when Python finds no such module."""
    try:
        spec = importlib.util.find_spec(top)  # a module already imported: where it came from
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.has_location and spec.origin:
        holder = os.path.dirname(spec.origin)
        return [os.path.realpath(os.path.dirname(holder) if spec.submodule_search_locations is not None else holder)]
    return [os.path.realpath(os.path.dirname(location)) for location in spec.submodule_search_locations or ()]


def _typed_option(spec: UDFSpec, name: str, text: str, problems: list[str]) -> udf_pb2.Option:
    """``.opt(NAME, TEXT)`` as the option NAME of ``spec`` would come from TICKscript: TEXT typed
    by its declaration (several values, comma-separated, for an option that takes several)."""
    from udf_agent import udf_pb2

    declared = next((option for option in spec.options if option.name == name), None)
    if declared is None:  # parse_options names it as unknown, with what is known
        return udf_pb2.Option(name=name, values=[udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=text)])
    parts = [text] if len(declared.value_types) == 1 else [part.strip() for part in text.split(",")]
    if len(parts) != len(declared.value_types):
        problems.append(f"opt {name!r}: {len(declared.value_types)} comma-separated values expected, got {text!r}")
        return udf_pb2.Option(name=name)
    values = []
    for part, wire_type in zip(parts, declared.value_types):
        value = _typed_value(part, wire_type)
        if value is None:
            problems.append(f"opt {name!r}: {part!r} is not {udf_pb2.ValueType.Name(wire_type)}")
        else:
            values.append(value)
    return udf_pb2.Option(name=name, values=values)


def _typed_value(text: str, wire_type: int) -> udf_pb2.OptionValue | None:
    from udf_agent import udf_pb2

    if wire_type == udf_pb2.STRING:
        return udf_pb2.OptionValue(type=udf_pb2.STRING, stringValue=text)
    parsed = literal(text)
    if parsed.type == wire_type:
        return parsed
    if wire_type == udf_pb2.DOUBLE and parsed.type == udf_pb2.INT:
        return udf_pb2.OptionValue(type=udf_pb2.DOUBLE, doubleValue=float(parsed.intValue))
    return None


FUNCTION_TARGETS = {spec.name: spec for spec in (_function_target("stream"), _function_target("batch"))}


def _user_traceback(exc: BaseException) -> str:
    """The traceback of an import that failed, without the frames of the import machinery."""
    frames = [frame for frame in traceback.extract_tb(exc.__traceback__) if not _machinery(frame.filename)]
    lines = ["Traceback (most recent call last):\n", *traceback.format_list(frames), *traceback.format_exception_only(type(exc), exc)]
    return "".join(lines)


def _machinery(filename: str) -> bool:
    return filename.startswith("<frozen importlib") or os.path.abspath(filename) in (os.path.abspath(__file__), importlib.__file__)


def _path_hint(module_name: str) -> str:
    searched = "\n".join(f"    {entry or os.getcwd()}" for entry in sys.path)
    return (
        f"Python looked for {module_name!r} in sys.path:\n{searched}\n"
        "Add the directory that holds your package to PYTHONPATH. Kapacitor starts the UDF with its own "
        "environment, not your shell's: set it in kapacitor.conf under [udf.functions.NAME.env] as "
        'PYTHONPATH = "/path/to/dir" (udf-agent info TARGET --kapacitor-conf NAME prints the block).'
    )
