"""Kapacitor UDFs written in pandas, computed on Spark.

    from udf_agent import Option, stream_udf

    @stream_udf(options=[Option("field", str)], history=9)
    def my_udf(df, ctx):
        ...
"""

from udf_agent.api import UDF, Context, UDFSpec, batch_udf, stream_udf
from udf_agent.options import Duration, Option

__version__ = "0.1.0"

__all__ = ["UDF", "Context", "Duration", "Option", "UDFSpec", "batch_udf", "stream_udf", "__version__"]
