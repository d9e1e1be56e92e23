"""InfluxDB line protocol in and out, through maintained libraries.

Parsing is ``line-protocol-parser`` and formatting is ``influxdb-client``'s
``Point``: escaping of spaces, commas, equals signs and quotes, and the
``i``/``u``/bool/string field types are theirs, not hand-written here.
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO, cast

from udf_agent import udf_pb2

PRECISIONS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
INT64_MAX = (1 << 63) - 1
# A field's value as line protocol and Kapacitor's Point carry it.
FieldValue = float | int | str | bool


class LineProtocolError(ValueError):
    """A line that is not line protocol, or a value Kapacitor cannot carry; says where."""


@dataclass
class LinePoint:
    """One point of line protocol: time in nanoseconds since the epoch."""

    name: str
    tags: dict[str, str]
    fields: dict[str, FieldValue]
    time: int
    # Where Kapacitor got it (a stream recording keeps both); plain line protocol has neither.
    database: str = ""
    retention_policy: str = ""


def open_input(path: str, stdin: IO[bytes]) -> io.BufferedIOBase:
    """The bytes of PATH (``-``: stdin), gunzipped when they are gzip."""
    raw = stdin if path == "-" else open(path, "rb")  # noqa: SIM115 - closed by the caller
    # A stdin that cannot peek (a test's BytesIO) is wrapped: any binary stream has what it reads with.
    buffered = raw if isinstance(raw, io.BufferedReader) else io.BufferedReader(cast(io.RawIOBase, raw))
    if buffered.peek(2)[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=buffered)
    return buffered


def read_points(stream: Iterable[bytes], source: str = "input", precision: str = "ns") -> Iterator[LinePoint]:
    """Parses every line of STREAM; blank lines and ``#`` comments are skipped."""
    for number, raw in enumerate(stream, start=1):
        text = raw.decode("utf-8", errors="replace").strip()
        if text and not text.startswith("#"):
            yield parse_line_point(text, f"{source}:{number}", precision)


def parse_line_point(text: str, where: str, precision: str = "ns") -> LinePoint:
    """One line of line protocol (``where`` names it in errors)."""
    from line_protocol_parser import LineFormatError, parse_line

    try:
        parsed = parse_line(text)
    except (LineFormatError, ValueError) as exc:
        raise LineProtocolError(f"{where}: not line protocol ({exc}): {_excerpt(text)}") from None
    if parsed["time"] is None:
        raise LineProtocolError(f"{where}: the point has no timestamp; replay needs each point's time: {_excerpt(text)}")
    for name, value in parsed["fields"].items():
        if isinstance(value, int) and not isinstance(value, bool) and value > INT64_MAX:
            raise LineProtocolError(f"{where}: field {name!r} = {value} does not fit Kapacitor's int64 fields")
    return LinePoint(parsed["measurement"], dict(parsed["tags"]), dict(parsed["fields"]), int(parsed["time"]) * PRECISIONS[precision])


def _excerpt(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def set_fields(point: udf_pb2.Point, fields: dict[str, FieldValue]) -> None:
    """Puts each field in the map of its Kapacitor type (int64 for ``i`` and ``u``)."""
    for name, value in fields.items():
        if isinstance(value, bool):
            point.fieldsBool[name] = value
        elif isinstance(value, int):
            point.fieldsInt[name] = value
        elif isinstance(value, float):
            point.fieldsDouble[name] = value
        else:
            point.fieldsString[name] = str(value)


def fields_of(point: udf_pb2.Point) -> dict[str, FieldValue]:
    """A Point's fields, whatever their type, in one map."""
    fields: dict[str, FieldValue] = {}
    for values in (point.fieldsDouble, point.fieldsInt, point.fieldsString, point.fieldsBool):
        fields.update(values)
    return fields


def format_point(name: str, tags: dict[str, str], fields: dict[str, FieldValue], time: int) -> str:
    """One line of line protocol, or "" when no field has a value line protocol can hold
    (NaN and infinities cannot be written; such fields are left out)."""
    from influxdb_client import Point, WritePrecision

    point = Point(name).time(time, WritePrecision.NS)
    for key, tag in sorted(tags.items()):
        if tag != "":  # line protocol has no empty tag values
            point.tag(key, tag)
    kept = 0
    for key, value in sorted(fields.items()):
        if isinstance(value, float) and not math.isfinite(value):
            continue
        point.field(key, value)
        kept += 1
    return str(point.to_line_protocol()) if kept else ""
