"""Kapacitor UDFs written in pandas, computed on Spark.

    from udf_agent import Option, stream_udf

    @stream_udf(options=[Option("field", str)], history=9)
    def my_udf(df, ctx):
        ...
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from udf_agent.api import UDF, Context, UDFSpec, batch_udf, stream_udf
    from udf_agent.options import Duration, Option

__version__ = "0.1.0"

__all__ = ["UDF", "Context", "Duration", "Option", "UDFSpec", "batch_udf", "stream_udf", "__version__"]

# Imported on first use: a task that relays to the shared server needs none of them (nor
# protobuf, which they import), and answers Info sooner without.
_EXPORTED_FROM = {"UDF": "api", "Context": "api", "UDFSpec": "api", "batch_udf": "api", "stream_udf": "api", "Duration": "options", "Option": "options"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTED_FROM:
        raise AttributeError(f"module 'udf_agent' has no attribute {name!r}")
    return getattr(importlib.import_module(f"udf_agent.{_EXPORTED_FROM[name]}"), name)
