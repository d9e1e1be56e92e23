"""UDFs used by the tests, loaded as TARGETs the way users load theirs."""

import dataclasses
import logging
import os
import sys
import threading
import time

import pandas as pd

from udf_agent import UDF, Duration, Option, batch_udf, stream_udf

print("sample UDF module imported (this line must land on stderr)")


@stream_udf(options=[Option("seconds", float, default=5.0)])
def sleepy(df, ctx):
    """Sleeps, then echoes: a deliberately slow micro-batch."""
    print("sleepy: about to sleep", flush=True)
    time.sleep(ctx.options["seconds"])
    return df


# Set when a call of slow_local begins (it runs in the agent's process): tests wait on it
# instead of sleeping until it probably began.
slow_local_began = threading.Event()


@stream_udf(options=[Option("seconds", float, default=0.5)], compute=False)
def slow_local(df, ctx):
    """Sleeps in every call, then echoes, without Spark: a backlog that takes long to compute."""
    slow_local_began.set()
    time.sleep(ctx.options["seconds"])
    return df


@stream_udf(compute=False)
def local_echo(df, ctx):
    """Echoes every point through the compute path, without Spark (mirror forwards frames instead)."""
    return df


@stream_udf(compute=False)
def warns(df, ctx):
    """Logs a warning naming its task and the points it got, then echoes, without Spark."""
    logging.getLogger(__name__).warning("warns: %d point(s) for task %s", len(df), ctx.task_id)
    return df


@stream_udf(compute=False)
def noisy(df, ctx):
    """Prints through every route to stdout it can, then echoes."""
    print("noisy print from the UDF")
    sys.stdout.write("noisy sys.stdout.write\n")
    sys.stdout.flush()
    os.write(1, b"noisy os.write to fd 1\n")
    return df


@stream_udf()
def passthrough(df, ctx):
    """Echoes on Spark: exercises the full columnar round trip."""
    return df


@stream_udf()
def counter(df, ctx):
    """Counts points per group across micro-batches in ctx.state."""
    seen = ctx.state.get("seen", 0)
    out = pd.DataFrame(index=df.index)
    out["count"] = range(seen + 1, seen + len(df) + 1)
    ctx.state["seen"] = seen + len(df)
    return out


@stream_udf(options=[Option("window", Duration)], history=lambda o: o["window"])
def time_sum(df, ctx):
    """Sum of `value` over a trailing time window."""
    window = ctx.options["window"]
    sums = df.set_index("time")["value"].rolling(window).sum()
    out = pd.DataFrame(index=df.index)
    out["sum"] = sums.to_numpy()
    return out


@stream_udf()
def failing(df, ctx):
    raise ValueError("boom in the UDF")


@stream_udf()
def wrong_result(df, ctx):
    return [1, 2, 3]


@batch_udf(provides="stream")
def batch_count(df, ctx):
    """One point per batch: how many points it had."""
    return pd.DataFrame({"time": [ctx.tmax], "count": [len(df)]})


class Scale(UDF):
    """Multiplies `field` by `factor`."""

    options = [Option("field", str), Option("factor", float, default=2.0)]

    def process(self, df, ctx):
        out = pd.DataFrame(index=df.index)
        out[ctx.options["field"]] = df[ctx.options["field"]] * ctx.options["factor"]
        return out


not_a_udf = 42


@stream_udf(history=2)
def window_total(df, ctx):
    """One new point per call: the total of `value` over the last three rows (history included)."""
    return pd.DataFrame({"time": [df["time"].iloc[-1]], "total": [float(df["value"].tail(3).sum())]})


@stream_udf(compute=False)
def exits(df, ctx):
    sys.exit(3)


@stream_udf(
    options=[
        Option("every", Duration, default=pd.Timedelta(seconds=5)),
        Option("tiny", float, default=1e-7),
        Option("pair", [int, Duration], default=(2, 1_500_000_000)),
    ]
)
def tick_defaults(df, ctx):
    return df


# The same counter, computed in the agent's process: snapshot tests across processes without Spark.
local_counter = dataclasses.replace(counter, name="local_counter", compute=False)


vectorized_calls: list[tuple[tuple[str, ...], list[int]]] = []


@stream_udf(history=1, vectorized=True, compute=False)
def group_sizes(df, ctx):
    """Every row gets the row count of its group in this call (history included); records each call."""
    import numpy as np

    vectorized_calls.append((ctx.groups, ctx.group_starts.tolist()))
    sizes = np.diff(ctx.group_starts)
    return pd.DataFrame({"rows": np.repeat(sizes, sizes)}, index=df.index)


@stream_udf(vectorized=True, compute=False)
def vectorized_new_rows(df, ctx):
    return pd.DataFrame({"time": df["time"], "x": 1.0})


@stream_udf(vectorized=True, compute=False)
def vectorized_with_state(df, ctx):
    ctx.state["seen"] = len(df)
    return pd.DataFrame(index=df.index)


@stream_udf(options=[Option("spare_pid", int)])
def dies_outside(df, ctx):
    """Kills the process it runs in, unless that is ``spare_pid`` (the test's own)."""
    if os.getpid() != ctx.options["spare_pid"]:
        os._exit(1)
    return df


@stream_udf(options=[Option("group", str)])
def fails_on(df, ctx):
    """Echoes every group but one, on which it raises."""
    if ctx.group == ctx.options["group"]:
        raise ValueError(f"boom on {ctx.group}")
    return df


@stream_udf(history=1)
def where_from(df, ctx):
    """Each point's database and retention policy, and the task and node, as string fields."""
    return pd.DataFrame(
        {
            "database": ctx.database,
            "retention_policy": ctx.retention_policy,
            "task": ctx.task_id,
            "node": ctx.node_id,
        },
        index=df.index,
    )


@batch_udf()
def batch_where_from(df, ctx):
    """The same for a batch."""
    return df.assign(database=ctx.database, task=ctx.task_id, node=ctx.node_id)[["time", "database", "task", "node"]]


@stream_udf()
def segfaults(df, ctx):
    """Crashes the Python process it runs in with SIGSEGV, on every call."""
    import ctypes

    ctypes.string_at(0)
    return df


@stream_udf(options=[Option("chunk_mb", int, default=64)])
def hoards(df, ctx):
    """Allocates without bound (memory it touches, so it is resident) until something stops it."""
    hoard = []
    while True:
        hoard.append(b"\x01" * (ctx.options["chunk_mb"] << 20))


@stream_udf()
def collector_sight(df, ctx):
    """Each point with what a full garbage collection would walk where it is computed
    ("tracked") and what it would not ("frozen")."""
    import gc

    return df.assign(tracked=float(len(gc.get_objects())), frozen=float(gc.get_freeze_count()))


@stream_udf(options=[Option("seconds", float, default=0.02)])
def busy_pid(df, ctx):
    """Spends ``seconds`` of CPU a call, then tells which process computed each point (``pid``):
    a CPU-bound UDF whose micro-batches are worth spreading over the workers."""
    until = time.thread_time() + ctx.options["seconds"]
    while time.thread_time() < until:
        pass
    return pd.DataFrame({"pid": float(os.getpid())}, index=df.index)
