"""SQL92 subscriptions of our own client (``FilterExpression.sql``): SimpleConsumer and
PushConsumer (pull and pop mode) get exactly the matching messages from a real broker, TAG
subscriptions keep working beside them, a bad expression fails before anything is sent, and
a broker that refuses SQL92 (``enable_property_filter=False``) makes the consumer raise
``SubscriptionRefusedError`` instead of receiving nothing. Under trio and asyncio."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
import structlog

from client import (
    ClientConfig,
    FilterExpression,
    FilterType,
    Message,
    Producer,
    PushConsumer,
    SimpleConsumer,
    SubscriptionRefusedError,
)
from client import sync as blocking
from client.filters import as_filter, as_filters
from client.instance import ClientInstance, open_instance
from client.message import ReceivedMessage
from client.pop import pop_request
from client.push import ConsumeResult, pull_api
from client.simple_consumer import subscription_data
from protocol.bodies.consumer import MessageQueue
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand, request
from tests.client.harness import BrokerThread, broker_thread, run

#: What the producer sends in every scenario: ``n`` 0..19, red for even ``n``; two messages
#: without ``n`` or ``color`` (NULL in SQL92: they never match a comparison).
N = 20
RED_AND_BIG = "color = 'red' AND n > 5"
#: Short timers, as tests/client/test_push.py.
FAST: dict[str, Any] = {
    "consume_from": "first", "long_poll": 1.0, "rebalance_interval": 2.0,
    "persist_interval": 0.5, "shutdown_timeout": 5.0,
}  # fmt: skip


@pytest.fixture(autouse=True)
def _default_logging() -> None:
    """See tests/client/test_push.py: structlog's defaults, not a closed captured stream."""
    structlog.reset_defaults()


def _messages(topic: str) -> list[Message]:
    out = []
    for i in range(N):
        color, tag = ("red", "even") if i % 2 == 0 else ("blue", "odd")
        properties = {"n": str(i), "color": color}
        out.append(Message(topic, f"m{i}".encode(), tag=tag, properties=properties))
    out += [Message(topic, b"bare", tag="even"), Message(topic, b"bare2")]
    return out


def _bodies(keep: Callable[[int], bool]) -> list[bytes]:
    return sorted(f"m{i}".encode() for i in range(N) if keep(i))


async def _send(config: ClientConfig, messages: list[Message], key: str | None = None) -> None:
    # One sharding key puts every message on one queue, in order (the push tests rely on it).
    async with Producer(config) as producer:
        for message in messages:
            await producer.send(message, sharding_key=key)


async def _receive_exactly(consumer: SimpleConsumer, count: int) -> list[ReceivedMessage]:
    """Receive and ack until ``count`` messages came (bounded), then check nothing else is
    ready: the messages are all stored already, so a zero-wait receive sweeping every queue
    would return any other message the broker let through."""
    got: list[ReceivedMessage] = []
    with anyio.fail_after(20):
        while len(got) < count:
            batch = await consumer.receive(32, invisible_duration=30, await_duration=1)
            await consumer.ack_many(batch)
            got += batch
    assert await consumer.receive(32, invisible_duration=30, await_duration=0) == []
    return got


# ---------------------------------------------------------------------- units (no broker)
def test_filter_expression_and_wire_shapes() -> None:
    """Tag and SQL92 filters, the plain-``str`` default, heartbeat and pop shapes."""
    sql = FilterExpression.sql(RED_AND_BIG)
    assert sql.type is FilterType.SQL92 and sql.is_sql and sql.expression == RED_AND_BIG
    assert FilterExpression.tag("a || b") == as_filter("a || b") == FilterExpression("a || b")
    assert FilterExpression() == FilterExpression.tag("*")
    assert as_filters({"T": "*", "U": sql}) == {"T": FilterExpression(), "U": sql}
    # The broker filters SQL92 exactly: the client-side re-check is for tags only.
    assert sql.matches_tag(None) and sql.matches_tag("x")
    assert FilterExpression.tag("a || b").matches_tag("b")
    assert not FilterExpression.tag("a || b").matches_tag(None)

    data = subscription_data("T", sql)
    assert (data.sub_string, data.expression_type, data.tags_set) == (RED_AND_BIG, "SQL92", ())
    tags = subscription_data("T", "a || b")
    assert (tags.sub_string, tags.expression_type, tags.tags_set) == ("a || b", "TAG", ("a", "b"))
    assert subscription_data("T", "").sub_string == "*"


class _RequestOnly:
    """The one part of a ClientInstance that building a request uses."""

    def request(self, code: int, ext: dict[str, str] | None = None) -> RemotingCommand:
        return request(code, 0, ext)


def _pop_fields(expression: str | FilterExpression = "*") -> Mapping[str, str]:
    instance = cast(ClientInstance, _RequestOnly())
    cmd = pop_request(
        instance, "g", "T", max_messages=1, invisible_ms=1000, poll_ms=0, expression=expression
    )
    return cmd.ext_fields


def test_pop_request_carries_the_expression_type() -> None:
    """POP_MESSAGE names ``expType`` SQL92 and the expression; a plain pop stays TAG ``*``."""
    sql, tag = _pop_fields(FilterExpression.sql("a > 5")), _pop_fields()
    assert (sql["expType"], sql["exp"]) == ("SQL92", "a > 5")
    assert (tag["expType"], tag["exp"]) == ("TAG", "*")


def test_bad_expressions_refused_before_sending() -> None:
    """A malformed SQL92 expression raises ValueError saying where, when it is made: no
    consumer with it can exist, so nothing is ever sent with it."""
    with pytest.raises(ValueError, match=r"invalid SQL92 filter expression: .*position 3"):
        FilterExpression.sql("n >")
    with pytest.raises(ValueError, match="invalid SQL92"):
        FilterExpression("color = 'red' AND", FilterType.SQL92)
    with pytest.raises(ValueError, match="empty"):
        FilterExpression.sql("")
    with pytest.raises(TypeError):
        as_filter(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        SimpleConsumer(group="g", subscription={"T": 5})  # type: ignore[dict-item]
    with pytest.raises(TypeError):
        FilterExpression("a > 1", "SQL92")  # type: ignore[arg-type]


# ---------------------------------------------------------------------- SimpleConsumer
async def _simple(config: ClientConfig, broker: BrokerThread) -> None:
    await _send(config, _messages("SQ1"))
    await _send(config, [Message("SQ2", f"t{t}".encode(), tag=t) for t in ("a", "b", "c")])
    subscription: dict[str, str | FilterExpression] = {
        "SQ1": FilterExpression.sql(RED_AND_BIG),
        "SQ2": "a || b",
    }
    async with SimpleConsumer(
        config, group="sqg1", subscription=subscription, consume_from="first"
    ) as consumer:
        expected = _bodies(lambda i: i % 2 == 0 and i > 5)
        got = await _receive_exactly(consumer, len(expected) + 2)
        by_topic: dict[str, list[bytes]] = {}
        for m in got:
            by_topic.setdefault(m.topic, []).append(m.body)
        assert sorted(by_topic["SQ1"]) == expected
        assert sorted(by_topic["SQ2"]) == [b"ta", b"tb"]  # TAG beside SQL92
        assert all(m.properties["color"] == "red" for m in got if m.topic == "SQ1")

        # The heartbeat announced the SQL92 subscription as such.
        def registered(handle: Any) -> tuple[str, str] | None:
            sub = handle.ctx.broker.clients.subscription("sqg1", "SQ1")
            return None if sub is None else (sub.expression, sub.expression_type)

        assert await anyio.to_thread.run_sync(broker.call, registered) == (RED_AND_BIG, "SQL92")

        # subscribe() takes one too (checked with the broker first).
        await consumer.subscribe("SQ1", FilterExpression.sql("n BETWEEN 1 AND 3 OR n = '19'"))
        consumer.unsubscribe("SQ2")
        assert consumer.subscription["SQ1"].is_sql


async def _simple_second_group(config: ClientConfig) -> None:
    # A new group on the same stored messages: a blue-only selector over the same topic.
    async with SimpleConsumer(
        config, group="sqg2", subscription={"SQ1": FilterExpression.sql("color <> 'red'")},
        consume_from="first",
    ) as consumer:  # fmt: skip
        got = await _receive_exactly(consumer, N // 2)
        assert sorted(m.body for m in got) == _bodies(lambda i: i % 2 == 1)


@pytest.mark.integration
def test_simple_consumer_sql92(broker: BrokerThread, config: ClientConfig, backend: str) -> None:
    """Exactly the messages whose properties match (NULL never does), TAG beside it, and the
    heartbeat registers expressionType SQL92."""
    run(backend, _simple, config, broker)
    run(backend, _simple_second_group, config)


@pytest.mark.integration
def test_sync_simple_consumer_sql92(broker: BrokerThread, config: ClientConfig) -> None:
    """The blocking facade passes a FilterExpression through (constructor and subscribe)."""
    anyio.run(_send, config, _messages("SQS"))
    with blocking.SimpleConsumer(
        config, group="sqsync", subscription={"SQS": FilterExpression.sql("n < 3")},
        consume_from="first",
    ) as consumer:  # fmt: skip
        got: list[ReceivedMessage] = []
        for _ in range(20):  # bounded
            got += consumer.receive(32, 30, await_duration=1)
            if len(got) >= 3:
                break
        assert sorted(m.body for m in got) == _bodies(lambda i: i < 3)
        consumer.subscribe("SQS", FilterExpression.sql("n = 7"))
        assert consumer.async_client.subscription["SQS"] == FilterExpression.sql("n = 7")


# ---------------------------------------------------------------------- PushConsumer
async def _push(config: ClientConfig, mode: str, orderly: bool) -> None:
    topic, group = f"SQP{mode}{int(orderly)}", f"SQPG{mode}{int(orderly)}"
    sentinel = Message(topic, b"last", properties={"n": "99", "color": "red"})
    await _send(config, [*_messages(topic), sentinel], key="one-queue")
    seen: list[bytes] = []

    def listener(m: ReceivedMessage) -> ConsumeResult:  # checked below, not in here
        seen.append(m.body)
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group=group, subscription={topic: FilterExpression.sql(RED_AND_BIG)},
        listener=listener, mode=mode, orderly=orderly, **FAST,
    ) as consumer:  # fmt: skip
        # Every message is on one queue, stored before the consumer starts, and the matching
        # sentinel is last: once it was consumed and the cache is empty, every message the
        # broker lets through (all at lower offsets, fetched in order) reached the listener.
        with anyio.fail_after(20):
            while b"last" not in seen or consumer.statistics().cached_messages:  # noqa: ASYNC110
                await anyio.sleep(0.02)  # polls counters the consumer owns (no event)
    assert sorted(seen) == sorted([*_bodies(lambda i: i % 2 == 0 and i > 5), b"last"])


@pytest.mark.integration
@pytest.mark.parametrize(("mode", "orderly"), [("pull", False), ("pop", False), ("pop", True)])
def test_push_consumer_sql92(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str, orderly: bool
) -> None:
    """Pull mode (PULL_MESSAGE with expressionType SQL92) and pop mode (expType SQL92,
    orderly pops too) deliver exactly the matching messages."""
    run(backend, _push, config, mode, orderly)


async def _push_tag(config: ClientConfig, mode: str) -> None:
    topic = f"SQT{mode}"
    await _send(config, [*_messages(topic), Message(topic, b"last", tag="odd")], key="q")
    seen: list[bytes] = []

    def listener(m: ReceivedMessage) -> ConsumeResult:
        seen.append(m.body)
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group=f"SQTG{mode}", subscription={topic: "odd"}, listener=listener,
        mode=mode, **FAST,
    ) as consumer:  # fmt: skip
        with anyio.fail_after(20):  # as in _push: the sentinel is last on the one queue
            while b"last" not in seen or consumer.statistics().cached_messages:  # noqa: ASYNC110
                await anyio.sleep(0.02)
    assert sorted(seen) == sorted([*_bodies(lambda i: i % 2 == 1), b"last"])


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["pull", "pop"])
def test_push_consumer_tag_still_works(
    broker: BrokerThread, config: ClientConfig, backend: str, mode: str
) -> None:
    """A plain ``str`` subscription is still a TAG expression."""
    run(backend, _push_tag, config, mode)


# ---------------------------------------------------------------------- broker refuses SQL92
async def _refused(config: ClientConfig) -> None:
    await _send(config, _messages("RF1"))
    sql = FilterExpression.sql(RED_AND_BIG)

    with pytest.raises(SubscriptionRefusedError) as info:
        async with SimpleConsumer(config, group="rfg", subscription={"RF1": sql}):
            pytest.fail("the consumer started with a refused filter")
    refused = info.value
    assert (refused.topic, refused.expression, refused.expression_type) == (
        "RF1", RED_AND_BIG, "SQL92",
    )  # fmt: skip
    assert refused.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED and not refused.retriable
    assert "SQL92" in str(refused) and "RF1" in str(refused)

    for mode in ("pop", "pull"):
        with pytest.raises(SubscriptionRefusedError):
            async with PushConsumer(
                config, group=f"rfp{mode}", subscription={"RF1": sql},
                listener=lambda m: ConsumeResult.SUCCESS, mode=mode, **FAST,
            ):  # fmt: skip
                pytest.fail("the consumer started with a refused filter")

    # TAG still works on this broker; switching to SQL92 is refused and changes nothing.
    async with SimpleConsumer(
        config, group="rfg", subscription={"RF1": "even"}, consume_from="first"
    ) as consumer:
        got = await _receive_exactly(consumer, N // 2 + 1)
        assert sorted(m.body for m in got) == sorted([*_bodies(lambda i: i % 2 == 0), b"bare"])
        with pytest.raises(SubscriptionRefusedError):
            await consumer.subscribe("RF1", sql)
        assert consumer.subscription["RF1"] == FilterExpression.tag("even")
        # A pop that carries it anyway (a broker reconfigured after the check) is refused
        # the same way, not answered as "no message".
        consumer.subscription["RF1"] = sql
        with pytest.raises(SubscriptionRefusedError):
            await consumer.receive(1, 30, await_duration=0)

    async with open_instance(config) as (instance, _):  # the pull path maps it too
        route = await instance.route("RF1")
        mq = route.read_queues[0]
        with pytest.raises(SubscriptionRefusedError):
            await pull_api.pull(
                instance, "rfg", MessageQueue("RF1", mq.broker_name, mq.queue_id), 0,
                max_messages=1, max_bytes=None, commit_offset=None, expression=sql,
                suspend_ms=0,
            )  # fmt: skip


@pytest.mark.integration
def test_broker_without_property_filter_refuses_clearly(tmp_path: Path, backend: str) -> None:
    """``enable_property_filter=False``: entering a SimpleConsumer or PushConsumer (either
    mode) with SQL92, ``subscribe`` with it, and a pop or pull carrying it all raise
    ``SubscriptionRefusedError`` naming the topic and type; TAG still works."""
    with broker_thread(tmp_path / "broker", enable_property_filter=False) as broker:
        config = ClientConfig(namesrv_addr=broker.address, request_timeout=5.0)
        run(backend, _refused, config)
