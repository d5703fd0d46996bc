"""The demo cluster's client programs (used by ``docker/compose.yaml`` and ``scripts/demo.py``).

    python -m scripts.demo_clients setup          --namesrv NS --topic T [--brokers 2]
    python -m scripts.demo_clients produce        --namesrv NS --topic T --rate 50 --seconds 60
    python -m scripts.demo_clients push-consume   --namesrv NS --topic T --group G --fail-every 10
    python -m scripts.demo_clients simple-consume --namesrv NS --topic T --group G
    python -m scripts.demo_clients count          --namesrv NS --topic T

Every program runs for a bounded time and ends by printing one JSON line with
``"event": "summary"``. ``--namesrv`` defaults to ``NAMESRV_ADDR``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import anyio

from client.config import ClientConfig
from client.errors import ClientError, NoRouteError
from client.instance import ClientInstance, open_instance
from client.message import Message, ReceivedMessage
from client.producer import Producer
from client.push import ConsumeResult, PushConsumer
from client.simple_consumer import SimpleConsumer
from protocol.bodies.route import ClusterInfo
from protocol.codes import RequestCode
from protocol.errors import BrokerError
from protocol.headers.admin import CreateTopicRequestHeader
from protocol.headers.offsets import GetMaxOffsetRequestHeader, GetMaxOffsetResponseHeader


def summary(**fields: Any) -> None:
    """Print the program's closing JSON line."""
    print(json.dumps({"event": "summary", **fields}, sort_keys=True), flush=True)


async def cluster_brokers(instance: ClientInstance) -> dict[str, str]:
    """Broker name → master address, from the name server's cluster info."""
    (namesrv,) = instance.config.namesrv_addresses[:1]
    reply = await instance.call(namesrv, instance.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    info = ClusterInfo.from_json(reply.body)
    return {n: b.master_addr for n, b in info.broker_addr_table.items() if b.master_addr}


async def setup(config: ClientConfig, topic: str, brokers: int, queues: int) -> None:
    """Wait for ``brokers`` registered brokers, create ``topic`` on each, wait for the route."""
    async with open_instance(config) as (instance, _):
        found: dict[str, str] = {}
        with anyio.fail_after(60):
            while len(found) < brokers:
                try:
                    found = await cluster_brokers(instance)
                except (ClientError, BrokerError):
                    found = {}
                await anyio.sleep(0.2)
        header = CreateTopicRequestHeader(
            topic=topic, default_topic="TBW102", read_queue_nums=queues,
            write_queue_nums=queues, perm=6, topic_filter_type="SINGLE_TAG", order=False,
        )  # fmt: skip
        for address in found.values():
            await instance.call(
                address, instance.request(RequestCode.UPDATE_AND_CREATE_TOPIC, header.to_ext())
            )
        with anyio.fail_after(60):
            while True:
                try:
                    route = await instance.route(topic, refresh=True)
                    if len({q.broker_name for q in route.write_queues}) >= brokers:
                        break
                except NoRouteError:
                    pass
                await anyio.sleep(0.2)
    summary(topic=topic, brokers=sorted(found))


async def produce(config: ClientConfig, topic: str, rate: float, seconds: float) -> None:
    """Send at ``rate`` msg/s for ``seconds``, keyed ``k<i>``; failures are counted."""
    sent = failed = 0
    per_broker: dict[str, int] = {}
    async with Producer(config) as producer:
        start = time.monotonic()
        for i in range(int(rate * seconds)):  # bounded
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            try:
                receipt = await producer.send(
                    Message(topic, f"demo {i}".encode(), tag="demo", keys=[f"k{i}"])
                )
            except (ClientError, BrokerError) as exc:
                failed += 1
                print(f"send {i} failed: {exc}", file=sys.stderr)
                continue
            sent += 1
            per_broker[receipt.queue.broker_name] = per_broker.get(receipt.queue.broker_name, 0) + 1
    summary(sent=sent, failed=failed, per_broker=per_broker)


async def push_consume(
    config: ClientConfig,
    topic: str,
    group: str,
    fail_every: int,
    seconds: float,
    retry_seconds: float,
) -> None:
    """A pop-mode push consumer failing messages whose number is a multiple of ``fail_every``
    (always: so they reach the DLQ after the broker's max reconsume times)."""
    stats = {"received": 0, "retried": 0, "failed": 0}

    def listener(message: ReceivedMessage) -> ConsumeResult:
        stats["received"] += 1
        if message.delivery_attempt > 1:
            stats["retried"] += 1
        number = int(message.body.split()[-1]) if message.body.startswith(b"demo ") else 1
        if fail_every > 0 and number % fail_every == 0:
            stats["failed"] += 1
            return ConsumeResult.RETRY_LATER
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group=group, subscription={topic: "*"}, listener=listener, mode="pop",
        invisible_duration=max(1.0, retry_seconds),
        retry_backoff_initial=retry_seconds, retry_backoff_max=4 * retry_seconds,
        consume_from="first",
    ):  # fmt: skip
        await anyio.sleep(seconds)
    summary(group=group, **stats)


async def simple_consume(config: ClientConfig, topic: str, group: str, seconds: float) -> None:
    """Receive and ack in batches for ``seconds``."""
    received = 0
    async with SimpleConsumer(
        config, group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:  # bounded
            messages = await consumer.receive(
                32, 30, await_duration=min(2.0, max(0.1, deadline - time.monotonic()))
            )
            await consumer.ack_many(messages)
            received += len(messages)
    summary(group=group, received=received)


async def count(config: ClientConfig, topic: str) -> None:
    """Messages stored in ``topic``: the sum of its queues' max offsets."""
    total = 0
    async with open_instance(config) as (instance, _):
        try:
            route = await instance.route(topic)
        except NoRouteError:
            summary(topic=topic, messages=0, exists=False)
            return
        for q in route.read_queues:
            address = instance.broker_address(q.broker_name)
            if address is None:
                continue
            header = GetMaxOffsetRequestHeader(topic=topic, queue_id=q.queue_id)
            reply = await instance.call(
                address, instance.request(RequestCode.GET_MAX_OFFSET, header.to_ext())
            )
            total += GetMaxOffsetResponseHeader.from_ext(reply.ext_fields).offset
    summary(topic=topic, messages=total, exists=True)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument(
        "command", choices=("setup", "produce", "push-consume", "simple-consume", "count")
    )
    ap.add_argument("--namesrv", default=None)
    ap.add_argument("--topic", default="DemoTopic")
    ap.add_argument("--group", default="demo_group")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--fail-every", type=int, default=10)
    ap.add_argument("--retry-seconds", type=float, default=1.0)
    args = ap.parse_args(argv)
    config = ClientConfig(namesrv_addr=args.namesrv)
    if args.command == "setup":
        anyio.run(setup, config, args.topic, args.brokers, args.queues)
    elif args.command == "produce":
        anyio.run(produce, config, args.topic, args.rate, args.seconds)
    elif args.command == "push-consume":
        anyio.run(
            push_consume,
            config,
            args.topic,
            args.group,
            args.fail_every,
            args.seconds,
            args.retry_seconds,
        )
    elif args.command == "simple-consume":
        anyio.run(simple_consume, config, args.topic, args.group, args.seconds)
    else:
        anyio.run(count, config, args.topic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
