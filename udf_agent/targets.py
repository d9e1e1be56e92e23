"""Resolving a TARGET: a built-in name or ``package.module:attribute``."""

from __future__ import annotations

import importlib
import os
import sys

from udf_agent.api import UDFSpec, as_spec


class TargetError(Exception):
    """TARGET names no UDF; the message says why."""


def builtin_specs() -> dict[str, UDFSpec]:
    from udf_agent.builtins import BUILTINS

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
    except ImportError as exc:
        raise TargetError(f"cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise TargetError(f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
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
