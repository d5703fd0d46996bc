"""``protocol.grpc.schema``: the v2 schema table, its private pool, message classes and routes.

Field numbers and types are pinned here by hand-computed wire bytes; the full comparison with
the official client's descriptors is ``tests/interop/test_grpc_schema.py``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, descriptor_pool

from protocol.grpc import schema
from protocol.grpc.codes import Code, GrpcStatus
from protocol.grpc.schema import ClientType, Encoding, MessageType, Permission

SERVICE = "/apache.rocketmq.v2.MessagingService"


def _file_proto() -> descriptor_pb2.FileDescriptorProto:
    """What the pool holds for our file (after the pool built it)."""
    proto = descriptor_pb2.FileDescriptorProto()
    schema.FILE.CopyToProto(proto)
    return proto


def _message_proto(name: str) -> descriptor_pb2.DescriptorProto:
    return next(m for m in _file_proto().message_type if m.name == name)


# ---------------------------------------------------------------- wire bytes
@pytest.mark.parametrize(
    ("message", "wire"),
    [
        # field 2 (name), length-delimited: tag 2 << 3 | 2 = 0x12
        (schema.Resource(name="T"), b"\x12\x01T"),
        # field 1 (code), varint 20000 = 0xA0 0x9C 0x01
        (schema.Status(code=Code.OK), b"\x08\xa0\x9c\x01"),
        # proto3 optional: an explicit 0 is sent (field 14, varint: tag 0x70)
        (schema.SystemProperties(queue_offset=0), b"\x70\x00"),
        # a map entry is a nested message {key = 1, value = 2} under field 2
        (schema.Message(user_properties={"a": "b"}), b"\x12\x06\x0a\x01a\x12\x01b"),
        # oneof member 3, a Timestamp {seconds = 1}
        (
            schema.ReceiveMessageResponse(delivery_timestamp=schema.Timestamp(seconds=1)),
            b"\x1a\x02\x08\x01",
        ),
        # an enum is a varint: permission = READ_WRITE (4) in field 3
        (schema.MessageQueue(permission=Permission.READ_WRITE), b"\x18\x04"),
    ],
)
def test_wire_bytes_pin_the_field_numbers(message: Any, wire: bytes) -> None:
    assert message.SerializeToString() == wire
    assert type(message).FromString(wire) == message


# ---------------------------------------------------------------- round trips
def _sample_message() -> Any:
    born = schema.Timestamp()
    born.FromDatetime(dt.datetime(2026, 11, 24, 2, 15, 19, tzinfo=dt.UTC))
    return schema.Message(
        topic=schema.Resource(resource_namespace="ns", name="TopicA"),
        user_properties={"color": "blue", "empty": ""},
        system_properties=schema.SystemProperties(
            tag="TagA",
            keys=["k1", "k2"],
            message_id="01" * 17,
            body_encoding=Encoding.IDENTITY,
            message_type=MessageType.FIFO,
            born_timestamp=born,
            born_host="10.0.0.1",
            queue_offset=0,
            delivery_attempt=1,
            message_group="group-1",
            invisible_duration=schema.Duration(seconds=30),
            dead_letter_queue=schema.DeadLetterQueue(topic="%DLQ%g", message_id="m"),
        ),
        body=b"\x00\xffbody",
    )


def test_send_message_request_round_trip() -> None:
    request = schema.SendMessageRequest(messages=[_sample_message()])
    back = schema.SendMessageRequest.FromString(request.SerializeToString())
    assert back == request
    message = back.messages[0]
    assert dict(message.user_properties) == {"color": "blue", "empty": ""}
    props = message.system_properties
    assert list(props.keys) == ["k1", "k2"]
    assert props.body_encoding == Encoding.IDENTITY
    assert props.born_timestamp.ToDatetime(dt.UTC) == dt.datetime(
        2026, 11, 24, 2, 15, 19, tzinfo=dt.UTC
    )
    assert props.invisible_duration.ToMilliseconds() == 30_000
    # Present optional fields, including a zero, and absent ones are told apart.
    for name in ("tag", "queue_offset", "delivery_attempt", "message_group", "dead_letter_queue"):
        assert props.HasField(name), name
    for name in ("store_timestamp", "receipt_handle", "trace_context", "lite_topic", "priority"):
        assert not props.HasField(name), name


def test_receive_message_response_is_one_of_three() -> None:
    status = schema.ReceiveMessageResponse(status=schema.Status(code=Code.MESSAGE_NOT_FOUND))
    message = schema.ReceiveMessageResponse(message=_sample_message())
    stamp = schema.ReceiveMessageResponse(delivery_timestamp=schema.Timestamp(seconds=5))
    for response, which in (
        (status, "status"),
        (message, "message"),
        (stamp, "delivery_timestamp"),
    ):
        back = schema.ReceiveMessageResponse.FromString(response.SerializeToString())
        assert back.WhichOneof("content") == which
        assert back == response
    assert Code(status.status.code) is Code.MESSAGE_NOT_FOUND
    # Setting another member clears the first.
    status.message.CopyFrom(_sample_message())
    assert status.WhichOneof("content") == "message"
    assert not status.HasField("status")


def test_telemetry_settings_with_backoff_round_trip() -> None:
    settings = schema.Settings(
        client_type=ClientType.PUSH_CONSUMER,
        request_timeout=schema.Duration(seconds=3),
        backoff_policy=schema.RetryPolicy(
            max_attempts=17,
            exponential_backoff=schema.ExponentialBackoff(
                initial=schema.Duration(seconds=1), max=schema.Duration(seconds=10), multiplier=2.0
            ),
        ),
        subscription=schema.Subscription(
            group=schema.Resource(name="G"),
            subscriptions=[
                schema.SubscriptionEntry(
                    topic=schema.Resource(name="T"),
                    expression=schema.FilterExpression(type=schema.FilterType.TAG, expression="*"),
                )
            ],
            fifo=False,
            receive_batch_size=32,
            long_polling_timeout=schema.Duration(seconds=20),
        ),
        user_agent=schema.UA(language=schema.Language.PYTHON, version="5.1.2"),
        client_properties={"zone": "a"},
    )
    command = schema.TelemetryCommand(status=schema.Status(code=Code.OK), settings=settings)
    back = schema.TelemetryCommand.FromString(command.SerializeToString())
    assert back == command
    assert back.WhichOneof("command") == "settings"
    assert back.HasField("status")
    assert back.settings.WhichOneof("pub_sub") == "subscription"
    assert back.settings.backoff_policy.WhichOneof("strategy") == "exponential_backoff"
    assert back.settings.subscription.HasField("fifo")  # explicitly false
    assert back.settings.backoff_policy.exponential_backoff.max.ToSeconds() == 10
    # The other strategy replaces the first.
    back.settings.backoff_policy.customized_backoff.next.add(seconds=1)
    assert back.settings.backoff_policy.WhichOneof("strategy") == "customized_backoff"
    assert not schema.TelemetryCommand().HasField("status")


def test_well_known_types_come_from_the_private_pool() -> None:
    stamp = schema.Timestamp()
    stamp.FromMilliseconds(1_500)
    assert (stamp.seconds, stamp.nanos) == (1, 500_000_000)
    assert schema.Duration.DESCRIPTOR.file.pool is schema.POOL
    props = schema.SystemProperties(store_timestamp=stamp)
    assert props.store_timestamp.ToMilliseconds() == 1_500


# ---------------------------------------------------------------- the pool and the layout
def test_the_default_pool_never_sees_our_names() -> None:
    default = descriptor_pool.Default()
    assert schema.POOL is not default
    with pytest.raises(KeyError):
        default.FindMessageTypeByName("apache.rocketmq.v2.Resource")
    with pytest.raises(KeyError):
        default.FindFileByName(schema.FILE_NAME)
    assert schema.Resource.DESCRIPTOR.file.pool is schema.POOL


def test_every_table_message_is_a_module_class() -> None:
    for spec in schema.MESSAGES:
        cls = getattr(schema, spec.name)
        assert cls.DESCRIPTOR.full_name == f"apache.rocketmq.v2.{spec.name}"
        assert [f.name for f in cls.DESCRIPTOR.fields] == [f.name for f in spec.fields]
    assert len(schema.MESSAGES) == len({spec.name for spec in schema.MESSAGES}) == 65


def test_map_fields_are_map_entries_as_protoc_makes_them() -> None:
    message = _message_proto("Message")
    field = next(f for f in message.field if f.name == "user_properties")
    assert field.label == descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    assert field.type_name == ".apache.rocketmq.v2.Message.UserPropertiesEntry"
    (entry,) = message.nested_type
    assert entry.name == "UserPropertiesEntry"
    assert entry.options.map_entry
    assert [(f.name, f.number) for f in entry.field] == [("key", 1), ("value", 2)]
    settings_map = schema.Settings.DESCRIPTOR.fields_by_name["client_properties"]
    assert settings_map.message_type.GetOptions().map_entry
    assert settings_map.number == 9


def test_proto3_optional_fields_get_synthetic_oneofs_after_the_real_ones() -> None:
    telemetry = _message_proto("TelemetryCommand")
    assert [o.name for o in telemetry.oneof_decl] == ["command", "_status"]
    status = telemetry.field[0]
    assert (status.name, status.proto3_optional, status.oneof_index) == ("status", True, 1)
    settings = _message_proto("Settings")
    assert [o.name for o in settings.oneof_decl] == [
        "pub_sub",
        "_client_type",
        "_access_point",
        "_backoff_policy",
        "_request_timeout",
    ]
    # A real oneof member is not proto3-optional.
    assert not any(f.proto3_optional for f in settings.field if f.name == "publishing")


def test_a_field_cannot_be_both_repeated_and_optional() -> None:
    with pytest.raises(ValueError, match="exclude each other"):
        schema.Field("x", 1, "string", rep=True, opt=True)
    with pytest.raises(ValueError, match="exclude each other"):
        schema.Field("x", 1, "string", opt=True, oneof="o")


# ---------------------------------------------------------------- enums
def test_enums_are_built_from_the_int_enums() -> None:
    for name, members in schema.ENUMS.items():
        descriptor = schema.POOL.FindEnumTypeByName(f"apache.rocketmq.v2.{name}")
        assert [(v.name, v.number) for v in descriptor.values] == [
            (m.name, m.value) for m in members
        ]
    nested = schema.OffsetOption.DESCRIPTOR.enum_types_by_name["Policy"]
    assert [v.name for v in nested.values] == [m.name for m in schema.OffsetOptionPolicy]
    assert schema.ENUMS["Code"] is Code
    assert len(schema.ENUMS) == 13


def test_codes() -> None:
    assert (Code.OK, Code.MULTIPLE_RESULTS, Code.BAD_REQUEST) == (20000, 30000, 40000)
    assert (Code.MESSAGE_NOT_FOUND, Code.INVALID_RECEIPT_HANDLE) == (40401, 40013)
    assert [s.value for s in GrpcStatus] == list(range(17))
    assert (GrpcStatus.UNIMPLEMENTED.value, GrpcStatus.UNAUTHENTICATED.value) == (12, 16)


# ---------------------------------------------------------------- routing
def test_methods_route_every_rpc_with_its_streaming_flags() -> None:
    assert len(schema.METHODS) == 17
    streaming = {
        path: (m.client_streaming, m.server_streaming) for path, m in schema.METHODS.items()
    }
    assert streaming.pop(f"{SERVICE}/ReceiveMessage") == (False, True)
    assert streaming.pop(f"{SERVICE}/PullMessage") == (False, True)
    assert streaming.pop(f"{SERVICE}/Telemetry") == (True, True)
    assert set(streaming.values()) == {(False, False)}  # the 14 others are unary
    for path, method in schema.METHODS.items():
        assert path == method.path == f"{SERVICE}/{method.name}"


def test_methods_carry_the_message_classes() -> None:
    route = schema.METHODS[f"{SERVICE}/QueryRoute"]
    assert route.request is schema.QueryRouteRequest
    assert route.response is schema.QueryRouteResponse
    telemetry = schema.METHODS[f"{SERVICE}/Telemetry"]
    assert telemetry.request is telemetry.response is schema.TelemetryCommand
    heartbeat = schema.METHODS[f"{SERVICE}/Heartbeat"]
    parsed = heartbeat.request.FromString(
        schema.HeartbeatRequest(client_type=ClientType.PRODUCER).SerializeToString()
    )
    assert parsed == schema.HeartbeatRequest(client_type=ClientType.PRODUCER)
