"""Resolving a TARGET: a built-in name or ``package.module:attribute``."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from udf_agent.api import UDFSpec, as_spec


class TargetError(Exception):
    """TARGET names no UDF; the message says why."""


def builtin_specs() -> dict[str, UDFSpec]:
    from udf_agent.library.builtins import BUILTINS

    return BUILTINS


def resolve_target(target: str) -> UDFSpec:
    builtins = builtin_specs()
    if target in builtins:
        return builtins[target]
    if ":" not in target:
        raise TargetError(
            f"{target!r} is neither a built-in ({', '.join(sorted(builtins))}) nor of the form package.module:attribute"
        )
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise TargetError(f"{target!r} must be of the form package.module:attribute")
    # Like `python -m`, let modules in the working directory be found.
    if os.getcwd() not in sys.path and "" not in sys.path:
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
