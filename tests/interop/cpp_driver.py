"""Interop driver for the C++-client Python wrappers (``rocketmq`` 0.4.4 = client-cpp 1.x,
``rocketmq-python-cvs`` 2.1.0.3 = client-cpp 2.1): both ship a ``rocketmq`` package with the
same ctypes API over a bundled ``librocketmq.so``, so one driver serves both.

It runs inside the client's throwaway environment (never the project's venv) and prints one
JSON object per line on stdout:

``produce``
    sends every message of ``--plan`` (a JSON file: ``{"topic", "messages": [{"key", "tag",
    "body"}]}``) synchronously, prints ``{"event": "sent", ...}`` per message, then
    ``{"event": "done"}``.
``consume``
    subscribes ``--topic`` with ``--expression`` in a CLUSTERING push consumer of ``--group``,
    prints ``{"event": "received", ...}`` per delivery (``"failed": true`` when the handler
    asked for a redelivery), until its standard input reaches end of file; then it shuts the
    consumer down (unless ``--skip-shutdown``) and prints ``{"event": "stopped"}``. The
    handler answers RECONSUME_LATER the first time (``reconsume_times == 0``) it sees the
    message whose key is ``--fail-key``.

The wrappers' ``PushConsumer.subscribe`` turns a handler exception into CONSUME_SUCCESS (the
exception escapes the ctypes callback, which then returns 0), so the driver registers its own
callback that *returns* the failure status.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import threading
from typing import Any

from rocketmq import client as rmq
from rocketmq import ffi

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    """One JSON line on stdout, flushed at once (callbacks run on the client's threads)."""
    line = json.dumps({"event": event, **fields}, sort_keys=True)
    with _print_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def produce(namesrv: str, group: str, plan_path: str) -> int:
    with open(plan_path, encoding="utf-8") as file:
        plan = json.load(file)
    producer = rmq.Producer(group, timeout=10_000)
    producer.set_namesrv_addr(namesrv)
    producer.start()
    try:
        for item in plan["messages"]:
            msg = rmq.Message(plan["topic"])
            msg.set_keys(item["key"])
            msg.set_tags(item["tag"])
            msg.set_body(item["body"])
            result = producer.send_sync(msg)
            emit("sent", key=item["key"], tag=item["tag"], status=int(result.status),
                 msg_id=result.msg_id, offset=int(result.offset))  # fmt: skip
    finally:
        producer.shutdown()
    emit("done")
    return 0


def consume(
    namesrv: str, group: str, topic: str, expression: str, fail_key: str, *, shutdown: bool
) -> int:
    consumer = rmq.PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    consumer.set_thread_count(1)
    consumer.set_message_batch_max_size(1)

    def on_message(_consumer: object, handle: int) -> int:
        msg = rmq.RecvMessage(handle)
        body: bytes = msg.body or b""
        key = _text(msg.keys)
        reconsume_times = int(msg.reconsume_times)
        failed = key == fail_key and reconsume_times == 0
        emit("received", key=key, tag=_text(msg.tags), topic=_text(msg.topic),
             queue_id=int(msg.queue_id), queue_offset=int(msg.queue_offset),
             reconsume_times=reconsume_times, retry_topic=_text(msg.get_property("RETRY_TOPIC")),
             body_len=len(body), body_sha256=hashlib.sha256(body).hexdigest(), failed=failed,
             msg_id=_text(msg.id))  # fmt: skip
        status = ffi._CConsumeStatus
        return int((status.RECONSUME_LATER if failed else status.CONSUME_SUCCESS).value)

    ffi.dll.Subscribe(consumer._handle, topic.encode(), expression.encode())
    consumer._register_callback(on_message)
    consumer.start()
    emit("started")
    sys.stdin.read()  # until the test closes our standard input
    emit("stopping")
    if shutdown:
        consumer.shutdown()  # persists the offsets and unregisters (UNREGISTER_CLIENT)
    emit("stopped", shutdown=shutdown)
    if not shutdown:
        # Leave now: the wrapper's PushConsumer.__del__ would call shutdown() anyway.
        os._exit(0)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("produce", "consume"))
    parser.add_argument("--namesrv", required=True, help="HOST:PORT of the broker")
    parser.add_argument("--group", required=True)
    parser.add_argument("--plan", help="produce: the JSON message plan")
    parser.add_argument("--topic", help="consume: the topic")
    parser.add_argument("--expression", default="*", help="consume: tag expression")
    parser.add_argument("--fail-key", default="", help="consume: key to fail once")
    parser.add_argument(
        "--skip-shutdown",
        action="store_true",
        help="consume: exit without shutdown() (client-cpp 2.1 crashes in it with a SIGSEGV "
        "in DefaultMQPushConsumerImpl::shutdownMessageTraceInnerProducer)",
    )
    args = parser.parse_args()
    if args.mode == "produce":
        code = produce(args.namesrv, args.group, args.plan)
    else:
        code = consume(args.namesrv, args.group, args.topic, args.expression, args.fail_key,
                       shutdown=not args.skip_shutdown)  # fmt: skip
    sys.stdout.flush()
    # The 2.1 client's destructors can crash at interpreter exit: leave without running them.
    os._exit(code)


if __name__ == "__main__":
    main()
