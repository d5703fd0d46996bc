"""Send a few messages with the async Producer (runs on asyncio; trio works the same).

    NAMESRV_ADDR=127.0.0.1:9876 python examples/producer.py --topic Demo --count 10

A lone broker (``make run``) answers route queries itself: point NAMESRV_ADDR at it
(127.0.0.1:10911).
"""

from __future__ import annotations

import argparse
import asyncio

from client import ClientConfig, Message, Producer


async def main(topic: str, count: int) -> None:
    async with Producer(ClientConfig()) as producer:
        for i in range(count):
            receipt = await producer.send(
                Message(topic, f"hello {i}".encode(), tag="demo", keys=[f"order-{i}"])
            )
            print(f"sent {receipt.message_id} to {receipt.queue.broker_name}/"
                  f"{receipt.queue.queue_id} at offset {receipt.queue_offset}")  # fmt: skip
        # Same sharding key → same queue → consumed in order by an orderly consumer.
        for step in ("created", "paid", "shipped"):
            await producer.send(Message(topic, step.encode(), tag="order"), sharding_key="o-42")
        print("sent 3 ordered steps of order o-42")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", default="Demo")
    ap.add_argument("--count", type=int, default=10)
    args = ap.parse_args()
    asyncio.run(main(args.topic, args.count))
