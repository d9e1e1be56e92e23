"""``replay --plot``: one PNG with each group's input and output series over time.

One panel per group (the first ``MAX_PANELS`` groups, by name; the title says
how many more there were). Numeric fields are lines: input solid, output dashed.
A boolean output field (an anomaly flag) is drawn as red markers on the first
input series wherever it is true.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from udf_agent import udf_pb2
from udf_agent.tools.lineproto import FieldValue, LinePoint
from udf_agent.tools.replay import OutputPoint, group_id

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure
    from numpy.typing import NDArray

    # One field of one group: its times (ns) and values, in time order.
    Series = tuple[NDArray[np.int64], NDArray[np.float64]]

MAX_PANELS = 12
MAX_SERIES = 6  # per side and panel: more lines than this are unreadable


class PlotError(Exception):
    """The plot cannot be drawn (matplotlib missing, nothing numeric to draw)."""


def fields_named_by(options: Sequence[udf_pb2.Option]) -> list[str]:
    """The string values of a UDF's options: the input fields worth plotting, when they name some."""
    return [value.stringValue for option in options for value in option.values if value.type == udf_pb2.STRING]


def replay_figure(title: str, inputs: Sequence[LinePoint], outputs: Sequence[OutputPoint], group_by: Sequence[str], input_fields: Sequence[str] = ()) -> Figure:
    """The matplotlib Figure of a replay. ``input_fields`` limits the input series drawn
    (say the fields the UDF's options name); by default every numeric input field."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        import numpy as np
        import pandas as pd
    except ImportError:
        raise PlotError("--plot needs matplotlib: pip install 'udf-agent[plot]'") from None

    dimensions = sorted(set(group_by))
    series_in = _by_group(((group_id(p.tags, dimensions), p.time, p.fields) for p in inputs), input_fields)
    series_out = _by_group(((p.group, p.time, p.fields) for p in outputs), ())
    flags = _flags_by_group(outputs)
    groups = sorted(set(series_in) | set(series_out))
    if not groups:
        raise PlotError("nothing to plot: no numeric field in the input or the output")
    shown = groups[:MAX_PANELS]
    figure: Figure
    figure, axes = plt.subplots(len(shown), 1, figsize=(11, 2.8 * len(shown) + 0.8), squeeze=False, sharex=True)
    for axis, group in zip(axes[:, 0], shown):
        first_input: Series | None = None
        for field, (times, values) in sorted(series_in.get(group, {}).items())[:MAX_SERIES]:
            stamps = pd.to_datetime(times, unit="ns", utc=True)
            axis.plot(stamps, values, linewidth=1.0, label=f"in: {field}")
            first_input = first_input or (times, values)
        for field, (times, values) in sorted(series_out.get(group, {}).items())[:MAX_SERIES]:
            axis.plot(pd.to_datetime(times, unit="ns", utc=True), values, linewidth=1.4, linestyle="--", label=f"out: {field}")
        for field, flagged in sorted(flags.get(group, {}).items()):
            if first_input is not None and len(flagged):
                heights = np.interp(flagged, first_input[0], first_input[1])
                axis.plot(pd.to_datetime(flagged, unit="ns", utc=True), heights, "x", color="red", markersize=7, label=f"out: {field} = true")
        axis.set_title(f"group {group}" if group else "all points (no --group-by)", fontsize=10)
        axis.set_ylabel("field value")
        axis.grid(alpha=0.3)
        axis.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("time (UTC)")
    more = f" ({len(groups) - len(shown)} more groups not shown)" if len(groups) > len(shown) else ""
    figure.suptitle(f"{title}{more}", fontsize=12)
    figure.autofmt_xdate()
    figure.tight_layout()
    return figure


def save_replay_plot(path: str, title: str, inputs: Sequence[LinePoint], outputs: Sequence[OutputPoint], group_by: Sequence[str], input_fields: Sequence[str] = ()) -> None:
    """Draws ``replay_figure`` into the PNG file PATH."""
    import matplotlib.pyplot as plt

    figure = replay_figure(title, inputs, outputs, group_by, input_fields)
    try:
        figure.savefig(path, dpi=100)
    except OSError as exc:
        raise PlotError(f"cannot write the plot to {path!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(figure)


def _by_group(rows: Iterable[tuple[str, int, Mapping[str, FieldValue]]], only: Sequence[str]) -> dict[str, dict[str, Series]]:
    """{group: {field: (times, values)}} of the numeric (not boolean) fields, in time order."""
    import numpy as np

    collected: dict[str, dict[str, tuple[list[int], list[float]]]] = {}
    for group, time, fields in rows:
        for field, value in fields.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (only and field not in only):
                continue
            times, values = collected.setdefault(group, {}).setdefault(field, ([], []))
            times.append(time)
            values.append(float(value))
    result: dict[str, dict[str, Series]] = {}
    for group, series in collected.items():
        for field, (times, values) in series.items():
            order = np.argsort(np.asarray(times), kind="stable")
            result.setdefault(group, {})[field] = (np.asarray(times)[order], np.asarray(values)[order])
    return result


def _flags_by_group(outputs: Sequence[OutputPoint]) -> dict[str, dict[str, list[int]]]:
    flags: dict[str, dict[str, list[int]]] = {}
    for point in outputs:
        for field, value in point.fields.items():
            if value is True:
                flags.setdefault(point.group, {}).setdefault(field, []).append(point.time)
    return flags
