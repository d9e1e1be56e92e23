"""The runtime's own snapshot format: versioned, checksummed, never executable.

    b"KUDFSNAP" | version (uint16, big-endian) | sha256(body) | body

Version 3 (written): the body is the size of the records once decompressed
(uint64, big-endian), then the records compressed with zstd. The records are
length-prefixed byte strings: first a JSON header (the UDF's name, so a
snapshot of another UDF is refused, and the options the state was computed
with), then per group its key, its kept history (its last points as Kapacitor
sent them, length-prefixed) and its UDF state as JSON. A length of 0 stands
for "none", any other is the length plus one. The declared size is checked
against ``MAX_RECORDS_BYTES`` before anything is decompressed, so a small
snapshot cannot claim gigabytes of memory.

Version 2 (read, for snapshots of earlier agents): the body is an Arrow IPC
stream of one table (group, history, state) with the UDF's name in its schema
metadata. A stream whose record batches are compressed is refused unread (a
decompression bomb). Version 1 held history as Arrow IPC and is refused.
"""

from __future__ import annotations

import hashlib
import json
import struct
from typing import Any

from udf_agent.wire.columns import ipc_to_table
from udf_agent.wire.frames import ProtocolError, encode_varint, read_varint

MAGIC = b"KUDFSNAP"
VERSION = 3
READABLE_VERSIONS = (2, 3)
_HEADER = struct.Struct(">8sH32s")
_SIZE = struct.Struct(">Q")
# The most a snapshot's records may take once decompressed.
MAX_RECORDS_BYTES = 4 * 1024**3
# Groups whose records are joined and compressed at a time: a snapshot of many groups is never
# held whole uncompressed (500 k groups: ~120 MB of records, and three objects a group, where
# the compressed snapshot is ~25 MB).
DUMP_GROUPS_AT_A_TIME = 4096

# A group's kept history (its last points, length-prefixed) and its UDF state (JSON).
GroupState = tuple[bytes | None, str | None]


class SnapshotError(ValueError):
    """A snapshot that cannot be restored; nothing was changed."""


def _fingerprint(options: dict[str, Any]) -> str:
    """The options a snapshot's state was computed with, canonical JSON (durations in ns)."""
    return json.dumps(options, sort_keys=True, separators=(",", ":"), default=str)


def dump_snapshot(udf_name: str, groups: dict[str, GroupState], options: dict[str, Any] | None = None) -> bytes:
    out = bytearray()
    dump_snapshot_into(out, udf_name, groups, options)
    return bytes(out)


def dump_snapshot_into(out: bytearray, udf_name: str, groups: dict[str, GroupState], options: dict[str, Any] | None = None) -> None:
    """Appends the snapshot of ``groups`` to ``out``, compressed straight into it: a relayed
    task's checkpoint is written into its link message, with no copy of a snapshot that is
    tens of MB (each copy a peak of the server's footprint)."""
    import pyarrow as pa

    header = {"udf": udf_name, "options": None if options is None else _fingerprint(options)}
    start = len(out)
    out += bytes(_HEADER.size + _SIZE.size)  # filled in once the records are compressed
    size = 0
    with pa.CompressedOutputStream(pa.PythonFile(_Appender(out), mode="w"), "zstd") as compressor:  # one zstd frame, as pa.compress makes

        def write(parts: list[bytes]) -> None:
            nonlocal size
            records = b"".join(parts)
            size += len(records)
            compressor.write(records)

        parts = [_record(json.dumps(header).encode())]
        for key, (history, state) in groups.items():
            parts += [_record(key.encode()), _record(history), _record(None if state is None else state.encode())]
            if len(parts) >= 3 * DUMP_GROUPS_AT_A_TIME:
                write(parts)
                parts = []
        write(parts)
    size_at = start + _HEADER.size
    _SIZE.pack_into(out, size_at, size)
    with memoryview(out) as view:
        digest = hashlib.sha256(view[size_at:]).digest()
    _HEADER.pack_into(out, start, MAGIC, VERSION, digest)


class _Appender:
    """A file that appends what is written to a bytearray (pyarrow's ``PythonFile`` over it)."""

    def __init__(self, out: bytearray):
        self._out = out
        self.closed = False

    def write(self, data: bytes) -> int:
        self._out += data
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def _record(value: bytes | None) -> bytes:
    if value is None:
        return b"\x00"
    return encode_varint(len(value) + 1) + value


def load_snapshot(udf_name: str, data: bytes, options: dict[str, Any] | None = None) -> dict[str, GroupState]:
    """The groups' state in ``data``; SnapshotError if it is not a snapshot of this UDF,
    or (given ``options``) was taken with other options: a window of another size or
    over another field would silently compute wrong results."""
    if len(data) < _HEADER.size or not data.startswith(MAGIC):
        raise SnapshotError("not a udf-agent snapshot (unknown header)")
    _, version, digest = _HEADER.unpack_from(data)
    if version not in READABLE_VERSIONS:
        readable = " and ".join(str(v) for v in READABLE_VERSIONS)
        raise SnapshotError(f"snapshot format version {version} is not supported (this agent reads versions {readable})")
    body = data[_HEADER.size :]
    if hashlib.sha256(body).digest() != digest:
        raise SnapshotError("snapshot checksum mismatch: the snapshot is corrupt")
    owner, taken_with, groups = _read_records(body) if version == 3 else _read_table(body)
    if owner != udf_name:
        raise SnapshotError(f"snapshot belongs to UDF {owner!r}, not {udf_name!r}")
    # Snapshots of earlier agents carry no options: restored as before.
    if options is not None and taken_with is not None and taken_with != _fingerprint(options):
        raise SnapshotError(f"snapshot was taken with options {taken_with}, this task has {_fingerprint(options)}")
    for group, (history, _) in groups.items():
        _check_history(group, history)
    return groups


def _read_records(body: bytes) -> tuple[str, str | None, dict[str, GroupState]]:
    import pyarrow as pa

    if len(body) < _SIZE.size:
        raise SnapshotError("snapshot body is unreadable: it is too short")
    (size,) = _SIZE.unpack_from(body)
    if size > MAX_RECORDS_BYTES:
        raise SnapshotError(f"snapshot body is unreadable: it declares {size} bytes decompressed, above the {MAX_RECORDS_BYTES}-byte limit")
    try:
        records = pa.decompress(body[_SIZE.size :], decompressed_size=size, codec="zstd", asbytes=True)
        values = _split_records(records)
        header = json.loads(values[0] or b"")
        owner, taken_with = str(header["udf"]), header["options"]
        if (len(values) - 1) % 3:
            raise ValueError("a group's record is cut short")
        groups = {
            key.decode(): (history, None if state is None else state.decode())
            for key, history, state in zip(values[1::3], values[2::3], values[3::3])
            if key is not None
        }
    except (pa.ArrowException, OSError, ProtocolError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise SnapshotError(f"snapshot body is unreadable: {exc}") from None
    if len(groups) * 3 != len(values) - 1:
        raise SnapshotError("snapshot body is unreadable: a group has no key, or one key is there twice")
    return owner, taken_with, groups


def _split_records(records: bytes) -> list[bytes | None]:
    values: list[bytes | None] = []
    position, end = 0, len(records)
    while position < end:
        length, position = read_varint(records, position)
        if length == 0:
            values.append(None)
            continue
        stop = position + length - 1
        if stop > end:
            raise ValueError("a record runs past the end")
        values.append(records[position:stop])
        position = stop
    if not values:
        raise ValueError("no header record")
    return values


def _read_table(body: bytes) -> tuple[str, str | None, dict[str, GroupState]]:
    """A version 2 body: an Arrow IPC stream, read only if nothing in it is compressed."""
    import pyarrow as pa

    try:
        if _has_compressed_batches(body):
            raise SnapshotError("snapshot body is refused: its Arrow record batches are compressed (never written by udf-agent)")
        table = ipc_to_table(body)
    except (pa.ArrowException, OSError, ValueError, struct.error) as exc:
        if isinstance(exc, SnapshotError):
            raise
        raise SnapshotError(f"snapshot body is unreadable: {exc}") from None
    expected = {"group": pa.string(), "history": pa.binary(), "state": pa.string()}
    actual = {field.name: field.type for field in table.schema}
    if actual != expected:
        described = ", ".join(f"{name}: {kind}" for name, kind in actual.items())
        raise SnapshotError(f"snapshot body is unreadable: its columns are ({described}), not (group: string, history: binary, state: string)")
    if table.column("group").null_count:
        raise SnapshotError("snapshot body is unreadable: a row has no group")
    metadata = table.schema.metadata or {}
    owner = metadata.get(b"udf", b"").decode(errors="replace")
    taken_with = metadata.get(b"options")
    groups = table.column("group").to_pylist()
    histories = table.column("history").to_pylist()
    states = table.column("state").to_pylist()
    return owner, None if taken_with is None else taken_with.decode(errors="replace"), {g: (h, s) for g, h, s in zip(groups, histories, states)}


def _has_compressed_batches(stream: bytes) -> bool:
    """Whether an IPC stream's record batch messages declare body compression
    (flatbuffers: Message.header is field 2, RecordBatch.compression field 3)."""
    import pyarrow as pa

    for message in pa.ipc.MessageReader.open_stream(pa.py_buffer(stream)):
        if message.type != "record batch":
            continue
        metadata = message.metadata.to_pybytes()
        root = struct.unpack_from("<I", metadata, 0)[0]
        header_slot = _field_offset(metadata, root, 2)
        if not header_slot:
            continue
        header = root + header_slot + struct.unpack_from("<I", metadata, root + header_slot)[0]
        if _field_offset(metadata, header, 3):
            return True
    return False


def _field_offset(buffer: bytes, table: int, field: int) -> int:
    """A flatbuffer table's field offset from the table start, 0 when the field is absent."""
    vtable = table - struct.unpack_from("<i", buffer, table)[0]
    vtable_size = struct.unpack_from("<H", buffer, vtable)[0]
    slot = 4 + 2 * field
    return struct.unpack_from("<H", buffer, vtable + slot)[0] if slot < vtable_size else 0


def _check_history(group: str, history: bytes | None) -> None:
    """Refused now rather than failing the task at the group's next micro-batch."""
    if history is None:
        return
    from udf_agent.wire.pointcodec import count_points

    try:
        count_points(history)
    except ProtocolError as exc:
        raise SnapshotError(f"snapshot body is unreadable: the history of group {group!r} holds no valid points ({exc})") from None
