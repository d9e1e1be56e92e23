"""Dead letters: the input of a failed group or micro-batch, kept as InfluxDB line protocol.

With ``--on-error dead-letter:DIR`` a UDF failure does not end the task: the points
it failed on are written to a new file in DIR, headed by the error as comment
lines, so they can be inspected and replayed (``influx write``, or a Kapacitor
``record``/``replay``).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from udf_agent.wire import columns as cols


def write_dead_letter(directory: str, udf_name: str, error: str, points: list[bytes]) -> str:
    """Writes ``points`` (each a group's length-prefixed points) under ``error``; returns the file."""
    lines = [f"# udf-agent dead letter: UDF {udf_name!r}"]
    lines += [f"# {line}" for line in error.splitlines() if line.strip()]
    for data in points:
        if data:
            lines += line_protocol(data)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = os.path.join(directory, f"{udf_name}-{stamp}-{time.monotonic_ns()}.lp")
    # Removed since the task started, or never checked (a remembered launch, see entry.py).
    os.makedirs(directory, exist_ok=True)
    with open(path, "x", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return path


def line_protocol(points: bytes) -> list[str]:
    """One line per length-prefixed point: measurement,tags fields time (ns)."""
    table = cols.decode_points(points)
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    tag_names = sorted(n for n in columns if n.startswith(cols.TAG))
    field_names = sorted(n for n in columns if ":" in n and cols.column_prefix(n) in cols.FIELD_PREFIXES)
    lines = []
    for row in range(table.num_rows):
        head = _escape(columns[cols.NAME][row] or "", ", ")
        for name in tag_names:
            value = columns[name][row]
            if value is not None and value != "":
                head += f",{_escape(name[len(cols.TAG):], ',= ')}={_escape(value, ',= ')}"
        fields = []
        for name in field_names:
            value = columns[name][row]
            if value is not None:
                key = _escape(name[len(cols.column_prefix(name)) :], ",= ")
                fields.append(f"{key}={_field_value(cols.column_prefix(name), value)}")
        lines.append(f"{head} {','.join(fields)} {columns[cols.TIME][row]}")
    return lines


def _field_value(prefix: str, value: Any) -> str:
    if prefix == cols.FIELD_INT:
        return f"{value}i"
    if prefix == cols.FIELD_BOOL:
        return "true" if value else "false"
    if prefix == cols.FIELD_STRING:
        text: str = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'"{text}"'
    # Line protocol has no NaN or infinity: such a value is kept as a string.
    return repr(value) if math.isfinite(value) else f'"{value}"'


def _escape(text: str, special: str) -> str:
    text = text.replace("\\", "\\\\")
    for char in special:
        text = text.replace(char, "\\" + char)
    return text
