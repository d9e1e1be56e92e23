"""The committed udf_agent/udf_pb2.py must match proto/udf.proto, and the schema
must carry Kapacitor's field numbers (facts doc, section "Wire")."""

from __future__ import annotations

import difflib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2, text_format
from google.protobuf.descriptor import FieldDescriptor

from udf_agent import udf_pb2

REPO = Path(__file__).resolve().parent.parent
PROTO = REPO / "proto" / "udf.proto"
FALLBACK_REGEN = "python -m grpc_tools.protoc -Iproto --python_out=udf_agent --pyi_out=udf_agent proto/udf.proto"


def documented_command() -> str | None:
    """The command the header comment of proto/udf.proto tells maintainers to run."""
    for line in PROTO.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\s*//\s*(python\s+-m\s+grpc_tools\.protoc\s.*)$", line)
        if match:
            return match.group(1).strip()
    return None


def regeneration_command() -> str:
    return documented_command() or FALLBACK_REGEN


def normalise(fdp: descriptor_pb2.FileDescriptorProto) -> descriptor_pb2.FileDescriptorProto:
    """Drops what differs between protoc versions without changing the schema."""
    fdp = descriptor_pb2.FileDescriptorProto.FromString(fdp.SerializeToString())
    fdp.ClearField("source_code_info")

    def strip(message: descriptor_pb2.DescriptorProto) -> None:
        for f in message.field:
            f.ClearField("json_name")
        for nested in message.nested_type:
            strip(nested)

    for message in fdp.message_type:
        strip(message)
    return fdp


def _setup_cfg_pin(package: str) -> str:
    """The version setup.cfg gives ``package``: its lowest (``>=``) or only (``==``) one."""
    match = re.search(rf"^\s*{re.escape(package)}(?:==|>=)([0-9.]+)", (REPO / "setup.cfg").read_text(), re.MULTILINE)
    assert match, f"setup.cfg names no version of {package}"
    return match.group(1)


def test_the_committed_gencode_is_the_oldest_the_protobuf_range_takes():
    """udf_pb2.py loads on every protobuf runtime setup.cfg allows only if it was generated for
    the lowest: a newer generator's gencode refuses older runtimes at import."""
    header = re.search(r"^# Protobuf Python Version: (\S+)$", (REPO / "udf_agent" / "udf_pb2.py").read_text(), re.MULTILINE)
    assert header and header.group(1) == _setup_cfg_pin("protobuf"), f"regenerate udf_pb2.py with {regeneration_command()!r} and grpcio-tools {_setup_cfg_pin('grpcio-tools')}"


@pytest.fixture(scope="module")
def protoc_output(tmp_path_factory):
    """proto/udf.proto compiled afresh: its descriptor and its type stub, by the generator
    setup.cfg pins (the ``proto`` extra; .ci/compat installs it beside protobuf 5)."""
    from importlib import metadata

    try:
        generator = metadata.version("grpcio-tools")
    except metadata.PackageNotFoundError:
        pytest.skip("grpcio-tools is not installed (pip install -e .[proto], beside protobuf 5; .ci/compat runs these)")
    if generator != _setup_cfg_pin("grpcio-tools"):
        pytest.skip(f"grpcio-tools {generator} is not the generator of the committed module ({_setup_cfg_pin('grpcio-tools')}, .[proto]; .ci/compat runs these)")
    out = tmp_path_factory.mktemp("protoc")
    desc = out / "udf.desc"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={out}",
            f"--pyi_out={out}",
            f"--descriptor_set_out={desc}",
            "proto/udf.proto",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"protoc failed on proto/udf.proto:\n{proc.stderr}"
    assert (out / "udf_pb2.py").exists()
    files = descriptor_pb2.FileDescriptorSet.FromString(desc.read_bytes()).file
    assert len(files) == 1, [f.name for f in files]
    return files[0], (out / "udf_pb2.pyi").read_text()


@pytest.fixture(scope="module")
def regenerated(protoc_output):
    return protoc_output[0]


@pytest.fixture(scope="module")
def committed():
    return descriptor_pb2.FileDescriptorProto.FromString(udf_pb2.DESCRIPTOR.serialized_pb)


def test_committed_module_matches_proto(regenerated, committed):
    fresh = normalise(regenerated)
    current = normalise(committed)
    if fresh != current:
        diff = "\n".join(
            difflib.unified_diff(
                text_format.MessageToString(current).splitlines(),
                text_format.MessageToString(fresh).splitlines(),
                "udf_agent/udf_pb2.py (committed)",
                "proto/udf.proto (regenerated)",
                lineterm="",
            )
        )
        pytest.fail(
            "udf_agent/udf_pb2.py is stale: it does not match proto/udf.proto.\n"
            f"Regenerate it from the repository root with:\n    {regeneration_command()}\n"
            f"Differences:\n{diff}",
            pytrace=False,
        )


def test_regeneration_command_is_documented_in_proto_header():
    command = documented_command()
    assert command is not None, "proto/udf.proto's header must say how to regenerate udf_pb2.py"
    assert "--python_out=udf_agent" in command and "--pyi_out=udf_agent" in command
    assert command.endswith("proto/udf.proto")


def test_committed_type_stub_matches_proto(protoc_output):
    # mypy (strict, in .ci/run) types every use of the messages from this stub.
    committed_stub = (REPO / "udf_agent" / "udf_pb2.pyi").read_text()
    assert committed_stub == protoc_output[1], f"udf_agent/udf_pb2.pyi is stale; regenerate it with:\n    {regeneration_command()}"


def test_normalise_does_not_hide_real_changes(committed):
    """The comparison must still see a renumbered field (guards against a vacuous test)."""
    changed = descriptor_pb2.FileDescriptorProto.FromString(committed.SerializeToString())
    point = next(m for m in changed.message_type if m.name == "Point")
    next(f for f in point.field if f.name == "fieldsBool").number = 13
    assert normalise(changed) != normalise(committed)
    json_only = descriptor_pb2.FileDescriptorProto.FromString(committed.SerializeToString())
    next(m for m in json_only.message_type if m.name == "Point").field[0].json_name = "whatever"
    assert normalise(json_only) == normalise(committed)


# ---------------------------------------------------------------------------
# Kapacitor's numbering, checked on both the committed module and the .proto


def _schemas(regenerated):
    return {"committed": udf_pb2.DESCRIPTOR.serialized_pb, "regenerated": regenerated.SerializeToString()}


def _file(which: str, regenerated) -> descriptor_pb2.FileDescriptorProto:
    return descriptor_pb2.FileDescriptorProto.FromString(_schemas(regenerated)[which])


def _message(fdp: descriptor_pb2.FileDescriptorProto, name: str) -> descriptor_pb2.DescriptorProto:
    for message in fdp.message_type:
        if message.name == name:
            return message
    raise AssertionError(f"message {name} missing from the schema")


def _field(fdp, message: str, field: str) -> descriptor_pb2.FieldDescriptorProto:
    for f in _message(fdp, message).field:
        if f.name == field:
            return f
    raise AssertionError(f"{message}.{field} missing from the schema")


T = descriptor_pb2.FieldDescriptorProto

UPSTREAM_FIELDS = [
    ("InitRequest", "taskID", 2, T.TYPE_STRING),
    ("InitRequest", "nodeID", 3, T.TYPE_STRING),
    ("BeginBatch", "size", 4, T.TYPE_INT64),
    ("BeginBatch", "byName", 5, T.TYPE_BOOL),
    ("Point", "byName", 11, T.TYPE_BOOL),
    ("Point", "fieldsBool", 12, T.TYPE_MESSAGE),
    ("EndBatch", "byName", 5, T.TYPE_BOOL),
]


@pytest.mark.parametrize("which", ["committed", "regenerated"])
@pytest.mark.parametrize("message, field, number, ftype", UPSTREAM_FIELDS)
def test_upstream_field_numbers(which, regenerated, message, field, number, ftype):
    f = _field(_file(which, regenerated), message, field)
    assert f.number == number, f"{message}.{field} must be field {number} ({which})"
    assert f.type == ftype, f"{message}.{field} has type {f.type} ({which})"
    if ftype != T.TYPE_MESSAGE:
        assert f.label == T.LABEL_OPTIONAL


@pytest.mark.parametrize("which", ["committed", "regenerated"])
def test_fields_bool_is_map_string_bool(which, regenerated):
    fdp = _file(which, regenerated)
    f = _field(fdp, "Point", "fieldsBool")
    assert f.label == T.LABEL_REPEATED
    entry_name = f.type_name.rsplit(".", 1)[-1]
    entry = next(n for n in _message(fdp, "Point").nested_type if n.name == entry_name)
    assert entry.options.map_entry
    key, value = sorted(entry.field, key=lambda x: x.number)
    assert (key.name, key.type) == ("key", T.TYPE_STRING)
    assert (value.name, value.type) == ("value", T.TYPE_BOOL)


def test_runtime_descriptors_carry_upstream_fields():
    """The same facts seen through the module the agent actually imports."""
    d = udf_pb2.DESCRIPTOR.message_types_by_name
    assert d["InitRequest"].fields_by_name["taskID"].number == 2
    assert d["InitRequest"].fields_by_name["nodeID"].number == 3
    size = d["BeginBatch"].fields_by_name["size"]
    assert (size.number, size.type) == (4, FieldDescriptor.TYPE_INT64)
    assert d["BeginBatch"].fields_by_name["byName"].number == 5
    assert d["Point"].fields_by_name["byName"].number == 11
    fields_bool = d["Point"].fields_by_name["fieldsBool"]
    assert fields_bool.number == 12
    assert fields_bool.message_type.GetOptions().map_entry
    assert fields_bool.message_type.fields_by_name["value"].type == FieldDescriptor.TYPE_BOOL
    assert d["EndBatch"].fields_by_name["byName"].number == 5
    # and they really reach the wire with those numbers (tag = number << 3 | wire type)
    assert udf_pb2.Point(byName=True).SerializeToString() == b"\x58\x01"
    assert udf_pb2.Point(fieldsBool={"up": True}).SerializeToString() == b"\x62\x06\x0a\x02up\x10\x01"
    assert udf_pb2.BeginBatch(size=300).SerializeToString() == b"\x20\xac\x02"
    assert udf_pb2.InitRequest(taskID="t", nodeID="n").SerializeToString() == b"\x12\x01t\x1a\x01n"


REQUEST_ONEOF = {"info": 1, "init": 2, "keepalive": 3, "snapshot": 4, "restore": 5, "begin": 16, "point": 17, "end": 18}
RESPONSE_ONEOF = {**REQUEST_ONEOF, "error": 6}
ONEOF_TYPES = {
    "Request": {
        "info": "InfoRequest",
        "init": "InitRequest",
        "keepalive": "KeepaliveRequest",
        "snapshot": "SnapshotRequest",
        "restore": "RestoreRequest",
        "begin": "BeginBatch",
        "point": "Point",
        "end": "EndBatch",
    },
    "Response": {
        "info": "InfoResponse",
        "init": "InitResponse",
        "keepalive": "KeepaliveResponse",
        "snapshot": "SnapshotResponse",
        "restore": "RestoreResponse",
        "error": "ErrorResponse",
        "begin": "BeginBatch",
        "point": "Point",
        "end": "EndBatch",
    },
}


@pytest.mark.parametrize("which", ["committed", "regenerated"])
@pytest.mark.parametrize("envelope, expected", [("Request", REQUEST_ONEOF), ("Response", RESPONSE_ONEOF)])
def test_envelope_oneof_numbers(which, regenerated, envelope, expected):
    message = _message(_file(which, regenerated), envelope)
    assert len(message.oneof_decl) == 1
    assert message.oneof_decl[0].name == "message"
    got = {f.name: f.number for f in message.field}
    assert got == expected
    for f in message.field:
        assert f.HasField("oneof_index") and f.oneof_index == 0, f"{envelope}.{f.name} not in the oneof"
        assert f.type_name.rsplit(".", 1)[-1] == ONEOF_TYPES[envelope][f.name]


@pytest.mark.parametrize("which", ["committed", "regenerated"])
def test_enum_numbers(which, regenerated):
    enums = {e.name: {v.name: v.number for v in e.value} for e in _file(which, regenerated).enum_type}
    assert enums["EdgeType"] == {"STREAM": 0, "BATCH": 1}
    assert enums["ValueType"] == {"BOOL": 0, "INT": 1, "DOUBLE": 2, "STRING": 3, "DURATION": 4}


@pytest.mark.parametrize("which", ["committed", "regenerated"])
def test_option_value_oneof(which, regenerated):
    fdp = _file(which, regenerated)
    got = {f.name: (f.number, f.type) for f in _message(fdp, "OptionValue").field}
    assert got == {
        "type": (1, T.TYPE_ENUM),
        "boolValue": (2, T.TYPE_BOOL),
        "intValue": (3, T.TYPE_INT64),
        "doubleValue": (4, T.TYPE_DOUBLE),
        "stringValue": (5, T.TYPE_STRING),
        "durationValue": (6, T.TYPE_INT64),
    }


def test_package_is_agent():
    # Kapacitor's messages live in package "agent"; the name is not on the wire
    # but a different one would clash with other generated modules in one pool.
    assert udf_pb2.DESCRIPTOR.package == "agent"


def test_the_frame_body_keys_are_what_protobuf_writes_first_for_each_message():
    # wire/frames names each message's key once, without protobuf: it must be the first bytes
    # protobuf itself writes for that message, in a Request and in a Response alike.
    from udf_agent.wire import frames

    keys = {
        "init": frames.INIT_KEY,
        "keepalive": frames.KEEPALIVE_KEY,
        "snapshot": frames.SNAPSHOT_KEY,
        "restore": frames.RESTORE_KEY,
        "error": frames.ERROR_KEY,
        "begin": frames.BEGIN_KEY,
        "point": frames.POINT_KEY,
        "end": frames.END_KEY,
    }
    for envelope in (udf_pb2.Request, udf_pb2.Response):
        for name, key in keys.items():
            if name not in envelope.DESCRIPTOR.fields_by_name:
                continue
            message = envelope()
            getattr(message, name).SetInParent()
            expected = bytes((key,)) if isinstance(key, int) else key
            assert message.SerializeToString().startswith(expected), f"{envelope.__name__}.{name}"
    assert "error" not in udf_pb2.Request.DESCRIPTOR.fields_by_name  # a Response's only
