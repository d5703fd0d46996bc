"""A do-nothing RocketMQ v2 ``MessagingService`` on ``grpc.aio`` (grpcio's C core): the
reference server against which ``bench_grpc`` measures the official Python client's own
ceiling.

It runs in the official client's venv (``.interop/py-grpc``, see
:mod:`scripts.interop_setup`), whose generated ``service_pb2_grpc`` servicer base and
messages it uses at run time; nothing generated is copied here. It answers just enough for
a Producer and a SimpleConsumer:

* QueryRoute: one READ_WRITE queue of the topic at this server's own address, NORMAL only;
* Telemetry: each ``settings`` is echoed back with status OK, an exponential
  ``backoff_policy`` and ``publishing.max_body_size`` (what the clients need, see
  ``reference/grpc-frontend.md`` §1.3);
* Heartbeat, NotifyClientTermination, AckMessage: OK (one OK entry per ack entry);
* SendMessage: OK with one entry (the message's id, a counter as offset);
* ReceiveMessage: status OK, ``batch_size`` canned messages (receipt handle, MD5 digest in
  uppercase hex, ``body_encoding`` IDENTITY), then ``delivery_timestamp``.

Nothing is stored. Usage (with ``HOME`` a scratch dir: importing the client's package starts
its logging under ``~``)::

    .interop/py-grpc/venv/bin/python benchmarks/grpc_null_server.py [--port 0] [--size 128]

It prints one JSON line ``{"event": "null server started", "port": P, "pid": N}`` on stdout
once it listens on 127.0.0.1 and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped]
from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

#: Messages per ReceiveMessage when the request asks for none (the proxy's cap is 32).
DEFAULT_BATCH = 32
MAX_BODY_SIZE = 4 * 1024 * 1024
OK = definition_pb2.Code.OK


def ok_status() -> Any:
    return definition_pb2.Status(code=OK, message="OK")


class NullMessaging(service_pb2_grpc.MessagingServiceServicer):  # type: ignore[misc]
    """Answers without doing anything; every answer is what a real server would say."""

    def __init__(self, host: str, port: int, body_size: int) -> None:
        self.host, self.port = host, port
        self.body = b"x" * body_size
        self.digest = hashlib.md5(self.body).hexdigest().upper()
        self.offset = 0
        self.handle = 0
        #: topic -> DEFAULT_BATCH canned messages (handles differ per delivery, set on copy)
        self.canned: dict[str, list[Any]] = {}

    # ---------------------------------------------------------------- routes and clients
    async def QueryRoute(self, request: Any, context: Any) -> Any:
        out = service_pb2.QueryRouteResponse(status=ok_status())
        queue = out.message_queues.add()
        queue.topic.CopyFrom(request.topic)
        queue.id = 0
        queue.permission = definition_pb2.Permission.READ_WRITE
        queue.broker.name = "null"
        queue.broker.id = 0
        queue.broker.endpoints.scheme = definition_pb2.AddressScheme.IPv4
        queue.broker.endpoints.addresses.add(host=self.host, port=self.port)
        queue.accept_message_types.append(definition_pb2.MessageType.NORMAL)
        return out

    async def Heartbeat(self, request: Any, context: Any) -> Any:
        return service_pb2.HeartbeatResponse(status=ok_status())

    async def NotifyClientTermination(self, request: Any, context: Any) -> Any:
        return service_pb2.NotifyClientTerminationResponse(status=ok_status())

    async def Telemetry(
        self, request_iterator: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for command in request_iterator:
            if not command.HasField("settings"):
                continue
            settings = definition_pb2.Settings()
            settings.CopyFrom(command.settings)
            settings.backoff_policy.max_attempts = 3
            backoff = settings.backoff_policy.exponential_backoff
            backoff.initial.nanos = 10_000_000
            backoff.max.seconds = 1
            backoff.multiplier = 2.0
            if settings.HasField("publishing"):
                settings.publishing.max_body_size = MAX_BODY_SIZE
                settings.publishing.validate_message_type = True
            elif settings.HasField("subscription"):
                settings.subscription.receive_batch_size = DEFAULT_BATCH
            yield service_pb2.TelemetryCommand(status=ok_status(), settings=settings)

    # ---------------------------------------------------------------- produce
    async def SendMessage(self, request: Any, context: Any) -> Any:
        out = service_pb2.SendMessageResponse(status=ok_status())
        for message in request.messages:
            self.offset += 1
            out.entries.add(
                status=ok_status(),
                message_id=message.system_properties.message_id,
                offset=self.offset,
            )
        return out

    # ---------------------------------------------------------------- consume
    def _canned(self, topic: Any) -> list[Any]:
        messages = self.canned.get(topic.name)
        if messages is None:
            now = time.time()
            messages = []
            for i in range(DEFAULT_BATCH):
                m = definition_pb2.Message(body=self.body)
                m.topic.CopyFrom(topic)
                sp = m.system_properties
                sp.message_id = f"01{os.getpid():012X}{i:020X}"
                sp.body_digest.type = definition_pb2.DigestType.MD5
                sp.body_digest.checksum = self.digest
                sp.body_encoding = definition_pb2.Encoding.IDENTITY
                sp.message_type = definition_pb2.MessageType.NORMAL
                sp.born_timestamp.FromSeconds(int(now))
                sp.born_host = self.host
                sp.store_timestamp.FromSeconds(int(now))
                sp.store_host = f"{self.host}:{self.port}"
                sp.queue_id = 0
                sp.queue_offset = i
                sp.delivery_attempt = 1
                sp.invisible_duration.seconds = 30
                messages.append(m)
            self.canned[topic.name] = messages
        return messages

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        n = min(request.batch_size or DEFAULT_BATCH, DEFAULT_BATCH)
        yield service_pb2.ReceiveMessageResponse(status=ok_status())
        for m in self._canned(request.message_queue.topic)[:n]:
            self.handle += 1
            m.system_properties.receipt_handle = f"null-{self.handle}"
            yield service_pb2.ReceiveMessageResponse(message=m)
        response = service_pb2.ReceiveMessageResponse()
        response.delivery_timestamp.GetCurrentTime()
        yield response

    async def AckMessage(self, request: Any, context: Any) -> Any:
        out = service_pb2.AckMessageResponse(status=ok_status())
        for entry in request.entries:
            out.entries.add(
                message_id=entry.message_id,
                receipt_handle=entry.receipt_handle,
                status=ok_status(),
            )
        return out


async def serve(host: str, port: int, body_size: int) -> None:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]
    )
    bound = server.add_insecure_port(f"{host}:{port}")
    service_pb2_grpc.add_MessagingServiceServicer_to_server(
        NullMessaging(host, bound, body_size), server
    )
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    line = {"event": "null server started", "port": bound, "pid": os.getpid()}
    print(json.dumps(line), flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--size", type=int, default=128, help="body size of received messages")
    args = ap.parse_args()
    asyncio.run(serve(args.host, args.port, args.size))
    sys.exit(0)


if __name__ == "__main__":
    main()
