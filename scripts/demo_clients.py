"""The demo cluster's client programs (used by ``docker/compose.yaml`` and ``scripts/demo.py``).

    python -m scripts.demo_clients setup          --namesrv NS --topic T --brokers 2 --replicas 1
    python -m scripts.demo_clients produce        --namesrv NS --topic T --rate 50 --seconds 60
    python -m scripts.demo_clients push-consume   --namesrv NS --topic T --group G --fail-every 10
    python -m scripts.demo_clients simple-consume --namesrv NS --topic T --group G
    python -m scripts.demo_clients count          --namesrv NS --topic T

Every program runs for a bounded time (``--seconds``; ``--stop-file`` ends it sooner once
that file exists) and ends by printing one JSON line with ``"event": "summary"``.
``--namesrv`` defaults to ``NAMESRV_ADDR``. ``--acked-file`` (produce) and
``--received-file`` (simple-consume) write one message number per line, so that the demo
can check that every SEND_OK message was received, across a failover too.

The demo kills a master on purpose (docs/ha.md): the clients refresh their routes every
``--route-refresh-s`` (2 s here, RocketMQ's 30 s elsewhere) so that they follow the elected
replica within the demo's time, and the consumers count a failed receive or ack instead of
dying on it (the broker redelivers what was not acked).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

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

#: How often a consumer that only waits looks for its stop file.
_STOP_POLL_S = 0.5
#: The demo producer's own tries of one message (each is the client's send with its
#: retries on other brokers), and the pause between them.
_SEND_TRIES = 4
_SEND_RETRY_PAUSE_S = 0.5


def summary(**fields: Any) -> None:
    """Print the program's closing JSON line."""
    print(json.dumps({"event": "summary", **fields}, sort_keys=True), flush=True)


def stopped(stop_file: Path | None) -> bool:
    """Whether the launcher asked this program to end (it creates ``stop_file``)."""
    return stop_file is not None and stop_file.exists()


def numbers_file(path: Path | None) -> IO[str] | None:
    """A file of message numbers, one a line (line-buffered: readable while we run)."""
    return None if path is None else path.open("a", buffering=1)


def message_number(message: ReceivedMessage) -> int | None:
    """The ``i`` of a demo message's body ``demo <i>``."""
    if not message.body.startswith(b"demo "):
        return None
    try:
        return int(message.body.split()[-1])
    except ValueError:
        return None


async def cluster_brokers(instance: ClientInstance) -> dict[str, dict[int, str]]:
    """Broker name → broker id → address, from the name server's cluster info."""
    (namesrv,) = instance.config.namesrv_addresses[:1]
    reply = await instance.call(namesrv, instance.request(RequestCode.GET_BROKER_CLUSTER_INFO))
    info = ClusterInfo.from_json(reply.body)
    return {n: dict(b.broker_addrs) for n, b in info.broker_addr_table.items()}


def ready(groups: dict[str, dict[int, str]], brokers: int, replicas: int) -> dict[str, str]:
    """Name → master address once ``brokers`` groups each have a master and ``replicas``
    replicas registered, else empty."""
    whole = {
        name: ids[0]
        for name, ids in groups.items()
        if 0 in ids and sum(1 for i in ids if i > 0) >= replicas
    }
    return whole if len(whole) >= brokers else {}


async def setup(config: ClientConfig, topic: str, brokers: int, queues: int, replicas: int) -> None:
    """Wait for ``brokers`` registered groups (with ``replicas`` replicas each: a sync
    master refuses sends until its replica follows it), create ``topic`` on each master,
    wait for the route."""
    async with open_instance(config) as (instance, _):
        found: dict[str, str] = {}
        with anyio.fail_after(60):
            while not found:
                try:
                    found = ready(await cluster_brokers(instance), brokers, replicas)
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


async def produce(
    config: ClientConfig,
    topic: str,
    rate: float,
    seconds: float,
    stop_file: Path | None = None,
    acked_file: Path | None = None,
) -> None:
    """Send at ``rate`` msg/s for ``seconds`` (or until ``stop_file`` exists), keyed
    ``k<i>``. A send the client gave up on is tried again after a pause, as an application
    would (``retried``), and counted ``failed`` only after :data:`_SEND_TRIES` tries: during
    a failover no broker may take it for a moment (broker-a's new master has no replica
    yet, and a master whose lease renewal came late on a loaded machine is fenced for a
    while). Each SEND_OK goes to ``acked_file`` as ``{"n": i, "broker": name, "t": unix
    time}``."""
    sent = failed = retried = 0
    per_broker: dict[str, int] = {}
    acked = numbers_file(acked_file)
    async with Producer(config) as producer:
        start = time.monotonic()
        for i in range(int(rate * seconds)):  # bounded
            if stopped(stop_file):
                break
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await anyio.sleep(delay)
            message = Message(topic, f"demo {i}".encode(), tag="demo", keys=[f"k{i}"])
            receipt = None
            for attempt in range(_SEND_TRIES):  # bounded
                try:
                    receipt = await producer.send(message)
                    break
                except (ClientError, BrokerError) as exc:
                    print(f"send {i} failed (try {attempt + 1}): {exc}", file=sys.stderr)
                    await anyio.sleep(_SEND_RETRY_PAUSE_S)
            if receipt is None:
                failed += 1
                continue
            if attempt:
                retried += 1
            sent += 1
            broker = receipt.queue.broker_name
            per_broker[broker] = per_broker.get(broker, 0) + 1
            if acked is not None:
                acked.write(json.dumps({"n": i, "broker": broker, "t": time.time()}) + "\n")
    if acked is not None:
        acked.close()
    summary(sent=sent, failed=failed, retried=retried, per_broker=per_broker)


async def push_consume(
    config: ClientConfig,
    topic: str,
    group: str,
    fail_every: int,
    seconds: float,
    retry_seconds: float,
    stop_file: Path | None = None,
) -> None:
    """A pop-mode push consumer failing messages whose number is a multiple of ``fail_every``
    (always: so they reach the DLQ after the broker's max reconsume times)."""
    stats = {"received": 0, "retried": 0, "failed": 0}

    def listener(message: ReceivedMessage) -> ConsumeResult:
        stats["received"] += 1
        if message.delivery_attempt > 1:
            stats["retried"] += 1
        number = message_number(message)
        if fail_every > 0 and number is not None and number % fail_every == 0:
            stats["failed"] += 1
            return ConsumeResult.RETRY_LATER
        return ConsumeResult.SUCCESS

    async with PushConsumer(
        config, group=group, subscription={topic: "*"}, listener=listener, mode="pop",
        invisible_duration=max(1.0, retry_seconds),
        retry_backoff_initial=retry_seconds, retry_backoff_max=4 * retry_seconds,
        consume_from="first",
    ):  # fmt: skip
        # The stop file is another process's doing: looked at twice a second (bounded).
        for _ in range(max(1, round(seconds / _STOP_POLL_S))):
            if stopped(stop_file):
                break
            await anyio.sleep(_STOP_POLL_S)
    summary(group=group, **stats)


async def simple_consume(
    config: ClientConfig,
    topic: str,
    group: str,
    seconds: float,
    stop_file: Path | None = None,
    received_file: Path | None = None,
) -> None:
    """Receive and ack in batches for ``seconds`` (or until ``stop_file`` exists); each
    received message's number goes to ``received_file`` before its ack. A failed receive
    or ack (a master just killed) is counted and the loop goes on: what was not acked is
    delivered again."""
    received = errors = 0
    numbers = numbers_file(received_file)
    async with SimpleConsumer(
        config, group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not stopped(stop_file):  # bounded
            try:
                messages = await consumer.receive(
                    32, 30, await_duration=min(2.0, max(0.1, deadline - time.monotonic()))
                )
                if numbers is not None:
                    for message in messages:
                        numbers.write(f"{message_number(message)}\n")
                received += len(messages)
                await consumer.ack_many(messages)
            except (ClientError, BrokerError) as failure:  # a broker lost mid-receive or ack
                errors += 1
                print(f"receive/ack failed: {failure}", file=sys.stderr)
                await anyio.sleep(0.2)  # a broker down: not a busy loop
    if numbers is not None:
        numbers.close()
    summary(group=group, received=received, errors=errors)


async def count(config: ClientConfig, topic: str) -> None:
    """Messages stored in ``topic``: the sum of its queues' max offsets (a queue whose
    broker does not answer is counted in ``errors``)."""
    total = errors = 0
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
            try:
                reply = await instance.call(
                    address, instance.request(RequestCode.GET_MAX_OFFSET, header.to_ext())
                )
            except (ClientError, BrokerError) as exc:
                errors += 1
                print(f"{q.broker_name} queue {q.queue_id}: {exc}", file=sys.stderr)
                continue
            total += GetMaxOffsetResponseHeader.from_ext(reply.ext_fields).offset
    summary(topic=topic, messages=total, exists=True, errors=errors)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument(
        "command", choices=("setup", "produce", "push-consume", "simple-consume", "count")
    )
    ap.add_argument("--namesrv", default=None)
    ap.add_argument("--topic", default="DemoTopic")
    ap.add_argument("--group", default="demo_group")
    ap.add_argument("--brokers", type=int, default=2)
    ap.add_argument("--replicas", type=int, default=0, help="per group, for setup to wait for")
    ap.add_argument("--queues", type=int, default=4)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--stop-file", type=Path, default=None, help="end once it exists")
    ap.add_argument("--acked-file", type=Path, default=None, help="produce: SEND_OK numbers")
    ap.add_argument("--received-file", type=Path, default=None, help="simple-consume: numbers")
    ap.add_argument("--fail-every", type=int, default=10)
    ap.add_argument("--retry-seconds", type=float, default=1.0)
    ap.add_argument(
        "--route-refresh-s",
        type=float,
        default=2.0,
        help="how soon a client follows an elected replica (RocketMQ's default: 30)",
    )
    args = ap.parse_args(argv)
    config = ClientConfig(namesrv_addr=args.namesrv, route_refresh_interval=args.route_refresh_s)
    if args.command == "setup":
        anyio.run(setup, config, args.topic, args.brokers, args.queues, args.replicas)
    elif args.command == "produce":
        anyio.run(
            produce, config, args.topic, args.rate, args.seconds, args.stop_file, args.acked_file
        )
    elif args.command == "push-consume":
        anyio.run(
            push_consume,
            config,
            args.topic,
            args.group,
            args.fail_every,
            args.seconds,
            args.retry_seconds,
            args.stop_file,
        )
    elif args.command == "simple-consume":
        anyio.run(
            simple_consume,
            config,
            args.topic,
            args.group,
            args.seconds,
            args.stop_file,
            args.received_file,
        )
    else:
        anyio.run(count, config, args.topic)
    return 0


if __name__ == "__main__":
    sys.exit(main())
