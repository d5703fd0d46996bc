"""Receive, process and ack messages with the SimpleConsumer (pop long polling).

    NAMESRV_ADDR=127.0.0.1:9876 python examples/simple_consumer.py --topic Demo --seconds 10

Messages not acked within ``invisible_duration`` come back (through the group's retry topic)
with ``delivery_attempt`` raised.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from client import ClientConfig, SimpleConsumer


async def main(topic: str, group: str, seconds: float, expect: int) -> None:
    deadline = time.monotonic() + seconds
    received = 0
    async with SimpleConsumer(
        ClientConfig(), group=group, subscription={topic: "*"}, consume_from="first"
    ) as consumer:
        while time.monotonic() < deadline and (expect <= 0 or received < expect):
            for message in await consumer.receive(16, invisible_duration=30, await_duration=2):
                print(f"got {message.body!r} tag={message.tag} attempt={message.delivery_attempt}")
                await consumer.ack(message)
                received += 1
    print(f"received {received}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", default="Demo")
    ap.add_argument("--group", default="demo_simple")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--expect", type=int, default=0, help="stop after this many (0: run on)")
    args = ap.parse_args()
    asyncio.run(main(args.topic, args.group, args.seconds, args.expect))
