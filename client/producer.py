"""``Producer``: send messages, retrying on another broker within one total timeout.

Semantics follow ``DefaultMQProducer`` (sync send): ``1 + retry_times`` attempts, each given
what is left of ``send_timeout``; a queue is picked round-robin, skipping the broker whose
attempt just failed and brokers whose connection is backing off; client-side failures
(connect refused, connection lost, timeout) and the broker codes RocketMQ retries
(``SYSTEM_ERROR``, ``SYSTEM_BUSY``, ``SERVICE_NOT_AVAILABLE``, ``NO_PERMISSION``,
``TOPIC_NOT_EXIST``) move on to the next attempt; any other broker answer raises at once.
A topic no name server knows is sent with ``TBW102`` as its default topic, so the broker
auto-creates it (``autoCreateTopicEnable``).

Ordered sends take a ``sharding_key``: the same key always maps to the same queue (a stable
hash of the key over the topic's write queues, Java's ``SelectMessageQueueByHash``), and such
a send retries only that queue, since moving it would break the order.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from types import TracebackType

import anyio
import structlog

from client.config import ClientConfig
from client.errors import ClientClosedError, ClientError, NoRouteError, SendFailedError
from client.instance import ClientInstance, TopicRoute, open_instance
from client.message import (
    MAX_BODY_SIZE,
    Message,
    ReceivedMessage,
    SendReceipt,
    SendStatus,
    compress_body,
)
from client.transaction import (
    LocalTransaction,
    TransactionChecker,
    TransactionReceipt,
    TransactionState,
    end_header,
    resolve,
)
from protocol.batch import BatchEntry, encode_batch
from protocol.bodies.consumer import MessageQueue
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError, ProtocolError, RecordError, for_code
from protocol.headers.send import SendMessageRequestHeader, SendMessageResponseHeader
from protocol.headers.transaction import CheckTransactionStateRequestHeader
from protocol.message import SYSFLAG_TRANSACTION_PREPARED, decode_record
from protocol.msgid import UniqKeyGenerator, decode_offset_msg_id, ip_to_bytes
from protocol.naming import DEFAULT_TOPIC, validate_group
from protocol.properties import PGROUP, TRAN_MSG, encode_properties, java_string_hash

_log = structlog.get_logger("trimq.client")
AUTO_CREATE_TOPIC = DEFAULT_TOPIC
#: Broker answers after which another broker may succeed (``DefaultMQProducer``).
RETRY_CODES = frozenset(
    {
        ResponseCode.SYSTEM_ERROR,
        ResponseCode.SYSTEM_BUSY,
        ResponseCode.SERVICE_NOT_AVAILABLE,
        ResponseCode.NO_PERMISSION,
        ResponseCode.TOPIC_NOT_EXIST,
        # Only when it carries no msgId: a sync-replication broker with too few replicas in
        # sync refused the message before storing it (see _receipt).
        ResponseCode.SLAVE_NOT_AVAILABLE,
    }
)
_STATUS = {
    ResponseCode.SUCCESS: SendStatus.SEND_OK,
    ResponseCode.FLUSH_DISK_TIMEOUT: SendStatus.FLUSH_DISK_TIMEOUT,
    ResponseCode.FLUSH_SLAVE_TIMEOUT: SendStatus.FLUSH_SLAVE_TIMEOUT,
    ResponseCode.SLAVE_NOT_AVAILABLE: SendStatus.SLAVE_NOT_AVAILABLE,
}

#: Builds the request of one attempt for a queue and a default topic.
_Builder = Callable[[MessageQueue, str], RemotingCommand]


def shard_queue(queues: Sequence[MessageQueue], key: str) -> MessageQueue:
    """The queue a sharding key maps to: stable across processes and runs."""
    return queues[abs(java_string_hash(key)) % len(queues)]


class Producer:
    """Sends messages (use as ``async with Producer(...) as producer``).

    Args:
        config: connection settings (name servers, timeouts).
        group: the producer group (``DEFAULT_PRODUCER`` as in Java).
        send_timeout: total seconds for one send, retries included.
        retry_times: extra attempts after the first.
        compress_over: bodies of at least this many bytes are zlib-compressed (0 = never).
        max_body_size: larger bodies are refused before sending.
        default_topic_queue_nums: queues of a topic the broker auto-creates for us.
        checker: answers the broker's questions about this group's half messages whose
            transaction it does not know (see :meth:`send_in_transaction`); without one,
            such questions go unanswered (another producer of the group may answer).
        topics: topics it sends to: their routes are fetched at start, so that the
            producer announces its group to their brokers at once (a producer that only
            checks transactions must name them to be asked).
    """

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        group: str = "DEFAULT_PRODUCER",
        send_timeout: float = 3.0,
        retry_times: int = 2,
        compress_over: int = 4096,
        max_body_size: int = MAX_BODY_SIZE,
        default_topic_queue_nums: int = 4,
        checker: TransactionChecker | None = None,
        topics: Sequence[str] = (),
    ) -> None:
        validate_group(group)
        self.checker = checker
        self.topics = tuple(topics)
        #: Brokers told about this group since it started (a checker must be reachable).
        self._announced: set[str] = set()
        self.config = config or ClientConfig()
        self.group = group
        self.send_timeout = send_timeout
        self.retry_times = retry_times
        self.compress_over = compress_over
        self.max_body_size = max_body_size
        self.default_topic_queue_nums = default_topic_queue_nums
        self._instance: ClientInstance | None = None
        self._stack: AsyncExitStack | None = None
        self._next_queue = 0
        ip = self.config.client_ip
        try:
            packed = ip_to_bytes(ip)
        except ValueError:
            packed = bytes(4)
        self._uniq = UniqKeyGenerator(packed, os.getpid(), lambda: int(time.time() * 1000))

    # ------------------------------------------------------------------ lifetime
    async def __aenter__(self) -> Producer:
        async with AsyncExitStack() as stack:  # unwinds if starting fails
            instance, _ = await stack.enter_async_context(open_instance(self.config))
            instance.producer_groups.add(self.group)
            if self.checker is not None:
                instance.on_check_transaction = self._on_check
            if self.topics:
                await instance.prefetch_routes(self.topics)
                await instance.heartbeat()
                self._announced.update(instance.broker_addresses().values())
            self._instance, self._stack = instance, stack.pop_all()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        instance, stack = self._instance, self._stack
        self._instance = self._stack = None
        if instance is None or stack is None:
            return
        await instance.unregister(producer_group=self.group)
        await stack.__aexit__(exc_type, exc, tb)

    @property
    def instance(self) -> ClientInstance:
        """The running client core.

        Raises:
            ClientClosedError: outside ``async with``.
        """
        if self._instance is None:
            raise ClientClosedError("the producer is not running: use 'async with Producer(...)'")
        return self._instance

    # ------------------------------------------------------------------ sending
    async def send(self, message: Message, *, sharding_key: str | None = None) -> SendReceipt:
        """Send ``message`` and wait until the broker stored it.

        Raises:
            ValueError, IllegalNameError: the message is invalid (nothing was sent).
            SendFailedError: every attempt failed within ``send_timeout``.
            BrokerError: the broker refused it for a reason retrying cannot fix.
        """
        message.validate(self.max_body_size)
        uniq = self._uniq.new_uniq_key()
        body, sys_flag = compress_body(message.body, 0, self.compress_over)
        properties = encode_properties(message.wire_properties(uniq))
        return await self._send_with_retries(
            message.topic,
            sharding_key,
            lambda queue, default: self._single_request(
                queue, default, message, body, sys_flag, properties
            ),
            uniq,
        )

    async def send_oneway(self, message: Message, *, sharding_key: str | None = None) -> None:
        """Send ``message`` without waiting for the broker (one attempt, no result)."""
        message.validate(self.max_body_size)
        body, sys_flag = compress_body(message.body, 0, self.compress_over)
        properties = encode_properties(message.wire_properties(self._uniq.new_uniq_key()))
        route, default = await self._route(message.topic)
        queue = self._pick(route, sharding_key, avoid=None)
        cmd = self._single_request(queue, default, message, body, sys_flag, properties)
        await self.instance.remoting.invoke_oneway(self._address(queue), cmd, self.send_timeout)

    async def send_batch(
        self, messages: Sequence[Message], *, sharding_key: str | None = None
    ) -> list[SendReceipt]:
        """Send messages of one topic in one request (stored atomically, in order, in one
        queue). Batches are never compressed, as in RocketMQ.

        Raises:
            ValueError: empty batch, mixed topics, delayed messages or an invalid message.
        """
        if not messages:
            raise ValueError("a batch needs at least one message")
        topic = messages[0].topic
        entries = []
        uniqs = []
        for message in messages:
            message.validate(self.max_body_size)
            if message.topic != topic:
                raise ValueError("every message of a batch must have the same topic")
            if message.delay_level or message.delivery_timestamp is not None:
                raise ValueError("delayed messages cannot be batched")
            uniqs.append(self._uniq.new_uniq_key())
            entries.append(
                BatchEntry(message.body, message.wire_properties(uniqs[-1]), message.flag)
            )
        body = encode_batch(entries)
        if len(body) > self.max_body_size:
            raise ValueError(f"batch of {len(body)} bytes exceeds {self.max_body_size}")
        first = await self._send_with_retries(
            topic, sharding_key, lambda q, d: self._batch_request(q, d, topic, body), uniqs[0]
        )
        ids = first.offset_message_id.split(",")
        return [
            SendReceipt(
                uniq,
                first.queue,
                first.queue_offset + i,
                ids[i] if i < len(ids) else "",
                first.status,
            )
            for i, uniq in enumerate(uniqs)
        ]

    # ------------------------------------------------------------------ transactions
    async def send_in_transaction(
        self, message: Message, execute: LocalTransaction
    ) -> TransactionReceipt:
        """Send ``message`` as a half message, run ``execute(message, receipt)`` (the local
        transaction), and commit or roll back the message as it answers. Consumers see the
        message only once committed. UNKNOWN (or an exception from ``execute``, which is
        then raised again) leaves the decision to the broker's check-back: a producer of this
        group with a ``checker`` answers it.

        Raises:
            ValueError, IllegalNameError: the message is invalid, or delayed (RocketMQ does
                not delay transactional messages).
            SendFailedError, BrokerError: the half message could not be sent (nothing ran).
        """
        if message.delay_level or message.delivery_timestamp is not None:
            raise ValueError("a transactional message cannot be delayed")
        message.validate(self.max_body_size)
        uniq = self._uniq.new_uniq_key()
        body, sys_flag = compress_body(message.body, 0, self.compress_over)
        props = message.wire_properties(uniq)
        props.update({TRAN_MSG: "true", PGROUP: self.group})
        properties = encode_properties(props)
        receipt = await self._send_with_retries(
            message.topic,
            None,
            lambda queue, default: self._single_request(
                queue, default, message, body, sys_flag | SYSFLAG_TRANSACTION_PREPARED, properties
            ),
            uniq,
        )
        await self._announce(receipt.queue)
        try:
            state = await resolve(execute(message, receipt))
        except BaseException:
            await self._end(receipt, TransactionState.UNKNOWN)
            raise
        return await self._end(receipt, state)

    async def _announce(self, queue: MessageQueue) -> None:
        """Heartbeat once to a broker that holds our half messages and has not heard of the
        group yet, so that its check-backs can reach us before the periodic heartbeat."""
        address = self.instance.broker_address(queue.broker_name)
        if address is not None and address not in self._announced:
            self._announced.add(address)
            await self.instance.heartbeat()

    async def _end(self, receipt: SendReceipt, state: TransactionState) -> TransactionReceipt:
        """Tell the broker that stored ``receipt`` how the transaction ended. UNKNOWN is
        oneway: the broker answers it with nothing."""
        _, _, commit_offset = decode_offset_msg_id(receipt.offset_message_id)
        header = end_header(
            self.group,
            queue_offset=receipt.queue_offset,
            commit_offset=commit_offset,
            state=state,
            msg_id=receipt.message_id,
            transaction_id=receipt.transaction_id or receipt.message_id,
            from_check=False,
        )
        cmd = self.instance.request(RequestCode.END_TRANSACTION, header.to_ext())
        try:
            address = self._address(receipt.queue)
            if state is TransactionState.UNKNOWN:
                await self.instance.remoting.invoke_oneway(address, cmd, self.send_timeout)
                return TransactionReceipt(receipt, state, False, "left to the check-back")
            await self.instance.call(address, cmd, self.send_timeout)
        except (ClientError, BrokerError) as exc:
            return TransactionReceipt(receipt, state, False, str(exc))
        return TransactionReceipt(receipt, state, True)

    async def _on_check(self, cmd: RemotingCommand, address: str) -> None:
        """A broker asks about a half message: run the checker, answer with END_TRANSACTION
        (oneway, as Java's producers do: the broker may ask again)."""
        checker = self.checker
        if checker is None:
            return
        try:
            header = CheckTransactionStateRequestHeader.from_ext(cmd.ext_fields)
            record, _ = decode_record(cmd.body)
        except (ProtocolError, RecordError) as exc:
            _log.warning("unreadable transaction check", broker=address, error=str(exc))
            return
        message = ReceivedMessage.of(record, "")
        try:
            state = await resolve(checker(message))
        except Exception as exc:  # the checker's bug: the broker asks again later
            _log.warning("transaction checker failed", msg_id=header.msg_id, error=repr(exc))
            return
        answer = end_header(
            record.properties.get(PGROUP, self.group),
            queue_offset=header.tran_state_table_offset,
            commit_offset=header.commit_log_offset,
            state=state,
            msg_id=header.msg_id or record.msg_id,
            transaction_id=header.transaction_id,
            from_check=True,
        )
        end = self.instance.request(RequestCode.END_TRANSACTION, answer.to_ext())
        with contextlib.suppress(ClientError):
            await self.instance.remoting.invoke_oneway(address, end, self.send_timeout)

    # ------------------------------------------------------------------ internals
    async def _send_with_retries(
        self,
        topic: str,
        sharding_key: str | None,
        build: _Builder,
        uniq: str,
    ) -> SendReceipt:
        deadline = anyio.current_time() + self.send_timeout
        attempts: list[tuple[str, Exception]] = []
        avoid: str | None = None
        for _ in range(1 + self.retry_times):
            left = deadline - anyio.current_time()
            if left <= 0:
                break
            try:
                with anyio.fail_after(left):
                    route, default = await self._route(topic)
            except (NoRouteError, TimeoutError) as exc:
                attempts.append(("(route)", exc))
                continue
            queue = self._pick(route, sharding_key, avoid=avoid)
            try:
                reply = await self.instance.remoting.invoke(
                    self._address(queue),
                    build(queue, default),
                    max(0.001, deadline - anyio.current_time()),
                )
                return self._receipt(reply, queue, uniq)
            except ClientError as exc:
                attempts.append((queue.broker_name, exc))
            except BrokerError as exc:
                if exc.code not in RETRY_CODES:
                    raise
                attempts.append((queue.broker_name, exc))
            avoid = queue.broker_name
        spent = self.send_timeout - max(0.0, deadline - anyio.current_time())
        detail = "; ".join(f"{b}: {e}" for b, e in attempts) or "no time left"
        raise SendFailedError(
            f"send to {topic!r} failed after {len(attempts)} attempt(s) in {spent:.3f} s: {detail}",
            attempts=attempts,
        )

    async def _route(self, topic: str) -> tuple[TopicRoute, str]:
        """The route to write ``topic`` and the default topic for auto-creation."""
        instance = self.instance
        try:
            route = await instance.route(topic)
            if route.write_queues:
                return route, AUTO_CREATE_TOPIC
        except NoRouteError:
            pass
        fallback = await instance.route(AUTO_CREATE_TOPIC)
        if not fallback.write_queues:
            raise NoRouteError(f"topic {topic!r} has no writable queue and cannot be auto-created")
        queues = tuple(
            MessageQueue(topic, q.broker_name, q.queue_id)
            for q in fallback.write_queues
            if q.queue_id < self.default_topic_queue_nums
        )
        return TopicRoute(topic, fallback.data, queues, ()), AUTO_CREATE_TOPIC

    def _pick(
        self, route: TopicRoute, sharding_key: str | None, *, avoid: str | None
    ) -> MessageQueue:
        queues = route.write_queues
        if sharding_key is not None:
            return shard_queue(queues, sharding_key)
        # Per broker, not per queue: a send asks the back-off state once for each broker.
        remoting, instance = self.instance.remoting, self.instance
        down = {
            name
            for name in {q.broker_name for q in queues}
            if remoting.is_backing_off(instance.broker_address(name) or "")
        }
        usable = [q for q in queues if q.broker_name != avoid and q.broker_name not in down]
        pool = usable or [q for q in queues if q.broker_name != avoid] or list(queues)
        self._next_queue += 1
        return pool[self._next_queue % len(pool)]

    def _address(self, queue: MessageQueue) -> str:
        address = self.instance.broker_address(queue.broker_name)
        if address is None:
            raise NoRouteError(f"broker {queue.broker_name!r} has no master address")
        return address

    def _header(
        self,
        queue: MessageQueue,
        default: str,
        *,
        sys_flag: int = 0,
        flag: int = 0,
        properties: str | None = None,
        batch: bool | None = None,
    ) -> SendMessageRequestHeader:
        return SendMessageRequestHeader(
            producer_group=self.group,
            topic=queue.topic,
            default_topic=default,
            default_topic_queue_nums=self.default_topic_queue_nums,
            queue_id=queue.queue_id,
            born_timestamp=int(time.time() * 1000),
            broker_name=queue.broker_name,
            sys_flag=sys_flag,
            flag=flag,
            properties=properties,
            batch=batch,
        )

    def _single_request(
        self,
        queue: MessageQueue,
        default: str,
        message: Message,
        body: bytes,
        sys_flag: int,
        properties: str,
    ) -> RemotingCommand:
        header = self._header(
            queue, default, sys_flag=sys_flag, flag=message.flag, properties=properties
        )
        return self.instance.request(RequestCode.SEND_MESSAGE_V2, header.to_v2_ext(), body)

    def _batch_request(
        self, queue: MessageQueue, default: str, topic: str, body: bytes
    ) -> RemotingCommand:
        header = self._header(queue, default, batch=True)
        return self.instance.request(RequestCode.SEND_BATCH_MESSAGE, header.to_v2_ext(), body)

    @staticmethod
    def _receipt(reply: RemotingCommand, queue: MessageQueue, uniq: str) -> SendReceipt:
        status = _STATUS.get(reply.code)  # type: ignore[call-overload]
        # SLAVE_NOT_AVAILABLE with a msgId: stored (RocketMQ, older trimq); without: refused
        # before the append (trimq), so another broker may take it without a duplicate.
        refused = reply.code == ResponseCode.SLAVE_NOT_AVAILABLE and "msgId" not in (
            reply.ext_fields or {}
        )
        if status is None or refused:
            raise for_code(reply.code, reply.remark)
        header = SendMessageResponseHeader.from_ext(reply.ext_fields)
        stored = MessageQueue(queue.topic, queue.broker_name, header.queue_id)
        return SendReceipt(
            uniq, stored, header.queue_offset, header.msg_id, status, header.transaction_id
        )
