"""Conformance of trimq's v2 gRPC schema (:mod:`protocol.grpc.schema`) with the official
RocketMQ 5 Python client, ``rocketmq-python-client==5.1.2`` (``py-grpc`` in
:mod:`scripts.interop_setup`).

The client's generated modules are imported only in a subprocess in its own venv, with
``HOME`` a temp dir (importing the client starts its logging under ``~``) and the repository
root on ``PYTHONPATH``. That process imports our schema next to the client's, which is the
name clash our private pool exists for, and checks one message each way on the wire. It then
prints the client's own ``FileDescriptorProto``\\ s. This process compares them with what our
pool built, for every message, field, enum value and method that trimq declares: field
number, type, label, message/enum type, real oneof, proto3 ``optional``, map-entry-ness;
enum value numbers; method types and streaming flags. The comparison runs here, not in the
client's venv, because it is test code (typed, linted, checked by the self-tests below) and
that venv has no pytest.

What trimq declares beyond the 5.1.2 client is allowed only through :data:`NEWER_THAN_CLIENT`.
If PyPI is unreachable the interop test is skipped, as the other interop tests are.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import pytest
from google.protobuf import descriptor_pb2

from protocol.grpc import schema
from scripts.interop_setup import ROOT, ClientEnv

_FDP = descriptor_pb2.FieldDescriptorProto
_Proto = TypeVar("_Proto")

#: What trimq declares that the 5.1.2 client predates: rocketmq-apis added these in May 2026.
NEWER_THAN_CLIENT: frozenset[str] = frozenset(
    {
        "apache.rocketmq.v2.Settings.client_properties",
        "apache.rocketmq.v2.Settings.ClientPropertiesEntry",
        "apache.rocketmq.v2.Code.INVALID_CLIENT_PROPERTIES",
    }
)


def newer_than_client(name: str) -> bool:
    """Whether ``name`` is on :data:`NEWER_THAN_CLIENT` or inside something that is."""
    return any(name == n or name.startswith(f"{n}.") for n in NEWER_THAN_CLIENT)


#: Longest the subprocess may take (it imports grpcio and the whole client).
EXPORT_TIMEOUT_S = 120.0

#: Runs in the client's venv. Prints one JSON line: the client's FileDescriptorProtos.
EXPORT_SCRIPT = r"""
import base64, json, sys, types
from google.protobuf import descriptor_pb2, text_format

# protocol/__init__.py loads the Remoting codec (msgpack, absent here) and protocol/grpc/ the
# HTTP/2 side (h2): the schema needs neither, so enter both packages without their __init__.
for name in ("protocol", "protocol.grpc"):
    package = types.ModuleType(name)
    package.__path__ = [sys.argv[1] + "/" + name.replace(".", "/")]
    sys.modules[name] = package

from rocketmq.grpc_protocol import definition_pb2, service_pb2  # the default pool
from protocol.grpc import schema  # our private pool, in the same process

def same_on_the_wire(ours, theirs_class):
    theirs = theirs_class.FromString(ours.SerializeToString())
    assert theirs.SerializeToString(deterministic=True) == ours.SerializeToString(
        deterministic=True
    ), (ours, theirs)
    assert text_format.MessageToString(theirs) == text_format.MessageToString(ours)
    back = type(ours).FromString(theirs.SerializeToString())
    assert back == ours, (back, ours)

properties = schema.SystemProperties(
    tag="TagA", keys=["k1", "k2"], message_id="01" * 17, body_encoding=schema.Encoding.GZIP,
    message_type=schema.MessageType.FIFO, queue_offset=0, delivery_attempt=2,
    message_group="g", receipt_handle="rh", born_timestamp=schema.Timestamp(seconds=7),
)
message = schema.Message(
    topic=schema.Resource(resource_namespace="ns", name="T"), user_properties={"a": "1"},
    system_properties=properties, body=b"\x00body",
)
same_on_the_wire(schema.SendMessageRequest(messages=[message]), service_pb2.SendMessageRequest)
settings = schema.Settings(
    client_type=schema.ClientType.PUSH_CONSUMER,
    backoff_policy=schema.RetryPolicy(
        max_attempts=3,
        customized_backoff=schema.CustomizedBackoff(next=[schema.Duration(seconds=1)]),
    ),
    subscription=schema.Subscription(fifo=False, receive_batch_size=32),
)
command = schema.TelemetryCommand(status=schema.Status(code=schema.Code.OK), settings=settings)
same_on_the_wire(command, service_pb2.TelemetryCommand)

files = []
for module in (definition_pb2, service_pb2):
    proto = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(proto)
    files.append(base64.b64encode(proto.SerializeToString()).decode())
print(json.dumps({"files": files}))
"""


# ---------------------------------------------------------------- descriptor protos by name
def _messages(
    prefix: str, protos: Sequence[descriptor_pb2.DescriptorProto]
) -> Iterator[tuple[str, descriptor_pb2.DescriptorProto]]:
    """Every message (nested ones too, e.g. map entries) by full name, without a leading dot."""
    for proto in protos:
        full = f"{prefix}.{proto.name}"
        yield full, proto
        yield from _messages(full, proto.nested_type)


def _enums(
    package: str, files: Sequence[descriptor_pb2.FileDescriptorProto]
) -> dict[str, descriptor_pb2.EnumDescriptorProto]:
    enums = {f"{package}.{e.name}": e for file in files for e in file.enum_type}
    for file in files:
        for full, message in _messages(package, file.message_type):
            enums.update({f"{full}.{e.name}": e for e in message.enum_type})
    return enums


class Schema:
    """One side of the comparison: the descriptor protos of package ``apache.rocketmq.v2``."""

    def __init__(self, files: Sequence[descriptor_pb2.FileDescriptorProto]) -> None:
        package = schema.PACKAGE
        self.messages = dict(
            item for file in files for item in _messages(package, file.message_type)
        )
        self.enums = _enums(package, files)
        self.methods = {
            f"{package}.{service.name}.{method.name}": method
            for file in files
            for service in file.service
            for method in service.method
        }


def ours() -> Schema:
    """What our pool built (not the table: the table's translation is under test too)."""
    proto = descriptor_pb2.FileDescriptorProto()
    schema.FILE.CopyToProto(proto)
    return Schema([proto])


# ---------------------------------------------------------------- the comparison
def _field_facts(
    message: descriptor_pb2.DescriptorProto, field: descriptor_pb2.FieldDescriptorProto
) -> dict[str, object]:
    """What of a field reaches the wire or the generated API (json_name and comments do not)."""
    oneof = message.oneof_decl[field.oneof_index].name if field.HasField("oneof_index") else ""
    return {
        "number": field.number,
        "type": _FDP.Type.Name(field.type),
        "label": _FDP.Label.Name(field.label),
        "type_name": field.type_name,
        # A synthetic oneof is an artefact of proto3_optional, compared through that flag.
        "oneof": "" if field.proto3_optional else oneof,
        "proto3_optional": field.proto3_optional,
    }


def _diff_message(
    name: str, mine: descriptor_pb2.DescriptorProto, theirs: descriptor_pb2.DescriptorProto
) -> Iterator[str]:
    if mine.options.map_entry != theirs.options.map_entry:
        yield f"{name}: map_entry {mine.options.map_entry} != official {theirs.options.map_entry}"
    their_fields = {f.name: f for f in theirs.field}
    for field in mine.field:
        full = f"{name}.{field.name}"
        if field.name not in their_fields:
            if not newer_than_client(full):
                yield f"{full}: not in the official schema"
            continue
        facts = _field_facts(mine, field)
        official = _field_facts(theirs, their_fields[field.name])
        for key, value in facts.items():
            if value != official[key]:
                yield f"{full}: {key} {value!r} != official {official[key]!r}"


def _diff_enum(
    name: str, mine: descriptor_pb2.EnumDescriptorProto, theirs: descriptor_pb2.EnumDescriptorProto
) -> Iterator[str]:
    their_values = {v.name: v.number for v in theirs.value}
    for value in mine.value:
        full = f"{name}.{value.name}"
        if value.name not in their_values:
            if not newer_than_client(full):
                yield f"{full}: not in the official enum"
        elif value.number != their_values[value.name]:
            yield f"{full}: {value.number} != official {their_values[value.name]}"


def _diff_method(
    name: str,
    mine: descriptor_pb2.MethodDescriptorProto,
    theirs: descriptor_pb2.MethodDescriptorProto,
) -> Iterator[str]:
    for key in ("input_type", "output_type", "client_streaming", "server_streaming"):
        value, official = getattr(mine, key), getattr(theirs, key)
        if value != official:
            yield f"{name}: {key} {value!r} != official {official!r}"


def _diff_each(
    what: str,
    mine: Mapping[str, _Proto],
    theirs: Mapping[str, _Proto],
    diff: Callable[[str, _Proto, _Proto], Iterator[str]],
) -> Iterator[str]:
    for name, proto in mine.items():
        if name in theirs:
            yield from diff(name, proto, theirs[name])
        elif not newer_than_client(name):
            yield f"{name}: no such {what} in the official schema"


def schema_diff(mine: Schema, theirs: Schema) -> list[str]:
    """Every way in which what ``mine`` declares differs from ``theirs``, one line each."""
    return [
        *_diff_each("message", mine.messages, theirs.messages, _diff_message),
        *_diff_each("enum", mine.enums, theirs.enums, _diff_enum),
        *_diff_each("method", mine.methods, theirs.methods, _diff_method),
    ]


def declared_names(side: Schema) -> set[str]:
    """The full name of every message, field, enum, enum value and method of ``side``."""
    names = {*side.messages, *side.enums, *side.methods}
    names |= {f"{name}.{f.name}" for name, message in side.messages.items() for f in message.field}
    names |= {f"{name}.{v.name}" for name, enum in side.enums.items() for v in enum.value}
    return names


# ---------------------------------------------------------------- the official side
def export_official(env: ClientEnv, home: Path) -> Schema:
    """Run :data:`EXPORT_SCRIPT` in the client's venv; the client's schema it printed."""
    assert env.python is not None
    environ = {**os.environ, "HOME": str(home), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [str(env.python), "-s", "-c", EXPORT_SCRIPT, str(ROOT)],
        env=environ,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=EXPORT_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"export failed ({proc.returncode}):\n{proc.stderr}{proc.stdout}"
    files = json.loads(proc.stdout.strip().splitlines()[-1])["files"]
    return Schema(
        [descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(f)) for f in files]
    )


# ---------------------------------------------------------------- tests
@pytest.mark.interop
@pytest.mark.parametrize("client_env", ["py-grpc"], indirect=True)
def test_schema_matches_the_official_python_client(client_env: ClientEnv, tmp_path: Path) -> None:
    official = export_official(client_env, tmp_path)
    mine = ours()
    diffs = schema_diff(mine, official)
    assert not diffs, "trimq's schema differs from the official client's:\n" + "\n".join(diffs)
    # We declare the whole client schema (a client upgrade shows what is new), and the
    # allow-list holds exactly what the client lacks.
    assert declared_names(official) - declared_names(mine) == set()
    newer = declared_names(mine) - declared_names(official)
    assert {name for name in newer if not newer_than_client(name)} == set()
    assert newer >= NEWER_THAN_CLIENT, "stale entries on the allow-list"


def test_an_identical_schema_has_no_diff() -> None:
    assert schema_diff(ours(), ours()) == []
    assert len(ours().messages) > len(schema.MESSAGES)  # the map entries are in too


def _field(side: Schema, message: str, name: str) -> descriptor_pb2.FieldDescriptorProto:
    return next(f for f in side.messages[f"apache.rocketmq.v2.{message}"].field if f.name == name)


def test_the_diff_names_each_difference() -> None:
    theirs = ours()
    _field(theirs, "SystemProperties", "tag").number = 99
    _field(theirs, "Settings", "client_type").proto3_optional = False
    _field(theirs, "ReceiveMessageResponse", "status").ClearField("oneof_index")
    _field(theirs, "MessageQueue", "accept_message_types").label = _FDP.LABEL_OPTIONAL
    _field(theirs, "Broker", "endpoints").type_name = ".apache.rocketmq.v2.Address"
    theirs.enums["apache.rocketmq.v2.Code"].value[1].number = 200
    theirs.methods["apache.rocketmq.v2.MessagingService.Telemetry"].client_streaming = False
    theirs.messages["apache.rocketmq.v2.Message.UserPropertiesEntry"].options.map_entry = False
    assert sorted(schema_diff(ours(), theirs)) == [
        "apache.rocketmq.v2.Broker.endpoints: type_name '.apache.rocketmq.v2.Endpoints' "
        "!= official '.apache.rocketmq.v2.Address'",
        "apache.rocketmq.v2.Code.OK: 20000 != official 200",
        "apache.rocketmq.v2.Message.UserPropertiesEntry: map_entry True != official False",
        "apache.rocketmq.v2.MessageQueue.accept_message_types: label 'LABEL_REPEATED' "
        "!= official 'LABEL_OPTIONAL'",
        "apache.rocketmq.v2.MessagingService.Telemetry: client_streaming True != official False",
        "apache.rocketmq.v2.ReceiveMessageResponse.status: oneof 'content' != official ''",
        "apache.rocketmq.v2.Settings.client_type: oneof '' != official '_client_type'",
        "apache.rocketmq.v2.Settings.client_type: proto3_optional True != official False",
        "apache.rocketmq.v2.SystemProperties.tag: number 1 != official 99",
    ]


def test_only_the_allow_list_may_be_missing_officially() -> None:
    theirs = ours()
    settings = theirs.messages["apache.rocketmq.v2.Settings"]
    for name in ("client_properties", "user_agent"):
        settings.field.remove(_field(theirs, "Settings", name))
    del theirs.messages["apache.rocketmq.v2.Settings.ClientPropertiesEntry"]
    del theirs.messages["apache.rocketmq.v2.HeartbeatResponse"]
    del theirs.methods["apache.rocketmq.v2.MessagingService.PullMessage"]
    code = theirs.enums["apache.rocketmq.v2.Code"]
    for value in [
        v for v in code.value if v.name in ("INVALID_CLIENT_PROPERTIES", "PROXY_TIMEOUT")
    ]:
        code.value.remove(value)
    assert sorted(schema_diff(ours(), theirs)) == [
        "apache.rocketmq.v2.Code.PROXY_TIMEOUT: not in the official enum",
        "apache.rocketmq.v2.HeartbeatResponse: no such message in the official schema",
        "apache.rocketmq.v2.MessagingService.PullMessage: no such method in the official schema",
        "apache.rocketmq.v2.Settings.user_agent: not in the official schema",
    ]
    assert declared_names(ours()) - declared_names(theirs) == {
        "apache.rocketmq.v2.Code.PROXY_TIMEOUT",
        "apache.rocketmq.v2.HeartbeatResponse",
        "apache.rocketmq.v2.HeartbeatResponse.status",
        "apache.rocketmq.v2.MessagingService.PullMessage",
        "apache.rocketmq.v2.Settings.user_agent",
        "apache.rocketmq.v2.Settings.ClientPropertiesEntry.key",
        "apache.rocketmq.v2.Settings.ClientPropertiesEntry.value",
        *NEWER_THAN_CLIENT,
    }
