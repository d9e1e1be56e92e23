"""A UDF module that takes 2 s to import, like one that loads a model."""

import time

from udf_agent import stream_udf

time.sleep(2)


@stream_udf(compute=False)
def echo(df, ctx):
    return df
