"""Kapacitor's recordings, read as Kapacitor's replay reads them.

A stream recording (``kapacitor record stream``, ``.srpl``) is gzip of repeating triplets of
lines: the point's database, its retention policy, the point as line protocol (Kapacitor's
``WritePointForRecording``). A batch recording (``.brpl``) is a zip with one file per batch
query, each a sequence of JSON-encoded buffered batches (``WriteBatchForRecording``): name,
tmax, group, byname, tags and points (fields, tags, time); a point without tags has its
batch's. As Kapacitor's replay does, a batch without points is skipped, and every JSON number
is a float (the JSON holds no type: 5 may have been 5.0).
"""

from __future__ import annotations

import calendar
import gzip
import io
import json
import re
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field

from udf_agent.tools.lineproto import FieldValue, LinePoint, LineProtocolError, parse_line_point

STREAM_EXTENSION = ".srpl"
BATCH_EXTENSION = ".brpl"

# Go's zero time.Time, which a batch recorded from a query has as its tmax.
GO_ZERO_TIME = "0001-01-01T00:00:00Z"
# Go's time.Time in JSON (RFC 3339 with up to nanoseconds, "Z" or an offset).
_RFC3339 = re.compile(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)\Z")


class RecordingError(ValueError):
    """Not a recording Kapacitor wrote; says where."""


@dataclass
class RecordedBatch:
    """One buffered batch of a batch recording, as its BeginBatch, points and EndBatch carry it."""

    name: str
    group: str
    tags: dict[str, str]
    tmax: int  # ns since the epoch
    by_name: bool
    points: list[LinePoint] = field(default_factory=list)


def read_stream_recording(path: str, precision: str = "ns") -> Iterator[LinePoint]:
    """The points of a ``.srpl`` file, each with its database and retention policy."""
    try:
        with gzip.open(path, "rb") as raw:
            lines = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="\n")
            number = 0
            while True:
                database = lines.readline()
                if not database:
                    return
                policy, text = lines.readline(), lines.readline()
                number += 3
                if not text:
                    raise RecordingError(f"{path}:{number}: the recording ends inside a point (a database and retention-policy line need the point's line after them)")
                point = parse_line_point(text.rstrip("\n"), f"{path}:{number}", precision)
                point.database, point.retention_policy = database.rstrip("\n"), policy.rstrip("\n")
                yield point
    except (gzip.BadGzipFile, EOFError) as exc:
        raise RecordingError(f"{path}: not a stream recording (gzip) as Kapacitor writes it: {exc}") from None
    except LineProtocolError as exc:
        raise RecordingError(str(exc)) from None


def read_batch_recording(path: str) -> list[RecordedBatch]:
    """Every batch of a ``.brpl`` file, query after query (the archive's files in order)."""
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as exc:
        raise RecordingError(f"{path}: not a batch recording (zip) as Kapacitor writes it: {exc}") from None
    batches = []
    with archive:
        for member in archive.infolist():
            text = archive.read(member).decode("utf-8", errors="replace")
            for number, entry in enumerate(_json_values(text, f"{path}:{member.filename}"), start=1):
                batch = _batch(entry, f"{path}:{member.filename}: batch {number}")
                if batch.points:
                    batches.append(batch)
    return batches


def _json_values(text: str, where: str) -> Iterator[object]:
    """The JSON values one after another in ``text`` (Go's json.Encoder writes one a line)."""
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position == len(text):
            return
        try:
            value, position = decoder.raw_decode(text, position)
        except ValueError as exc:
            raise RecordingError(f"{where}: not JSON: {exc}") from None
        yield value


def _batch(entry: object, where: str) -> RecordedBatch:
    if not isinstance(entry, dict):
        raise RecordingError(f"{where}: a batch is a JSON object, got {type(entry).__name__}")
    try:
        tags = _strings(entry.get("tags") or {}, where)
        batch = RecordedBatch(
            name=str(entry.get("name", "")),
            group=str(entry.get("group", "")),
            tags=tags,
            tmax=go_time_ns(entry.get("tmax") or GO_ZERO_TIME),
            by_name=bool(entry.get("byname", False)),
        )
        for point in entry.get("points") or []:
            batch.points.append(
                LinePoint(
                    batch.name,
                    _strings(point.get("tags") or {}, where) or dict(tags),
                    {key: _field(value, where) for key, value in (point.get("fields") or {}).items()},
                    go_time_ns(point["time"]),
                )
            )
    except (KeyError, TypeError, AttributeError) as exc:
        raise RecordingError(f"{where}: not a batch as Kapacitor records it ({type(exc).__name__}: {exc})") from None
    if batch.points:
        # As Kapacitor's replay: a batch ends no sooner than its last point (a query's batches
        # are recorded with a zero tmax).
        batch.tmax = max(batch.tmax, batch.points[-1].time)
    return batch


def _strings(values: object, where: str) -> dict[str, str]:
    if not isinstance(values, dict) or not all(isinstance(v, str) for v in values.values()):
        raise RecordingError(f"{where}: tags must map names to strings, got {values!r}")
    return dict(values)


def _field(value: object, where: str) -> FieldValue:
    if isinstance(value, bool | str):
        return value
    if isinstance(value, int | float):
        return float(value)  # as Kapacitor's replay decodes it
    raise RecordingError(f"{where}: a field value must be a number, string or bool, got {value!r}")


def go_time_ns(text: object) -> int:
    """Nanoseconds since the epoch of a Go ``time.Time`` as JSON writes it (RFC 3339)."""
    found = _RFC3339.match(text) if isinstance(text, str) else None
    if found is None:
        raise RecordingError(f"not a time as Kapacitor records it (RFC 3339): {text!r}")
    year, month, day, hour, minute, second, fraction, zone = found.groups()
    seconds = calendar.timegm((int(year), int(month), int(day), int(hour), int(minute), int(second)))
    if zone != "Z":
        sign = 1 if zone[0] == "+" else -1
        seconds -= sign * (int(zone[1:3]) * 3600 + int(zone[4:6]) * 60)
    return seconds * 1_000_000_000 + int((fraction or "").ljust(9, "0"))
