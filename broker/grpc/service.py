"""``apache.rocketmq.v2.MessagingService``: each RPC as an adapter over the broker's core.

Every handler decodes its request, calls the same core services the Remoting processors
call (:class:`~broker.core.broker.Broker`), and encodes the result; errors travel in the
response's ``Status`` (the call itself ends with gRPC status OK, as the proxy's do), mapped
by :mod:`broker.grpc.status`. What the proxy does that the core does not is here too, since
it is part of the v2 API's contract: the long-poll and invisible-time bounds of
ReceiveMessage, the response-stream order the clients require, per-entry ack statuses, the
queue choice of a send.

The proxy's semantics are in ``../shared/reference/grpc-frontend.md`` §3 summarised in
docs/design.md §11; the differences are in docs/rocketmq-differences.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import trio
from google.protobuf.message import DecodeError

from broker.acl import AclGuard
from broker.core.broker import Broker
from broker.core.pop import PopBatch, Popped
from broker.core.send import Scheduled, SendRequest, born_host_of
from broker.core.transactions import EndRequest, Resolution
from broker.grpc.clients import GrpcClients
from broker.grpc.cluster import ClusterRoutes, PeerQueues
from broker.grpc.server import Call, GrpcError, Handler
from broker.grpc.status import code_of_error, code_of_put, status, status_bytes
from broker.logs import get_logger
from broker.schedule import delivery_time
from protocol.acl.check import AnyRules, authorize_call
from protocol.acl.decide import Refusal
from protocol.acl.rules import IPAddress
from protocol.bodies.route import is_readable, is_writeable
from protocol.errors import ReceiptError, TrimqError
from protocol.grpc import schema
from protocol.grpc.codes import Code, GrpcStatus
from protocol.grpc.convert import (
    COMPRESSED_FLAG,
    SHARDING_KEY,
    MessageRejected,
    decode_handle,
    decode_recall_handle,
    decode_transaction_id,
    delivered_response,
    duration_ms,
    encode_handle,
    encode_recall_handle,
    encode_transaction_id,
    java_hash,
    properties_of,
    set_timestamp,
    timestamp_ms,
)
from protocol.grpc.wire import sub, text_field, varint
from protocol.headers.pop import INIT_MODE_MAX
from protocol.naming import DEFAULT_TOPIC
from protocol.properties import PGROUP
from protocol.receipt import ExtraInfo

_log = get_logger("grpc")

#: The proxy's long-poll bounds (grpcClientConsumerMin/MaxLongPollingTimeoutMillis).
MIN_POLL_MS: Final = 5_000
MAX_POLL_MS: Final = 20_000
#: A receive answers this long before the client's deadline, so the answer arrives in time.
POLL_MARGIN_MS: Final = 500
#: Invisible time of a receive: bounds, and what push consumers (auto-renew) get.
MIN_INVISIBLE_MS: Final = 10_000
MAX_INVISIBLE_MS: Final = 12 * 3600 * 1000
DEFAULT_INVISIBLE_MS: Final = 60_000
#: Undelivered messages of a broken receive stream come back this soon.
RELEASE_INVISIBLE_MS: Final = 1_000
_ACCEPTED_TYPES: Final = (
    schema.MessageType.NORMAL,
    schema.MessageType.FIFO,
    schema.MessageType.DELAY,
    schema.MessageType.TRANSACTION,
)
_PATH: Final = f"/{schema.SERVICE_NAME}/"
_RESOLUTIONS: Final = {
    schema.TransactionResolution.COMMIT: Resolution.COMMIT,
    schema.TransactionResolution.ROLLBACK: Resolution.ROLLBACK,
}


@dataclass(frozen=True, slots=True)
class GrpcEndpoint:
    """Where clients reach this broker's gRPC front end (written into routes)."""

    host: str
    port: int


class MessagingService:
    """The v2 RPCs over one broker (the :class:`~broker.grpc.server.Service` it serves)."""

    def __init__(
        self,
        broker: Broker,
        endpoint: GrpcEndpoint,
        clients: GrpcClients,
        cluster: ClusterRoutes | None = None,
        acl: AclGuard | None = None,
    ) -> None:
        self.broker = broker
        self.endpoint = endpoint
        self.clients = clients
        #: The cluster's routes (name servers), None for a standalone broker.
        self.cluster = cluster
        #: ACL (``--acl-file``, either format): every call's credential and rights; None
        #: when off.
        self.acl = acl
        unary: dict[str, Callable[[Call, Any], Awaitable[Any]]] = {
            "QueryRoute": self.query_route,
            "Heartbeat": self.heartbeat,
            "SendMessage": self.send_message,
            "QueryAssignment": self.query_assignment,
            "AckMessage": self.ack_message,
            "ForwardMessageToDeadLetterQueue": self.forward_to_dlq,
            "EndTransaction": self.end_transaction,
            "NotifyClientTermination": self.notify_client_termination,
            "ChangeInvisibleDuration": self.change_invisible_duration,
            "RecallMessage": self.recall_message,
        }
        self._handlers: dict[str, Handler] = {
            _PATH + name: _unary(schema.METHODS[_PATH + name], name, fn, self.denied)
            for name, fn in unary.items()
        }
        self._handlers[_PATH + "ReceiveMessage"] = self.receive_message
        self._handlers[_PATH + "Telemetry"] = self.telemetry
        waiting = ["ReceiveMessage", "Telemetry"]
        if cluster is not None:  # a route may be asked of the name servers
            waiting += ["QueryRoute", "QueryAssignment"]
        if broker.config.stores_wait:
            # Each stores a record (a message, a transaction's decision, a recall marker) and
            # waits for its fsync or its replicas.
            waiting += [
                "SendMessage",
                "ForwardMessageToDeadLetterQueue",
                "EndTransaction",
                "RecallMessage",
            ]
        self._waiting = frozenset(_PATH + name for name in waiting)

    def handler(self, path: str) -> Handler | None:
        """The handler of ``path``; None for methods the proxy does not serve either
        (PullMessage, the offset RPCs, SyncLiteSubscription: UNIMPLEMENTED)."""
        return self._handlers.get(path)

    def connection_closed(self, peer: str) -> None:
        """Nothing to forget: clients leave when their Telemetry stream ends."""

    def may_wait(self, path: str) -> bool:
        """Receives park and Telemetry streams; in SYNC flush mode the calls that store a
        record wait for its fsync. Everything else is quick."""
        return path in self._waiting

    # ------------------------------------------------------------------ ACL
    def denied(self, call: Call, method: str, req: Any) -> Any | None:
        """The status refusing a call (UNAUTHORIZED: no valid credential; FORBIDDEN: no
        right on a resource it names), None when it may run or ACL is off."""
        if self.acl is None:
            return None
        unauthenticated: list[bool] = []

        def decide(rules: AnyRules, peer: IPAddress | None) -> Refusal | None:
            found = authorize_call(rules, call.metadata, peer, method, req)
            if found is None:
                return None
            unauthenticated.append(found[1])
            return found[0]

        refusal = self.acl.refusal(call.peer, decide)
        if refusal is None:
            return None
        code = Code.UNAUTHORIZED if unauthenticated[0] else Code.FORBIDDEN
        return status(code, refusal.remark)

    # ------------------------------------------------------------------ routes
    async def query_route(self, call: Call, req: Any) -> Any:
        """The topic's queues on every broker of the cluster that has them, each at its
        broker's gRPC endpoint (a standalone broker: its own)."""
        out = schema.QueryRouteResponse()
        topic = req.topic.name
        peers = await self._peers(topic)
        if not peers:
            out.status.CopyFrom(status(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
            return out
        for peer in peers:
            perm = _permission(peer.perm)
            for queue_id in range(max(peer.read_queue_nums, peer.write_queue_nums)):
                self._fill_queue(out.message_queues.add(), peer, topic, queue_id, perm)
        out.status.CopyFrom(status(Code.OK))
        return out

    async def _peers(self, topic: str) -> list[PeerQueues]:
        """Who holds ``topic``'s queues: the cluster's route when it knows the topic, else
        this broker's own (also a topic it will create on first send)."""
        if self.cluster is not None:
            found = await self.cluster(topic)
            if found:
                return found
        view = self.broker.routes.route(topic)
        if view is None:
            return []
        me = self.endpoint
        own = PeerQueues(
            view.broker_name, me.host, me.port, view.perm,
            view.read_queue_nums, view.write_queue_nums,
        )  # fmt: skip
        return [own]

    def _fill_queue(
        self, queue: Any, peer: PeerQueues, topic: str, queue_id: int, perm: int
    ) -> None:
        queue.topic.name = topic
        queue.id = queue_id
        queue.permission = perm
        queue.broker.name = peer.broker_name
        queue.broker.id = 0
        endpoints = queue.broker.endpoints
        endpoints.scheme = schema.AddressScheme.IPv4
        address = endpoints.addresses.add()
        address.host, address.port = peer.host, peer.port
        queue.accept_message_types.extend(_ACCEPTED_TYPES)

    async def query_assignment(self, call: Call, req: Any) -> Any:
        """Per broker holding readable queues of the topic: one queue with id -1 (pop from
        any of its queues) for a normal group, one per readable queue for a FIFO group (the
        proxy's answer)."""
        out = schema.QueryAssignmentResponse()
        topic, group = req.topic.name, req.group.name
        peers = await self._peers(topic)
        if not peers:
            out.status.CopyFrom(status(Code.TOPIC_NOT_FOUND, f"topic {topic} does not exist"))
            return out
        readable = [p for p in peers if p.read_queue_nums > 0 and is_readable(p.perm)]
        if not readable:
            out.status.CopyFrom(status(Code.FORBIDDEN, "no readable queue"))
            return out
        fifo = self.clients.fifo(group)
        for peer in readable:
            for queue_id in range(peer.read_queue_nums) if fifo else (-1,):
                queue = out.assignments.add().message_queue
                self._fill_queue(queue, peer, topic, queue_id, _permission(peer.perm))
        out.status.CopyFrom(status(Code.OK))
        return out

    # ------------------------------------------------------------------ clients
    async def heartbeat(self, call: Call, req: Any) -> Any:
        """Refresh the client's group membership."""
        out = schema.HeartbeatResponse()
        group = req.group.name if req.HasField("group") else None
        if self.clients.heartbeat(call.client_id, group):
            out.status.CopyFrom(status(Code.OK))
        else:
            out.status.CopyFrom(status(Code.UNRECOGNIZED_CLIENT_TYPE, "no settings received yet"))
        return out

    async def notify_client_termination(self, call: Call, req: Any) -> Any:
        """The client shuts down: it leaves its group."""
        self.clients.terminate(call.client_id)
        out = schema.NotifyClientTerminationResponse()
        out.status.CopyFrom(status(Code.OK))
        return out

    async def telemetry(self, call: Call) -> None:
        """Answer every settings command with status OK and the complete settings; the
        stream is the client's presence (it leaves when the stream ends). Without a client
        id, each command is answered CLIENT_ID_REQUIRED and the stream stays open (the
        proxy's answer)."""
        try:
            async for payload in call.messages():
                command = _parse(schema.TelemetryCommand, payload)
                if not call.client_id:
                    refused = schema.TelemetryCommand()
                    refused.status.CopyFrom(
                        status(Code.CLIENT_ID_REQUIRED, "client id cannot be empty")
                    )
                    await call.send(refused.SerializeToString())
                    continue
                if command.WhichOneof("command") != "settings":
                    continue  # thread stack traces, verify results: nothing asked for them
                if (refused := self.denied(call, "Telemetry", command)) is not None:
                    answer = schema.TelemetryCommand()
                    answer.status.CopyFrom(refused)
                    await call.send(answer.SerializeToString())
                    continue
                try:
                    settings = self.clients.apply_settings(call.client_id, command.settings, call)
                except (ValueError, TrimqError) as exc:
                    raise GrpcError(GrpcStatus.INVALID_ARGUMENT, str(exc)) from None
                reply = schema.TelemetryCommand()
                reply.status.CopyFrom(status(Code.OK, "OK"))
                reply.settings.CopyFrom(settings)
                await call.send(reply.SerializeToString())
        finally:
            self.clients.telemetry_ended(call.client_id, call)

    # ------------------------------------------------------------------ sending
    async def send_message(self, call: Call, req: Any) -> Any:
        """Store each message (the clients send one); the server picks the queue. Answers
        the serialised response (:func:`send_response`)."""
        messages = req.messages
        if not messages:
            out = schema.SendMessageResponse()
            out.status.CopyFrom(status(Code.BAD_REQUEST, "no message to send"))
            return out
        return send_response([await self._send_one(call, message) for message in messages])

    async def _send_one(self, call: Call, message: Any) -> SendResult:
        broker = self.broker
        topic = message.topic.name
        system = message.system_properties
        body = message.body
        if not body:
            return SendResult(Code.MESSAGE_BODY_EMPTY, "message body is empty")
        if len(body) > broker.config.max_message_size:
            return SendResult(
                Code.MESSAGE_BODY_TOO_LARGE,
                f"body of {len(body)} bytes is over {broker.config.max_message_size}",
            )
        transactional = system.message_type == schema.MessageType.TRANSACTION
        try:
            props = properties_of(message)
            if transactional:
                props[PGROUP] = topic  # the proxy's rule: a gRPC producer's group is the topic
            if system.HasField("delivery_timestamp"):
                _check_delivery_time(props, broker.clock.now_ms())
            queue_id = self._queue_for(topic, props.get(SHARDING_KEY))
            outcome = await broker.sends.send(
                SendRequest(
                    topic,
                    body,
                    props,
                    queue_id,
                    0,
                    COMPRESSED_FLAG if system.body_encoding == schema.Encoding.GZIP else 0,
                    _born_ms(system, broker.clock.now_ms()),
                    born_host_of(call.peer),
                    0,
                    None,
                    DEFAULT_TOPIC,
                    broker.config.default_queue_nums,
                )
            )
        except MessageRejected as exc:
            return SendResult(exc.code, str(exc))
        except TrimqError as exc:
            return SendResult(code_of_error(exc, name_code=Code.ILLEGAL_TOPIC), str(exc))
        result = outcome.result
        if not result.ok:
            return SendResult(code_of_put(result.status), result.remark)
        message_id = system.message_id
        transaction_id = recall_handle = ""
        if transactional:
            transaction_id = encode_transaction_id(result.commit_log_offset, result.queue_offset)
        if outcome.scheduled is not None:
            where = outcome.scheduled
            recall_handle = encode_recall_handle(
                topic, where.queue_id, where.queue_offset, message_id
            )
        return SendResult(
            Code.OK, "", message_id, result.queue_offset, transaction_id, recall_handle
        )

    def _queue_for(self, topic: str, group: str | None) -> int:
        """A message group's queue: its Java hash over the write queues (the proxy's choice,
        so one group stays on one queue); otherwise any (round robin, in the core)."""
        if group is None:
            return -1
        view = self.broker.routes.route(topic)
        if view is None or view.write_queue_nums <= 0:
            return -1
        return abs(java_hash(group) % view.write_queue_nums)

    async def end_transaction(self, call: Call, req: Any) -> Any:
        """Commit or roll back a half message named by the transaction id its send returned
        (the producer group is the topic, as in the proxy)."""
        out = schema.EndTransactionResponse()
        # Anything but COMMIT or ROLLBACK leaves the half undecided (the proxy's UNKNOWN).
        resolution = _RESOLUTIONS.get(req.resolution, Resolution.UNKNOWN)
        try:
            commit_offset, queue_offset = decode_transaction_id(req.transaction_id)
        except ValueError as exc:
            out.status.CopyFrom(status(Code.INVALID_TRANSACTION_ID, str(exc)))
            return out
        request = EndRequest(
            group=req.topic.name,
            commit_offset=commit_offset,
            queue_offset=queue_offset,
            resolution=resolution,
            from_check=req.source == schema.TransactionSource.SOURCE_SERVER_CHECK,
            msg_id=req.message_id,
        )
        try:
            outcome = await self.broker.transactions.end(request)
        except TrimqError as exc:
            out.status.CopyFrom(status(code_of_error(exc), str(exc)))
            return out
        out.status.CopyFrom(status(Code.OK, outcome.remark or "OK"))
        return out

    async def recall_message(self, call: Call, req: Any) -> Any:
        """Cancel a delayed message before its delivery, by the handle its send returned."""
        out = schema.RecallMessageResponse()
        try:
            topic, queue_id, offset, message_id = decode_recall_handle(req.recall_handle)
        except ValueError as exc:
            out.status.CopyFrom(status(Code.BAD_REQUEST, f"bad recall handle: {exc}"))
            return out
        if topic != req.topic.name:
            out.status.CopyFrom(
                status(Code.BAD_REQUEST, f"the handle is of topic {topic}, not {req.topic.name}")
            )
            return out
        try:
            await self.broker.sends.recall(topic, Scheduled(queue_id, offset, 0), message_id)
        except TrimqError as exc:
            out.status.CopyFrom(status(code_of_error(exc), str(exc)))
            return out
        out.message_id = message_id
        out.status.CopyFrom(status(Code.OK))
        return out

    # ------------------------------------------------------------------ receiving
    async def receive_message(self, call: Call) -> None:
        """A pop on the core pop service: one status, the messages, the delivery time."""
        req = _parse(schema.ReceiveMessageRequest, await call.request())
        if not call.client_id:
            _send_receive_status(call, Code.CLIENT_ID_REQUIRED, "x-mq-client-id missing")
            return
        if (refused := self.denied(call, "ReceiveMessage", req)) is not None:
            _send_receive_status(call, refused.code, refused.message)
            return
        topic = req.message_queue.topic.name
        try:
            poll_ms = self._poll_ms(call, req)
            invisible_ms = _invisible_ms(req)
            if self.broker.topics.get(topic) is None and self.broker.routes.route(topic):
                # Not created yet (its route is the planned one): wait for the first send.
                start = trio.current_time()
                if not await self.broker.pops.wait_for_topic(topic, req.group.name, poll_ms):
                    _send_receive_status(call, Code.MESSAGE_NOT_FOUND, "no new message")
                    return
                poll_ms -= int((trio.current_time() - start) * 1000)
            pop = self.broker.pops.request(
                req.group.name,
                topic,
                -1,
                min(req.batch_size or 32, 32),
                invisible_ms,
                expression=req.filter_expression.expression or "*",
                expression_type=(
                    "SQL92" if req.filter_expression.type == schema.FilterType.SQL else "TAG"
                ),
                order=self.clients.fifo(req.group.name),
                attempt_id=req.attempt_id if req.HasField("attempt_id") else None,
                init_mode=INIT_MODE_MAX,
            )
        except (_Refused, TrimqError) as exc:
            refusal = _refusal(exc)
            _send_receive_status(call, refusal.code, refusal.message)
            return
        batch = await self.broker.pops.pop(pop, poll_ms=poll_ms)
        if req.auto_renew and batch.found:
            # Push consumers: invisible while the client works on them, released when it
            # goes away (GrpcClients.terminate).
            self.broker.pops.keep_invisible(call.client_id, batch)
        await self._deliver(call, batch)

    def _poll_ms(self, call: Call, req: Any) -> int:
        if req.HasField("long_polling_timeout"):
            poll = duration_ms(req.long_polling_timeout)
        else:
            poll = MAX_POLL_MS
        poll = max(MIN_POLL_MS, min(poll, MAX_POLL_MS))
        deadline = call.scope.deadline
        if deadline != float("inf"):
            remaining = int((deadline - trio.current_time()) * 1000) - POLL_MARGIN_MS
            if remaining < MIN_POLL_MS:
                raise _Refused(
                    Code.ILLEGAL_POLLING_TIME,
                    f"the call's deadline leaves {remaining} ms, under {MIN_POLL_MS} ms",
                )
            poll = min(poll, remaining)
        return poll

    async def _deliver(self, call: Call, batch: PopBatch) -> None:
        popped = batch.messages()
        if not popped:
            _send_receive_status(call, Code.MESSAGE_NOT_FOUND, "no new message")
            return
        head = schema.ReceiveMessageResponse()
        head.status.CopyFrom(status(Code.OK))
        call.send_nowait(head.SerializeToString())
        call.send_many_nowait(_delivered(popped))
        _send_delivery_timestamp(call, self.broker.clock.now_ms())
        try:
            await call.drain()
        except trio.Cancelled:
            # The client went away (or its deadline passed) before the messages left: let
            # them come back soon rather than at their invisible time.
            self._release(batch.request.group, popped)
            raise

    def _release(self, group: str, popped: list[Popped]) -> None:
        for item in popped:
            lease = item.lease
            with contextlib.suppress(TrimqError):  # acked or changed meanwhile: nothing to do
                self.broker.pops.change(
                    group, lease.topic, lease.queue_id, lease.offset, item.receipt,
                    RELEASE_INVISIBLE_MS,
                )  # fmt: skip

    # ------------------------------------------------------------------ ack / change / DLQ
    async def ack_message(self, call: Call, req: Any) -> Any:
        """Ack each entry; per-entry statuses, MULTIPLE_RESULTS when they differ."""
        out = schema.AckMessageResponse()
        group, topic = req.group.name, req.topic.name
        for entry in req.entries:
            result = out.entries.add()
            result.message_id = entry.message_id
            result.receipt_handle = entry.receipt_handle
            result.status.CopyFrom(self._ack_one(group, topic, entry.receipt_handle))
        codes = {e.status.code for e in out.entries}
        if len(codes) == 1:
            out.status.CopyFrom(out.entries[0].status)
        else:
            out.status.CopyFrom(status(Code.MULTIPLE_RESULTS if codes else Code.BAD_REQUEST))
        return out

    def _ack_one(self, group: str, topic: str, handle: str) -> Any:
        try:
            receipt, _ = _receipt_of(handle)
            self.broker.pops.ack(group, topic, receipt.queue_id, _offset(receipt), receipt)
        except (_Refused, TrimqError) as exc:
            return _refusal(exc, name_code=Code.ILLEGAL_CONSUMER_GROUP)
        return status(Code.OK)

    async def change_invisible_duration(self, call: Call, req: Any) -> Any:
        """A new invisible time (0 s: visible now); answers the new receipt handle."""
        out = schema.ChangeInvisibleDurationResponse()
        try:
            invisible_ms = duration_ms(req.invisible_duration)
            if not 0 <= invisible_ms <= MAX_INVISIBLE_MS:
                raise _Refused(Code.ILLEGAL_INVISIBLE_TIME, f"{invisible_ms} ms is out of range")
            receipt, commit_offset = _receipt_of(req.receipt_handle)
            offset = _offset(receipt)
            lease = self.broker.pops.change(
                req.group.name, req.topic.name, receipt.queue_id, offset, receipt, invisible_ms
            )
        except (_Refused, TrimqError) as exc:
            out.status.CopyFrom(_refusal(exc))
            return out
        renewed = dataclasses.replace(
            receipt,
            pop_time_ms=lease.pop_time,
            invisible_time_ms=lease.invisible_ms,
            queue_offset=offset,
        )
        out.receipt_handle = (
            renewed.encode() if commit_offset is None else encode_handle(renewed, commit_offset)
        )
        out.status.CopyFrom(status(Code.OK))
        return out

    async def forward_to_dlq(self, call: Call, req: Any) -> Any:
        """Move the message to the group's DLQ now, then ack it (the proxy's order)."""
        out = schema.ForwardMessageToDeadLetterQueueResponse()
        group, topic = req.group.name, req.topic.name
        try:
            receipt, commit_offset = _receipt_of(req.receipt_handle)
            if commit_offset is None:
                raise _Refused(Code.INVALID_RECEIPT_HANDLE, "receipt handle has no log offset")
            await self.broker.sends.dead_letter(group, commit_offset, req.message_id or None)
            self.broker.pops.ack(group, topic, receipt.queue_id, _offset(receipt), receipt)
        except (_Refused, TrimqError) as exc:
            out.status.CopyFrom(_refusal(exc))
            return out
        out.status.CopyFrom(status(Code.OK))
        return out


# ------------------------------------------------------------------ helpers


class SendResult(NamedTuple):
    """One message's outcome in a SendMessage call (a ``SendResultEntry``): its status,
    and what a stored message is answered with."""

    code: int
    #: The status message ("" → the code's name, as :func:`status` gives).
    message: str = ""
    message_id: str = ""
    offset: int = 0
    transaction_id: str = ""
    recall_handle: str = ""


def send_response(results: list[SendResult]) -> bytes:
    """The serialised ``SendMessageResponse`` of one or more results: an entry each, and
    the first's status when all have the same code (else MULTIPLE_RESULTS), as building it
    with protobuf gives (``tests/broker/grpc/test_service.py`` compares the two). Written
    directly: the protobuf objects of a SendMessage response cost more than the bytes."""
    entries = []
    for result in results:
        parts = [sub(b"\x0a", status_bytes(result.code, result.message))]
        if result.message_id:
            parts.append(text_field(b"\x12", result.message_id))
        if result.transaction_id:
            parts.append(text_field(b"\x1a", result.transaction_id))
        if result.offset:
            parts.append(b"\x20" + varint(result.offset))
        if result.recall_handle:
            parts.append(text_field(b"\x2a", result.recall_handle))
        entries.append(sub(b"\x12", b"".join(parts)))
    first = results[0]
    if all(result.code == first.code for result in results):
        head = status_bytes(first.code, first.message)
    else:
        head = status_bytes(Code.MULTIPLE_RESULTS)
    return sub(b"\x0a", head) + b"".join(entries)


class _Refused(Exception):
    """An RPC's own refusal (a v2 code and why)."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code


def _refusal(exc: Exception, *, name_code: Code = Code.BAD_REQUEST) -> Any:
    """The v2 ``Status`` of an RPC's own refusal or a core error."""
    if isinstance(exc, _Refused):
        return status(exc.code, str(exc))
    assert isinstance(exc, TrimqError)
    return status(code_of_error(exc, name_code=name_code), str(exc))


def _unary(
    method: schema.Method,
    name: str,
    fn: Callable[[Call, Any], Awaitable[Any]],
    denied: Callable[[Call, str, Any], Any | None],
) -> Handler:
    async def handle(call: Call) -> None:
        req = _parse(method.request, await call.request())
        out: Any
        if not call.client_id:
            out = method.response()
            out.status.CopyFrom(status(Code.CLIENT_ID_REQUIRED, "x-mq-client-id missing"))
        elif (refused := denied(call, name, req)) is not None:
            out = method.response()
            out.status.CopyFrom(refused)
        else:
            out = await fn(call, req)
        # A handler may answer serialised bytes (SendMessage), else a protobuf response.
        call.send_nowait(out if type(out) is bytes else out.SerializeToString())

    return handle


def _parse(cls: Any, payload: bytes) -> Any:
    try:
        return cls.FromString(payload)
    except DecodeError as exc:
        raise GrpcError(
            GrpcStatus.INTERNAL, f"request is not a valid {cls.__name__}: {exc}"
        ) from None


def _delivered(popped: list[Popped]) -> Iterator[bytes]:
    """Each popped message as a serialised ``ReceiveMessageResponse``, in order (built from
    the record's bytes: :func:`~protocol.grpc.convert.delivered_response`)."""
    response = delivered_response
    for item in popped:
        yield response(item.record, item.receipt, item.lease.invisible_ms)


def _send_receive_status(call: Call, code: int, message: str) -> None:
    out = schema.ReceiveMessageResponse()
    out.status.CopyFrom(status(code, message))
    call.send_nowait(out.SerializeToString())


def _send_delivery_timestamp(call: Call, now_ms: int) -> None:
    out = schema.ReceiveMessageResponse()
    set_timestamp(out.delivery_timestamp, now_ms)
    call.send_nowait(out.SerializeToString())


def _invisible_ms(req: Any) -> int:
    if req.auto_renew:
        return DEFAULT_INVISIBLE_MS
    if not req.HasField("invisible_duration"):
        raise _Refused(Code.ILLEGAL_INVISIBLE_TIME, "invisible_duration is required")
    invisible = duration_ms(req.invisible_duration)
    if not MIN_INVISIBLE_MS <= invisible <= MAX_INVISIBLE_MS:
        raise _Refused(
            Code.ILLEGAL_INVISIBLE_TIME,
            f"invisible_duration {invisible} ms is outside [{MIN_INVISIBLE_MS}, "
            f"{MAX_INVISIBLE_MS}] ms",
        )
    return invisible


def _receipt_of(handle: str) -> tuple[ExtraInfo, int | None]:
    try:
        return decode_handle(handle)
    except ReceiptError as exc:
        raise _Refused(Code.INVALID_RECEIPT_HANDLE, str(exc)) from None


def _offset(receipt: ExtraInfo) -> int:
    if receipt.queue_offset is None:
        raise _Refused(Code.INVALID_RECEIPT_HANDLE, "receipt handle has no queue offset")
    return receipt.queue_offset


def _permission(perm: int) -> int:
    readable, writable = is_readable(perm), is_writeable(perm)
    if readable and writable:
        return schema.Permission.READ_WRITE
    if readable:
        return schema.Permission.READ
    if writable:
        return schema.Permission.WRITE
    return schema.Permission.NONE


def _check_delivery_time(props: dict[str, str], now_ms: int) -> None:
    """A delivery time the timer refuses (too far ahead) is ILLEGAL_DELIVERY_TIME, the v2
    code for it (the core's MESSAGE_ILLEGAL would answer BAD_REQUEST)."""
    try:
        delivery_time(props, now_ms)
    except ValueError as exc:
        raise MessageRejected(Code.ILLEGAL_DELIVERY_TIME, f"bad delivery time: {exc}") from None


def _born_ms(system: Any, now_ms: int) -> int:
    if system.HasField("born_timestamp"):
        return timestamp_ms(system.born_timestamp)
    return now_ms


def build_service(
    broker: Broker,
    endpoint: GrpcEndpoint,
    cluster: ClusterRoutes | None = None,
    acl: AclGuard | None = None,
) -> MessagingService:
    """The gRPC front end over ``broker``, reached at ``endpoint``; ``cluster``: the routes of
    the cluster it belongs to (None: standalone)."""
    clients = GrpcClients(
        broker.clients,
        broker.groups,
        broker.pops.release,
        max_message_size=broker.config.max_message_size,
    )
    return MessagingService(broker, endpoint, clients, cluster, acl)
