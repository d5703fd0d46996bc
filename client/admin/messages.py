"""Message commands: ``queryMsgById``, ``queryMsgByKey`` and ``sendMessage`` (mqadmin's
``tools/command/message``); ``consumeMessage`` lives in ``client.admin.consume``.

``queryMsgById`` takes either id a message has: the broker's offset id (store host + commit-log
offset: looked up with VIEW_MESSAGE_BY_ID on that broker, no index needed) or the producer's
unique key (``UNIQ_KEY``: looked up in the index with QUERY_MESSAGE and the unique-key flag, on
the topic given with ``-t`` or else on every non-system topic). Both ids are 32 hex digits, so
an id is read as an offset id only when it names a broker the name server knows.
"""

from __future__ import annotations

import argparse

from client.admin.output import Result, format_ms, key_values, table
from client.admin.session import Admin, AdminError
from client.message import Message, ReceivedMessage
from client.producer import Producer
from protocol.codes import RequestCode, ResponseCode
from protocol.errors import RecordError, for_code
from protocol.headers.admin import QueryMessageRequestHeader, ViewMessageRequestHeader
from protocol.message import MessageExt, decode_records
from protocol.msgid import decode_offset_msg_id
from protocol.naming import is_retry_topic, is_system_topic
from protocol.properties import UNIQ_KEY

#: ``MixAll.UNIQUE_MSG_QUERY_FLAG``: the key of a QUERY_MESSAGE is a unique key.
UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"
#: Results of one key query (mqadmin ``queryMsgByKey`` asks for 64).
MAX_QUERY_NUM = 64
_END_OF_TIME = 2**63 - 1


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the message commands to the CLI."""
    p = sub.add_parser("queryMsgById", help="a message by offset id or unique key")
    p.add_argument("-i", "--msgId", required=True)
    p.add_argument("-t", "--topic", help="topic of a unique key (default: search every topic)")
    p.set_defaults(run=query_msg_by_id)

    p = sub.add_parser("queryMsgByKey", help="messages of a topic by key")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-k", "--msgKey", required=True)
    p.set_defaults(run=query_msg_by_key)

    p = sub.add_parser("sendMessage", help="send one message")
    p.add_argument("-t", "--topic", required=True)
    p.add_argument("-p", "--body", required=True)
    p.add_argument("-c", "-g", "--tags", dest="tags", help="the tag")
    p.add_argument("-k", "--keys", help="keys, separated by spaces")
    p.set_defaults(run=send_message)


def message_doc(m: MessageExt, body: bytes) -> dict[str, object]:
    """A stored message as JSON."""
    return {
        "msgId": m.msg_id,
        "offsetMsgId": m.offset_msg_id,
        "topic": m.topic,
        "tags": m.tags,
        "keys": m.keys,
        "queueId": m.queue_id,
        "queueOffset": m.queue_offset,
        "commitLogOffset": m.commit_log_offset,
        "reconsumeTimes": m.reconsume_times,
        "bornTimestamp": m.born_timestamp,
        "storeTimestamp": m.store_timestamp,
        "bornHost": f"{m.born_host[0]}:{m.born_host[1]}",
        "storeHost": f"{m.store_host[0]}:{m.store_host[1]}",
        "sysFlag": m.sys_flag,
        "properties": dict(m.properties),
        "body": body.decode("utf-8", errors="replace"),
    }


def message_text(m: MessageExt, body: bytes) -> str:
    """mqadmin's ``queryMsgById`` key/value lines; the body is printed (mqadmin writes it
    to a file and prints the path)."""
    return key_values([
        ("OffsetID", m.offset_msg_id),
        ("Topic", m.topic),
        ("Tags", f"[{m.tags or ''}]"),
        ("Keys", f"[{' '.join(m.keys)}]"),
        ("Queue ID", m.queue_id),
        ("Queue Offset", m.queue_offset),
        ("CommitLog Offset", m.commit_log_offset),
        ("Reconsume Times", m.reconsume_times),
        ("Born Timestamp", format_ms(m.born_timestamp)),
        ("Store Timestamp", format_ms(m.store_timestamp)),
        ("Born Host", f"{m.born_host[0]}:{m.born_host[1]}"),
        ("Store Host", f"{m.store_host[0]}:{m.store_host[1]}"),
        ("System Flag", m.sys_flag),
        ("Properties", dict(m.properties)),
        ("Message Body", body.decode("utf-8", errors="replace")),
    ])  # fmt: skip


def _records(body: bytes) -> list[ReceivedMessage]:
    try:
        return [ReceivedMessage.of(r, "") for r in decode_records(body)]
    except RecordError as exc:
        raise AdminError(f"malformed message in reply: {exc}") from None


async def _by_offset_id(admin: Admin, msg_id: str) -> ReceivedMessage | None:
    try:
        host, port, offset = decode_offset_msg_id(msg_id)
    except RecordError:
        return None
    address = f"{host}:{port}"
    if address not in {ref.address for ref in await admin.brokers()}:
        return None  # not a broker's id (likely a unique key): do not dial a made-up address
    ext = ViewMessageRequestHeader(offset=offset).to_ext()
    reply = await admin.invoke(address, admin.request(RequestCode.VIEW_MESSAGE_BY_ID, ext))
    if reply.code != ResponseCode.SUCCESS:
        return None
    found = _records(reply.body)
    return found[0] if found else None


async def query_key(
    admin: Admin, topic: str, key: str, *, unique: bool = False
) -> list[ReceivedMessage]:
    """Messages of ``topic`` whose keys (or unique key) hold ``key``, from every broker."""
    header = QueryMessageRequestHeader(
        topic=topic, key=key, max_num=MAX_QUERY_NUM, begin_timestamp=0,
        end_timestamp=_END_OF_TIME,
    )  # fmt: skip
    ext = header.to_ext()
    if unique:
        ext[UNIQUE_MSG_QUERY_FLAG] = "true"
    found: list[ReceivedMessage] = []
    for ref in await admin.topic_brokers(topic):
        reply = await admin.invoke(ref.address, admin.request(RequestCode.QUERY_MESSAGE, ext))
        if reply.code == ResponseCode.QUERY_NOT_FOUND:
            continue
        if reply.code != ResponseCode.SUCCESS:
            raise for_code(reply.code, reply.remark)
        found += _records(reply.body)
    return found


async def _by_unique_key(admin: Admin, msg_id: str, topic: str | None) -> ReceivedMessage | None:
    if topic is not None:
        topics = [topic]
    else:
        try:
            names = await admin.topic_names()
        except AdminError:
            names = []
        topics = [n for n in names if not is_system_topic(n) and not is_retry_topic(n)]
    for name in topics:
        try:
            found = await query_key(admin, name, msg_id, unique=True)
        except AdminError:
            continue  # a topic deleted since it was listed
        for message in found:
            if message.record.properties.get(UNIQ_KEY) == msg_id:
                return message
    return None


async def query_msg_by_id(admin: Admin, args: argparse.Namespace) -> Result:
    """One message by offset id, else by unique key (see the module docstring)."""
    message = await _by_offset_id(admin, args.msgId)
    if message is None:
        message = await _by_unique_key(admin, args.msgId, args.topic)
    if message is None:
        raise AdminError(f"message {args.msgId!r} not found")
    return Result(
        message_doc(message.record, message.body), message_text(message.record, message.body)
    )


async def query_msg_by_key(admin: Admin, args: argparse.Namespace) -> Result:
    """Every message of the topic with the key (mqadmin's ``#Message ID #QID #Offset``)."""
    found = await query_key(admin, args.topic, args.msgKey)
    rows = [(m.message_id, m.record.queue_id, m.record.queue_offset) for m in found]
    doc = [message_doc(m.record, m.body) for m in found]
    return Result(doc, table(("Message ID", "QID", "Offset"), rows))


async def send_message(admin: Admin, args: argparse.Namespace) -> Result:
    """Send one message with :class:`~client.producer.Producer` (auto-creating the topic
    like any producer does)."""
    keys = args.keys.split() if args.keys else ()
    message = Message(args.topic, args.body.encode(), tag=args.tags, keys=keys)
    async with Producer(admin.config, group="TOOLS_PRODUCER") as producer:
        receipt = await producer.send(message)
    row = (receipt.queue.broker_name, receipt.queue.queue_id, receipt.status.value,
           receipt.message_id)  # fmt: skip
    doc = {
        "brokerName": receipt.queue.broker_name,
        "queueId": receipt.queue.queue_id,
        "queueOffset": receipt.queue_offset,
        "sendStatus": receipt.status.value,
        "msgId": receipt.message_id,
        "offsetMsgId": receipt.offset_message_id,
    }
    return Result(doc, table(("Broker Name", "QID", "Send Result", "MsgId"), [row]))
