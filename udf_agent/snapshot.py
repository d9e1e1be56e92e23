"""The runtime's own snapshot format: versioned, checksummed, never executable.

    b"KUDFSNAP" | version (uint16, big-endian) | sha256(body) | body

The body is an Arrow IPC stream of one table (group, history, state): the
kept history of each group as its last points' bytes (length-prefixed Points,
as Kapacitor sent them) and its UDF state as JSON. The UDF's name is in the
schema metadata so a snapshot of another UDF is refused. Version 1 held history
as Arrow IPC and is refused.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from udf_agent.table import ipc_to_table, table_to_ipc

MAGIC = b"KUDFSNAP"
VERSION = 2
_HEADER = struct.Struct(">8sH32s")

# A group's kept history (its last points, length-prefixed) and its UDF state (JSON).
GroupState = tuple[bytes | None, str | None]


class SnapshotError(ValueError):
    """A snapshot that cannot be restored; nothing was changed."""


def _fingerprint(options: dict[str, Any]) -> str:
    """The options a snapshot's state was computed with, canonical JSON (durations in ns)."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)


def dump_snapshot(udf_name: str, groups: dict[str, GroupState], options: dict[str, Any] | None = None) -> bytes:
    import pyarrow as pa

    metadata = {"udf": udf_name}
    if options is not None:
        metadata["options"] = _fingerprint(options)

    table = pa.table(
        {
            "group": pa.array(list(groups), pa.string()),
            "history": pa.array([h for h, _ in groups.values()], pa.binary()),
            "state": pa.array([s for _, s in groups.values()], pa.string()),
        }
    ).replace_schema_metadata(metadata)
    body = table_to_ipc(table)
    return _HEADER.pack(MAGIC, VERSION, hashlib.sha256(body).digest()) + body


def load_snapshot(udf_name: str, data: bytes, options: dict[str, Any] | None = None) -> dict[str, GroupState]:
    """The groups' state in ``data``; SnapshotError if it is not a snapshot of this UDF,
    or (given ``options``) was taken with other options: a window of another size or
    over another field would silently compute wrong results."""
    import pyarrow as pa

    if len(data) < _HEADER.size or not data.startswith(MAGIC):
        raise SnapshotError("not a udf-agent snapshot (unknown header)")
    _, version, digest = _HEADER.unpack_from(data)
    if version != VERSION:
        raise SnapshotError(f"snapshot format version {version} is not supported (this agent reads version {VERSION})")
    body = data[_HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("snapshot checksum mismatch: the snapshot is corrupt")
    try:
        table = ipc_to_table(body)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SnapshotError(f"snapshot body is unreadable: {exc}") from None
    expected = {"group": pa.string(), "history": pa.binary(), "state": pa.string()}
    actual = {field.name: field.type for field in table.schema}
    if actual != expected:
        described = ", ".join(f"{name}: {kind}" for name, kind in actual.items())
        raise SnapshotError(f"snapshot body is unreadable: its columns are ({described}), not (group: string, history: binary, state: string)")
    if table.column("group").null_count:
        raise SnapshotError("snapshot body is unreadable: a row has no group")
    owner = (table.schema.metadata or {}).get(b"udf", b"").decode(errors="replace")
    if owner != udf_name:
        raise SnapshotError(f"snapshot belongs to UDF {owner!r}, not {udf_name!r}")
    taken_with = (table.schema.metadata or {}).get(b"options")
    # Snapshots of earlier agents carry no options: restored as before.
    if options is not None and taken_with is not None and taken_with.decode(errors="replace") != _fingerprint(options):
        raise SnapshotError(
            f"snapshot was taken with options {taken_with.decode(errors='replace')}, this task has {_fingerprint(options)}"
        )
    groups = table.column("group").to_pylist()
    histories = table.column("history").to_pylist()
    states = table.column("state").to_pylist()
    for group, history in zip(groups, histories):
        _check_history(group, history)
    return {g: (h, s) for g, h, s in zip(groups, histories, states)}


def _check_history(group: str, history: bytes | None) -> None:
    """Refused now rather than failing the task at the group's next micro-batch."""
    if history is None:
        return
    from udf_agent.codec import ProtocolError
    from udf_agent.pointcodec import count_points

    try:
        count_points(history)
    except ProtocolError as exc:
        raise SnapshotError(f"snapshot body is unreadable: the history of group {group!r} holds no valid points ({exc})") from None
