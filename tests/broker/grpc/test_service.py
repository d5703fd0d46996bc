"""The v2 MessagingService over a real broker, through the real gRPC server, over TCP.

What these pin is where the service meets the transport: requests that are no valid
protobuf, calls without ``x-mq-client-id``, unary calls with no or two messages, and the
ReceiveMessage long poll — its deadline (answered, never a hang), its wake-up by a send from
either front end, and the release of messages whose response stream broke before they left
(back within about a second, not at their invisible time).

Every test runs a broker in-process on 127.0.0.1 (``tests.broker.client.open_broker``) and is
bounded by ``trio.fail_after``. A few shorten the service's long-poll bounds with
``monkeypatch`` (module constants read at call time) so that a deadline can pass in about a
second instead of five.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio

import broker.grpc.service as service_module
from protocol.codes import RequestCode, ResponseCode
from protocol.command import request
from protocol.grpc import schema
from protocol.grpc.codes import Code, GrpcStatus
from protocol.grpc.framing import percent_decode
from protocol.headers.send import SendMessageRequestHeader
from protocol.message import decode_records
from protocol.properties import TAGS, UNIQ_KEY, encode_properties
from tests.broker.client import open_broker, open_client
from tests.broker.grpc.client import (
    GrpcClient,
    Reply,
    frame,
    open_grpc_client,
    receive_request,
    route_request,
    send_request,
    settings_command,
    wait_parked,
)

pytestmark = pytest.mark.integration

TIMEOUT = 20
GROUP = "GrpcGroup"


# ---------------------------------------------------------------- helpers
def contents(reply: Reply) -> list[str]:
    """The kinds of a ReceiveMessage response stream, in order."""
    return [m.WhichOneof("content") for m in reply.decode(schema.ReceiveMessageResponse)]


def receive_status(reply: Reply) -> int:
    """The v2 code of a ReceiveMessage response stream's status message."""
    assert reply.status == 0, (reply.status, reply.message)
    responses = reply.decode(schema.ReceiveMessageResponse)
    statuses = [r.status.code for r in responses if r.WhichOneof("content") == "status"]
    assert len(statuses) == 1, responses
    code: int = statuses[0]
    return code


def bodies(reply: Reply) -> list[bytes]:
    """The bodies of the messages of a ReceiveMessage response stream."""
    return [
        r.message.body
        for r in reply.decode(schema.ReceiveMessageResponse)
        if r.WhichOneof("content") == "message"
    ]


async def send(client: GrpcClient, topic: str, body: bytes) -> Any:
    reply = await client.unary("SendMessage", send_request(topic, body))
    answer = reply.one(schema.SendMessageResponse)
    assert answer.status.code == Code.OK, answer
    return answer


async def receive(
    client: GrpcClient,
    topic: str,
    *,
    group: str = GROUP,
    poll_s: int = 5,
    invisible_s: int = 30,
    grpc_timeout: str = "10S",
) -> Reply:
    return await client.server_streaming(
        "ReceiveMessage",
        receive_request(topic, group, poll_s=poll_s, invisible_s=invisible_s),
        grpc_timeout=grpc_timeout,
    )


async def create_topic(client: GrpcClient, topic: str) -> None:
    """Create ``topic`` by a send, and consume that message so the next receive parks."""
    await send(client, topic, b"creates the topic")
    assert bodies(await receive(client, topic)) == [b"creates the topic"]


@pytest.fixture
def short_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Long polls of ~1 s are allowed (the proxy's minimum is 5 s)."""
    monkeypatch.setattr(service_module, "MIN_POLL_MS", 100)
    monkeypatch.setattr(service_module, "POLL_MARGIN_MS", 200)


# ---------------------------------------------------------------- malformed requests
@pytest.mark.parametrize(
    "method", ["QueryRoute", "SendMessage", "AckMessage", "ReceiveMessage", "Telemetry"]
)
async def test_request_that_is_not_protobuf_is_internal(tmp_path: Path, method: str) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            reply = await client.call(method, b"\xff\xff\xff\xff", grpc_timeout="10S")
            assert reply.status == GrpcStatus.INTERNAL
            assert "not a valid" in percent_decode(reply.message)
            # The connection is fine.
            assert (await client.unary("QueryRoute", route_request("T"))).status == 0


async def test_unary_call_without_a_message_is_internal(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            reply = await client.call("QueryRoute")
            assert reply.status == GrpcStatus.INTERNAL
            assert "no message" in percent_decode(reply.message)


async def test_unary_call_with_two_messages_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            reply = await client.call("QueryRoute", route_request("T"), route_request("U"))
            # grpc-java answers INTERNAL ("More than one request messages for unary call").
            assert reply.status == GrpcStatus.INTERNAL
            assert reply.messages == []


async def test_message_split_over_many_data_frames(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            body = bytes(range(256)) * 400
            data = frame(send_request("SplitTopic", body).SerializeToString())
            call = await client.start_call("SendMessage")
            for i in range(0, len(data), 1000):
                await client.send_data(call.stream_id, data[i : i + 1000])
            await call.close_send()
            answer = (await call.result()).one(schema.SendMessageResponse)
            assert answer.status.code == Code.OK
            assert bodies(await receive(client, "SplitTopic")) == [body]


async def test_message_over_the_broker_limit_and_over_the_transport_limit(tmp_path: Path) -> None:
    # max_message_size is 256 KiB in test brokers; the transport takes 64 KiB more.
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            reply = await client.unary("SendMessage", send_request("BigTopic", b"x" * 300_000))
            answer = reply.one(schema.SendMessageResponse)
            assert answer.status.code == Code.MESSAGE_BODY_TOO_LARGE
            reply = await client.unary("SendMessage", send_request("BigTopic", b"x" * 400_000))
            assert reply.status == GrpcStatus.RESOURCE_EXHAUSTED
            assert (await client.unary("QueryRoute", route_request("T"))).status == 0
            assert handle.broker.statistics().store.puts == 0


# ---------------------------------------------------------------- x-mq-client-id
@pytest.mark.parametrize("client_id", [None, ""])
async def test_missing_client_id_is_client_id_required(
    tmp_path: Path, client_id: str | None
) -> None:
    unary = {
        "QueryRoute": (route_request("T"), schema.QueryRouteResponse),
        "SendMessage": (send_request("T"), schema.SendMessageResponse),
        "Heartbeat": (schema.HeartbeatRequest(), schema.HeartbeatResponse),
        "AckMessage": (schema.AckMessageRequest(), schema.AckMessageResponse),
        "NotifyClientTermination": (
            schema.NotifyClientTerminationRequest(),
            schema.NotifyClientTerminationResponse,
        ),
    }
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            for method, (req, response) in unary.items():
                reply = await client.unary(method, req, client_id=client_id)
                answer = reply.one(response)
                assert answer.status.code == Code.CLIENT_ID_REQUIRED, method
            reply = await client.server_streaming(
                "ReceiveMessage",
                receive_request("T", GROUP),
                client_id=client_id,
                grpc_timeout="10S",
            )
            assert receive_status(reply) == Code.CLIENT_ID_REQUIRED
            # Telemetry: each command is answered CLIENT_ID_REQUIRED; the stream stays open.
            async with client.open_call("Telemetry", client_id=client_id) as telemetry:
                for _ in range(2):
                    await telemetry.send(settings_command(GROUP, "T"))
                    answer = schema.TelemetryCommand.FromString(await telemetry.receive())
                    assert answer.status.code == Code.CLIENT_ID_REQUIRED
                    assert not answer.HasField("settings")
                await telemetry.close_send()
                assert (await telemetry.result()).status == 0
            # Nothing was sent on the way.
            assert handle.broker.statistics().store.puts == 0


# ---------------------------------------------------------------- receive: deadlines
async def test_receive_whose_deadline_leaves_too_little_is_illegal_polling_time(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            await create_topic(client, "DeadlineTopic")
            start = trio.current_time()
            reply = await receive(client, "DeadlineTopic", grpc_timeout="2S")
            assert trio.current_time() - start < 1.5  # answered at once, no park
            assert receive_status(reply) == Code.ILLEGAL_POLLING_TIME


async def test_receive_answers_before_its_grpc_timeout(tmp_path: Path, short_polls: None) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            await create_topic(client, "DeadlineTopic")
            start = trio.current_time()
            reply = await receive(client, "DeadlineTopic", poll_s=20, grpc_timeout="1200m")
            elapsed = trio.current_time() - start
            # Parked for the deadline less the margin, then a status (not DEADLINE_EXCEEDED).
            assert 0.7 < elapsed < 1.2
            assert receive_status(reply) == Code.MESSAGE_NOT_FOUND
            assert handle.broker.pops.engine.hub.statistics().parked == 0


async def test_receive_whose_deadline_passes_while_parked_ends_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A poll longer than the call's deadline (the margin made negative): the deadline
    # cancels the parked pop; the call ends with DEADLINE_EXCEEDED, nothing stays parked
    # and the connection serves on.
    monkeypatch.setattr(service_module, "MIN_POLL_MS", 100)
    monkeypatch.setattr(service_module, "POLL_MARGIN_MS", -3000)
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            await create_topic(client, "DeadlineTopic")
            start = trio.current_time()
            reply = await receive(client, "DeadlineTopic", poll_s=20, grpc_timeout="800m")
            elapsed = trio.current_time() - start
            assert reply.status == GrpcStatus.DEADLINE_EXCEEDED
            assert 0.7 < elapsed < 2
            assert handle.broker.pops.engine.hub.statistics().parked == 0
            # A message sent now is not lost to the cancelled pop.
            await send(client, "DeadlineTopic", b"after the deadline")
            monkeypatch.setattr(service_module, "POLL_MARGIN_MS", 200)
            assert bodies(await receive(client, "DeadlineTopic")) == [b"after the deadline"]


# ---------------------------------------------------------------- receive: wake-ups
async def test_parked_receive_is_woken_by_a_grpc_send(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as handle,
            open_grpc_client(handle.grpc_port) as consumer,
            open_grpc_client(handle.grpc_port) as producer,
        ):
            await create_topic(consumer, "WakeTopic")
            call = await consumer.start_call("ReceiveMessage", grpc_timeout="30S")
            await call.send(receive_request("WakeTopic", GROUP, poll_s=20), end=True)
            await wait_parked(handle)
            sent_at = trio.current_time()
            await send(producer, "WakeTopic", b"wake up")
            reply = await call.result()
            latency = trio.current_time() - sent_at
            assert bodies(reply) == [b"wake up"]
            assert contents(reply) == ["status", "message", "delivery_timestamp"]
            assert latency < 2  # the poll would have lasted 20 s


async def test_parked_receive_is_woken_by_a_remoting_send(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as handle,
            open_grpc_client(handle.grpc_port) as consumer,
            open_client(handle.port) as producer,
        ):
            await create_topic(consumer, "WakeTopic")
            call = await consumer.start_call("ReceiveMessage", grpc_timeout="30S")
            await call.send(receive_request("WakeTopic", GROUP, poll_s=20), end=True)
            await wait_parked(handle)
            header = SendMessageRequestHeader(
                producer_group="remoting_producer",
                topic="WakeTopic",
                default_topic="TBW102",
                default_topic_queue_nums=4,
                queue_id=1,
                sys_flag=0,
                born_timestamp=1_700_000_000_000,
                flag=0,
                properties=encode_properties({TAGS: "TagA", UNIQ_KEY: "AC1100010000" + "0" * 20}),
            )
            sent_at = trio.current_time()
            answer = await producer.request(
                request(RequestCode.SEND_MESSAGE, 0, header.to_ext(), b"from remoting")
            )
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            reply = await call.result()
            latency = trio.current_time() - sent_at
            assert bodies(reply) == [b"from remoting"]
            (message,) = [
                r.message
                for r in reply.decode(schema.ReceiveMessageResponse)
                if r.WhichOneof("content") == "message"
            ]
            assert message.system_properties.tag == "TagA"
            assert latency < 2


async def test_receive_on_a_topic_not_created_yet_is_woken_by_its_first_send(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as handle,
            open_grpc_client(handle.grpc_port) as consumer,
            open_grpc_client(handle.grpc_port) as producer,
        ):
            call = await consumer.start_call("ReceiveMessage", grpc_timeout="30S")
            await call.send(receive_request("BrandNewTopic", GROUP, poll_s=20), end=True)
            await wait_parked(handle)
            sent_at = trio.current_time()
            await send(producer, "BrandNewTopic", b"first")
            reply = await call.result()
            assert bodies(reply) == [b"first"]
            assert trio.current_time() - sent_at < 2  # far below the 20 s poll


async def test_parked_receives_on_one_connection_share_the_messages(
    tmp_path: Path, short_polls: None
) -> None:
    with trio.fail_after(TIMEOUT):
        async with (
            open_broker(tmp_path) as handle,
            open_grpc_client(handle.grpc_port) as consumer,
            open_grpc_client(handle.grpc_port) as producer,
        ):
            await create_topic(consumer, "ShareTopic")
            calls = []
            for _ in range(10):
                call = await consumer.start_call("ReceiveMessage", grpc_timeout="2S")
                await call.send(receive_request("ShareTopic", GROUP, poll_s=20), end=True)
                calls.append(call)
            await wait_parked(handle, 10)
            sent = [b"shared %d" % i for i in range(10)]
            for body in sent:
                await send(producer, "ShareTopic", body)
            received: list[bytes] = []
            for call in calls:
                reply = await call.result()
                assert reply.status == 0
                received += bodies(reply)
            assert sorted(received) == sorted(sent)  # each exactly once
            assert handle.broker.pops.engine.hub.statistics().parked == 0


# ---------------------------------------------------------------- receive: broken streams
@pytest.mark.parametrize("auto_renew", [False, True], ids=["simple", "auto_renew"])
@pytest.mark.parametrize("drop_connection", [False, True], ids=["rst_stream", "tcp_close"])
async def test_receive_broken_mid_response_releases_its_messages_within_a_second(
    tmp_path: Path, drop_connection: bool, auto_renew: bool
) -> None:
    """The must-show: streams reset mid-response — the undelivered messages come back
    within ~1 s, not at their invisible time (60 s here).

    A consumer with a 64-byte window receives: the server pops every message and starts
    answering, the window holds the messages back, and the consumer breaks the stream — by
    RST_STREAM (its connection stays open), or by dropping its connection. Another consumer
    of the group then gets them all, about a second later, on their second delivery. The
    same for a push consumer's receive (``auto_renew``: leases renewed while it works)."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            sent = [b"message %d" % i for i in range(5)]
            for body in sent:
                await send(client, "BreakTopic", body)
            async with open_grpc_client(
                handle.grpc_port, initial_window=64, auto_ack=False
            ) as stalled:
                call = await stalled.start_call("ReceiveMessage", grpc_timeout="30S")
                req = receive_request("BreakTopic", GROUP, invisible_s=60, auto_renew=auto_renew)
                await call.send(req, end=True)
                await call.wait_headers()  # the server popped and started answering
                assert handle.broker.statistics().pop.in_flight == len(sent)
                assert not call.done
                if drop_connection:
                    await stalled.stream.aclose()
                else:
                    await call.reset()
                broke_at = trio.current_time()
                # They come back as their leases end, maybe not in one batch.
                messages: list[Any] = []
                for _ in range(len(sent)):
                    reply = await receive(client, "BreakTopic", poll_s=10, grpc_timeout="15S")
                    messages += [
                        r.message
                        for r in reply.decode(schema.ReceiveMessageResponse)
                        if r.WhichOneof("content") == "message"
                    ]
                    if len(messages) >= len(sent):
                        break
                back_after = trio.current_time() - broke_at
                if not drop_connection:
                    assert not stalled.closed.is_set()
            assert sorted(m.body for m in messages) == sorted(sent)  # each once
            assert back_after < 2.5, back_after
            # The broken delivery counts as one.
            assert {m.system_properties.delivery_attempt for m in messages} == {2}


async def test_receive_delivered_whole_keeps_its_messages_invisible(
    tmp_path: Path, short_polls: None
) -> None:
    # The control: a receive whose messages all left keeps them invisible.
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            await send(client, "KeepTopic", b"kept")
            assert bodies(await receive(client, "KeepTopic", invisible_s=60)) == [b"kept"]
            reply = await receive(client, "KeepTopic", poll_s=20, grpc_timeout="2S")
            assert receive_status(reply) == Code.MESSAGE_NOT_FOUND
            assert handle.broker.statistics().pop.in_flight == 1


# ---------------------------------------------------------------- telemetry
async def test_telemetry_answers_settings_with_status_ok_and_ends_with_the_client(
    tmp_path: Path,
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            async with client.open_call("Telemetry", grpc_timeout="8760H") as call:
                for _ in range(2):
                    await call.send(settings_command(GROUP, "T"))
                    answer = schema.TelemetryCommand.FromString(await call.receive())
                    assert answer.status.code == Code.OK
                    assert answer.settings.backoff_policy.max_attempts > 0
                    assert answer.settings.subscription.receive_batch_size > 0
                await call.close_send()
                reply = await call.result()
            assert reply.status == 0
            assert reply.headers[":status"] == "200"


async def test_recall_cancels_a_delayed_message_before_its_delivery(tmp_path: Path) -> None:
    """SendMessage of a delayed message returns a recall handle; RecallMessage with it means
    the message is never delivered (a twin due at the same time is); a second recall, a
    foreign topic and a handle that is not ours are refused."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            deliver_at = handle.broker.clock.now_ms() + 1_500

            def delayed(body: bytes) -> Any:
                req = send_request("RecallTopic", body)
                message = req.messages[0]
                message.system_properties.message_type = schema.MessageType.DELAY
                ts = message.system_properties.delivery_timestamp
                ts.seconds, ts.nanos = divmod(deliver_at, 1000)
                ts.nanos *= 1_000_000
                return req

            kept = (await client.unary("SendMessage", delayed(b"kept"))).one(
                schema.SendMessageResponse
            )
            gone = (await client.unary("SendMessage", delayed(b"recalled"))).one(
                schema.SendMessageResponse
            )
            handle_text = gone.entries[0].recall_handle
            assert handle_text and kept.entries[0].recall_handle

            def recall(topic: str, text: str) -> Any:
                req = schema.RecallMessageRequest()
                req.topic.name, req.recall_handle = topic, text
                return req

            ok = (await client.unary("RecallMessage", recall("RecallTopic", handle_text))).one(
                schema.RecallMessageResponse
            )
            assert ok.status.code == Code.OK and ok.message_id == gone.entries[0].message_id
            for topic, text, code in (
                ("RecallTopic", handle_text, Code.NOT_FOUND),  # recalled already
                ("Other", handle_text, Code.BAD_REQUEST),
                ("RecallTopic", "not-a-handle", Code.BAD_REQUEST),
            ):
                refused = (await client.unary("RecallMessage", recall(topic, text))).one(
                    schema.RecallMessageResponse
                )
                assert refused.status.code == code, (topic, text, refused)
            # The twin arrives (a parked receive wakes on its delivery); both were due at once.
            assert bodies(await receive(client, "RecallTopic")) == [b"kept"]
            timers = handle.broker.timers
            assert (timers.statistics().delivered, timers.statistics().recalled) == (1, 1)
            got = handle.broker.store.get("RecallTopic", 0, 0, 32)
            bodies_there = [m.body for m in decode_records(got.body)] if got.body else []
            for queue_id in range(1, 4):
                more = handle.broker.store.get("RecallTopic", queue_id, 0, 32)
                bodies_there += [m.body for m in decode_records(more.body)] if more.body else []
            assert bodies_there == [b"kept"]


async def test_receive_with_an_sql92_filter(tmp_path: Path) -> None:
    """A SQL filter expression selects by user properties; one that does not parse is
    ILLEGAL_FILTER_EXPRESSION."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_grpc_client(handle.grpc_port) as client:
            await create_topic(client, "SqlTopic")
            for body, region in ((b"eu-1", "eu"), (b"us-1", "us"), (b"eu-2", "eu")):
                req = send_request("SqlTopic", body)
                req.messages[0].user_properties["region"] = region
                await client.unary("SendMessage", req)

            def sql(expression: str) -> Any:
                req = receive_request("SqlTopic", "SqlGroup", poll_s=5)
                req.filter_expression.type = schema.FilterType.SQL
                req.filter_expression.expression = expression
                return req

            reply = await client.server_streaming("ReceiveMessage", sql("region = 'eu'"))
            assert sorted(bodies(reply)) == [b"eu-1", b"eu-2"]
            reply = await client.server_streaming("ReceiveMessage", sql("region = "))
            assert receive_status(reply) == Code.ILLEGAL_FILTER_EXPRESSION
