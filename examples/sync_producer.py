"""The blocking facade: same names, no async code (for scripts, Django, Celery tasks).

NAMESRV_ADDR=127.0.0.1:9876 python examples/sync_producer.py --topic Demo
"""

from __future__ import annotations

import argparse

from client import ClientConfig, Message
from client.sync import Producer

if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--topic", default="Demo")
    ap.add_argument("--count", type=int, default=5)
    args = ap.parse_args()
    with Producer(ClientConfig()) as producer:
        for i in range(args.count):
            print("sent", producer.send(Message(args.topic, f"sync {i}".encode())).message_id)
