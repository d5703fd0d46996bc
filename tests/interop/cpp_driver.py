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

``stream``
    a failover test's steady producer of ``--group``: sends the messages keyed ``P-0`` ..
    ``P-(N-1)`` (``--prefix P --count N``) to ``--topic`` synchronously, ``--pace-ms`` apart.
    A message is sent again (a new message, same key) until SEND_OK: every failed attempt
    (an exception, or another status) prints ``{"event": "send_failed", "key", "attempt",
    "error"}`` and waits ``--retry-pause-ms``; past ``--retry-for-ms`` it prints
    ``{"event": "gave_up", "key"}`` and goes on. A SEND_OK prints ``{"event": "sent", "key",
    "status", "msg_id", "offset", "attempts"}``. It stops early once standard input reaches
    end of file, then prints ``{"event": "done", "sent", "gave_up"}``. ``--send-timeout-ms``
    is the client's send timeout (3 s: an attempt never hangs longer). client-cpp 1.x asks
    the name server again for the routes it uses every 30 s (first 3 s after the start;
    ``MQClientFactory::updateTopicRouteInfo``), not settable: a failover reaches it no sooner.
    ``--renew-after K`` works around it: after K failed attempts in a row the producer is
    shut down and replaced by a new one under a new instance name (a client of its own,
    which asks the name server on its first send), printing ``{"event": "renewed", "key"}``.

``transact`` (client-cpp 2.1 only)
    a transactional producer of ``--group`` sends every message of ``--plan`` (a JSON file:
    ``{"topic", "messages": [{"key", "tag", "body", "local", "check"}]}``) with
    ``SendMessageTransaction``, one after the other. The local-transaction executor prints
    ``{"event": "executed", "key", "transaction_id", "local"}`` and answers the message's
    ``local``: ``"commit"``, ``"rollback"`` or ``"unknown"`` (the client then sends
    END_TRANSACTION with that outcome), or ``"crash"``: it prints ``{"event": "half_sent",
    "key", "transaction_id"}`` and leaves at once (``os._exit(0)``), before the client can end
    the transaction, as a producer killed between the half message and its commit. After each
    send ``{"event": "sent", "key", "tag", "rc", "status", "msg_id", "offset"}`` (plus
    ``"error"`` when ``rc`` is not 0), then ``{"event": "done"}``. The producer stays up (so
    the broker can check back) until standard input reaches end of file, then shuts down
    (unless ``--skip-shutdown``) and prints ``{"event": "stopped"}``.
``checker`` (client-cpp 2.1 only)
    the same transactional producer but sends nothing: a restarted producer of ``--group``
    that only answers the broker's checks (``local`` is not used), until end of file on
    standard input as above.

``produce`` and ``consume`` take ``--access-key AK --secret-key SK [--channel CH]``: the client
then signs every request (RocketMQ ACL 1.0, ``set_session_credentials``). A failed send prints
``{"event": "send_failed", "key", "error"}`` and the producer goes on with the next message.

In both transactional modes the checker callback answers the ``check`` of the plan's message
with the checked message's key (``"commit"``, ``"rollback"``, ``"unknown"``; a key not in the
plan gets ``"unknown"``) and prints ``{"event": "checked", "key", "msg_id", "transaction_id",
"times", "answer", ...}`` each time it runs (``times`` counts the checks of that key in this
process, from 1). ``transaction_id`` is the message's ``UNIQ_KEY`` (client-cpp 2.1 uses it as
the transaction id). The client-cpp 2.1 heartbeat, which tells the broker this connection
belongs to the producer group (and so may be checked), goes to the brokers the client knows a
route to: at start (none yet), 10 ms later (a ``transact`` producer may know its broker by
then), then every 30 s; a ``checker`` learns its broker from the route of ``TBW102`` 3 s after
its start, so it is checkable about 30 s after it starts. ``--log-level`` (1 = FATAL ..
6 = TRACE) sets the client's log level; at 5 = DEBUG it logs each END_TRANSACTION header. This
client build writes its log to ``$ROCKETMQ_CLIENT_LOG_DIR`` (else ``/logs/rocketmq-client/``,
whatever ``$HOME`` is).

The transactional C API is not in the wrappers' Python API: the driver binds it with ctypes
(``include/CProducer.h``, ``CTransactionStatus.h`` of client-cpp 2.1):

- ``CProducer* CreateTransactionProducer(const char* groupId,
  CLocalTransactionCheckerCallback checker, void* userData)``
- ``int SendMessageTransaction(CProducer*, CMessage*, CLocalTransactionExecutorCallback
  executor, void* userData, CSendResult* result)`` (0 = OK, 16 = PRODUCER_SEND_TRANSACTION_FAILED)
- ``CTransactionStatus (*CLocalTransactionExecutorCallback)(CProducer*, CMessage*, void*)``
  (called on the sending thread with the message being sent)
- ``CTransactionStatus (*CLocalTransactionCheckerCallback)(CProducer*, CMessageExt*, void*)``
  (called on the client's transaction thread pool with the message the broker sent)
- ``CTransactionStatus``: ``E_COMMIT_TRANSACTION = 0``, ``E_ROLLBACK_TRANSACTION = 1``,
  ``E_UNKNOWN_TRANSACTION = 2``.

The wrappers' ``PushConsumer.subscribe`` turns a handler exception into CONSUME_SUCCESS (the
exception escapes the ctypes callback, which then returns 0), so the driver registers its own
callback that *returns* the failure status. The transaction callbacks catch every exception
themselves for the same reason (0 would be a commit) and answer UNKNOWN after printing
``{"event": "callback_error", ...}``.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import itertools
import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
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


#: CSendStatus: E_SEND_OK.
SEND_OK = 0

#: ACL 1.0 credentials (access key, secret key, channel), when the test gave them.
Credentials = tuple[str, str, str] | None


def produce(namesrv: str, group: str, plan_path: str, credentials: Credentials = None) -> int:
    with open(plan_path, encoding="utf-8") as file:
        plan = json.load(file)
    producer = rmq.Producer(group, timeout=10_000)
    producer.set_namesrv_addr(namesrv)
    if credentials is not None:
        producer.set_session_credentials(*credentials)
    producer.start()
    try:
        for item in plan["messages"]:
            msg = rmq.Message(plan["topic"])
            msg.set_keys(item["key"])
            msg.set_tags(item["tag"])
            msg.set_body(item["body"])
            try:
                result = producer.send_sync(msg)
            except Exception as exc:  # the wrappers' ProducerSendSyncFailed, say
                emit("send_failed", key=item["key"], error=f"{type(exc).__name__}: {exc}")
                continue
            emit("sent", key=item["key"], tag=item["tag"], status=int(result.status),
                 msg_id=result.msg_id, offset=int(result.offset))  # fmt: skip
    finally:
        producer.shutdown()
    emit("done")
    return 0


def stream(namesrv: str, group: str, args: argparse.Namespace) -> int:
    """The ``stream`` mode (see the module docstring)."""
    stopping = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()  # until the test closes our standard input
        stopping.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    renewals = itertools.count(1)
    # Replaced producers stay referenced: the wrapper's __del__ would shut one down again.
    retired: list[Any] = []

    def new_producer() -> Any:
        producer = rmq.Producer(group, timeout=args.send_timeout_ms)
        producer.set_namesrv_addr(namesrv)
        if args.renew_after:
            # A client of its own (its own MQClientFactory, keyed by the instance name),
            # which asks the name server for the route on its first send.
            name = f"stream-{os.getpid()}-{next(renewals)}".encode()
            if ffi.dll.SetProducerInstanceName(producer._handle, name) != 0:
                raise RuntimeError(
                    f"SetProducerInstanceName: {_text(ffi.dll.GetLatestErrorMessage())}"
                )
        producer.start()
        return producer

    producer = new_producer()
    emit("started")
    sent = gave_up = failures = 0
    try:
        for i in range(args.count):
            if stopping.is_set():
                break
            key = f"{args.prefix}-{i}"
            first = time.monotonic()
            for attempt in itertools.count(1):
                msg = rmq.Message(args.topic)
                msg.set_keys(key)
                msg.set_tags("failover")
                msg.set_body(f"{key}|failover")
                try:
                    result = producer.send_sync(msg)
                except Exception as exc:  # the wrappers' ProducerSendSyncFailed, say
                    error = f"{type(exc).__name__}: {exc}"
                else:
                    if int(result.status) == SEND_OK:
                        emit("sent", key=key, status=int(result.status), msg_id=result.msg_id,
                             offset=int(result.offset), attempts=attempt)  # fmt: skip
                        sent += 1
                        failures = 0
                        break
                    error = f"status {int(result.status)}"
                emit("send_failed", key=key, attempt=attempt, error=error)
                failures += 1
                if args.renew_after and failures >= args.renew_after:
                    failures = 0
                    producer.shutdown()
                    retired.append(producer)
                    producer = new_producer()
                    emit("renewed", key=key)
                if time.monotonic() - first > args.retry_for_ms / 1000:
                    emit("gave_up", key=key)
                    gave_up += 1
                    break
                time.sleep(args.retry_pause_ms / 1000)
            time.sleep(args.pace_ms / 1000)
    finally:
        producer.shutdown()
    emit("done", sent=sent, gave_up=gave_up)
    return 0


def consume(
    namesrv: str, group: str, topic: str, expression: str, fail_key: str, *, shutdown: bool,
    credentials: Credentials = None,
) -> int:  # fmt: skip
    consumer = rmq.PushConsumer(group)
    consumer.set_namesrv_addr(namesrv)
    if credentials is not None:
        consumer.set_session_credentials(*credentials)
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


# ---------------------------------------------------------------- transactions (client-cpp 2.1)
#: CTransactionStatus (CTransactionStatus.h).
COMMIT, ROLLBACK, UNKNOWN = 0, 1, 2
STATUS = {"commit": COMMIT, "rollback": ROLLBACK, "unknown": UNKNOWN}
#: The C callbacks: CTransactionStatus (*)(CProducer*, CMessage* or CMessageExt*, void*).
TRANSACTION_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p)  # fmt: skip
#: Where client-cpp 2.1 sets the transaction id of a message (and its unique id).
UNIQ_KEY = b"UNIQ_KEY"


class CSendResult(ctypes.Structure):
    """CSendResult.h: ``{CSendStatus sendStatus; char msgId[256]; long long offset;}``."""

    _fields_ = [
        ("sendStatus", ctypes.c_int),
        ("msgId", ctypes.c_char * 256),
        ("offset", ctypes.c_longlong),
    ]


def bind_transactions() -> ctypes.CDLL:
    """The client library with the transactional C API declared (a handle of our own, so the
    wrappers' declarations stay as they are). Exits with an ``error`` event if the library
    has no such API (client-cpp 1.x)."""
    lib = ctypes.CDLL(ffi.dll._name)
    if not hasattr(lib, "CreateTransactionProducer"):
        emit("error", error=f"{ffi.dll._name} exports no transactional producer")
        sys.stdout.flush()
        os._exit(2)
    c_void_p, c_char_p, c_int = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    declare: list[tuple[str, list[Any], Any]] = [
        ("CreateTransactionProducer", [c_char_p, TRANSACTION_CALLBACK, c_void_p], c_void_p),
        ("SendMessageTransaction",
         [c_void_p, c_void_p, TRANSACTION_CALLBACK, c_void_p, ctypes.POINTER(CSendResult)], c_int),
        ("SetProducerNameServerAddress", [c_void_p, c_char_p], c_int),
        ("SetProducerSendMsgTimeout", [c_void_p, c_int], c_int),
        ("SetProducerLogLevel", [c_void_p, c_int], c_int),
        ("StartProducer", [c_void_p], c_int),
        ("ShutdownProducer", [c_void_p], c_int),
        ("GetLatestErrorMessage", [], c_char_p),
        # CMessage (the message being sent, in the executor)
        ("CreateMessage", [c_char_p], c_void_p),
        ("DestroyMessage", [c_void_p], c_int),
        ("SetMessageKeys", [c_void_p, c_char_p], c_int),
        ("SetMessageTags", [c_void_p, c_char_p], c_int),
        ("SetByteMessageBody", [c_void_p, c_char_p, c_int], c_int),
        ("GetOriginMessageKeys", [c_void_p], c_char_p),
        ("GetOriginMessageProperty", [c_void_p, c_char_p], c_char_p),
        # CMessageExt (the message the broker sent with its check)
        ("GetMessageTopic", [c_void_p], c_char_p),
        ("GetMessageTags", [c_void_p], c_char_p),
        ("GetMessageKeys", [c_void_p], c_char_p),
        ("GetMessageBody", [c_void_p], c_char_p),
        ("GetMessageId", [c_void_p], c_char_p),
        ("GetMessageProperty", [c_void_p, c_char_p], c_char_p),
        ("GetMessageQueueId", [c_void_p], c_int),
        ("GetMessageQueueOffset", [c_void_p], ctypes.c_longlong),
        ("GetMessageCommitLogOffset", [c_void_p], ctypes.c_longlong),
        ("GetMessagePreparedTransactionOffset", [c_void_p], ctypes.c_longlong),
    ]  # fmt: skip
    for name, argtypes, restype in declare:
        function = getattr(lib, name)
        function.argtypes = argtypes
        function.restype = restype
    return lib


def guarded(what: str, body: Callable[[int], int]) -> Any:
    """A C transaction callback running ``body(message)``: an exception is printed and
    answered UNKNOWN (escaping the ctypes callback, it would return 0 = commit)."""

    def callback(_producer: int | None, message: int | None, _data: int | None) -> int:
        try:
            return body(message or 0)
        except BaseException as exc:
            emit("callback_error", callback=what, error=repr(exc),
                 traceback=traceback.format_exc())  # fmt: skip
            return UNKNOWN

    return TRANSACTION_CALLBACK(callback)


class Transactional:
    """One client-cpp 2.1 transactional producer of ``group`` answering checks from ``plan``."""

    def __init__(self, namesrv: str, group: str, plan: dict[str, Any], log_level: int) -> None:
        self.lib = lib = bind_transactions()
        self.plan = plan
        self.items: dict[str, dict[str, Any]] = {item["key"]: item for item in plan["messages"]}
        self.checks: dict[str, int] = {}
        self._lock = threading.Lock()
        # The callbacks must outlive the producer: keep them here.
        self.checker = guarded("checker", self._check)
        self.executor = guarded("executor", self._execute)
        self.handle = lib.CreateTransactionProducer(group.encode(), self.checker, None)
        if not self.handle:
            raise RuntimeError(f"CreateTransactionProducer: {self.error()}")
        self._ok("SetProducerNameServerAddress",
                 lib.SetProducerNameServerAddress(self.handle, namesrv.encode()))  # fmt: skip
        self._ok("SetProducerSendMsgTimeout", lib.SetProducerSendMsgTimeout(self.handle, 10_000))
        if log_level:
            self._ok("SetProducerLogLevel", lib.SetProducerLogLevel(self.handle, log_level))

    def error(self) -> str:
        return _text(self.lib.GetLatestErrorMessage())

    def _ok(self, what: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{what} returned {rc}: {self.error()}")

    def start(self) -> None:
        self._ok("StartProducer", self.lib.StartProducer(self.handle))

    def shutdown(self) -> None:
        self._ok("ShutdownProducer", self.lib.ShutdownProducer(self.handle))

    def _execute(self, message: int) -> int:
        """The local transaction of the message being sent (on the sending thread)."""
        key = _text(self.lib.GetOriginMessageKeys(message))
        transaction_id = _text(self.lib.GetOriginMessageProperty(message, UNIQ_KEY))
        local = self.items[key]["local"]
        if local == "crash":
            emit("half_sent", key=key, transaction_id=transaction_id)
            sys.stdout.flush()
            os._exit(0)  # before the client can send END_TRANSACTION
        emit("executed", key=key, transaction_id=transaction_id, local=local)
        return STATUS[local]

    def _check(self, message: int) -> int:
        """A check-back from the broker (on the client's transaction thread pool)."""
        lib = self.lib
        key = _text(lib.GetMessageKeys(message))
        item = self.items.get(key)
        answer = item["check"] if item is not None else "unknown"
        with self._lock:
            times = self.checks[key] = self.checks.get(key, 0) + 1
        body: bytes = lib.GetMessageBody(message) or b""
        emit("checked", key=key, msg_id=_text(lib.GetMessageId(message)),
             transaction_id=_text(lib.GetMessageProperty(message, UNIQ_KEY)), times=times,
             answer=answer, known=item is not None, topic=_text(lib.GetMessageTopic(message)),
             tag=_text(lib.GetMessageTags(message)),
             pgroup=_text(lib.GetMessageProperty(message, b"PGROUP")),
             tran_msg=_text(lib.GetMessageProperty(message, b"TRAN_MSG")),
             queue_id=int(lib.GetMessageQueueId(message)),
             queue_offset=int(lib.GetMessageQueueOffset(message)),
             commit_log_offset=int(lib.GetMessageCommitLogOffset(message)),
             prepared_offset=int(lib.GetMessagePreparedTransactionOffset(message)),
             body_len=len(body), body_sha256=hashlib.sha256(body).hexdigest())  # fmt: skip
        return STATUS[answer]

    def send(self, item: dict[str, Any]) -> None:
        """``SendMessageTransaction`` of one plan message (its executor runs inside)."""
        lib = self.lib
        message = lib.CreateMessage(self.plan["topic"].encode())
        try:
            body = item["body"].encode()
            lib.SetMessageKeys(message, item["key"].encode())
            lib.SetMessageTags(message, item["tag"].encode())
            lib.SetByteMessageBody(message, body, len(body))
            result = CSendResult()
            rc = lib.SendMessageTransaction(self.handle, message, self.executor, None,
                                            ctypes.byref(result))  # fmt: skip
        finally:
            lib.DestroyMessage(message)
        fields: dict[str, Any] = {"error": self.error()} if rc != 0 else {}
        emit("sent", key=item["key"], tag=item["tag"], rc=int(rc), status=int(result.sendStatus),
             msg_id=_text(result.msgId), offset=int(result.offset), **fields)  # fmt: skip


def transact(namesrv: str, group: str, plan_path: str, *, send: bool, log_level: int,
             shutdown: bool) -> int:  # fmt: skip
    with open(plan_path, encoding="utf-8") as file:
        plan = json.load(file)
    producer = Transactional(namesrv, group, plan, log_level)
    producer.start()
    emit("started", group=group, mode="transact" if send else "checker")
    if send:
        for item in plan["messages"]:
            producer.send(item)
        emit("done")
    sys.stdin.read()  # until the test closes our standard input (checks keep coming)
    emit("stopping")
    if shutdown:
        producer.shutdown()
    emit("stopped", shutdown=shutdown)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=("produce", "consume", "stream", "transact", "checker"))
    parser.add_argument("--namesrv", required=True, help="HOST:PORT of the broker")
    parser.add_argument("--group", required=True)
    parser.add_argument("--plan", help="produce, transact, checker: the JSON message plan")
    parser.add_argument("--topic", help="consume, stream: the topic")
    parser.add_argument("--prefix", default="k", help="stream: key prefix")
    parser.add_argument("--count", type=int, default=100, help="stream: messages at most")
    parser.add_argument("--pace-ms", type=int, default=100, help="stream: pause between keys")
    parser.add_argument(
        "--retry-pause-ms", type=int, default=200, help="stream: pause before a retry"
    )
    parser.add_argument(
        "--retry-for-ms", type=int, default=120_000, help="stream: retry one key this long"
    )
    parser.add_argument(
        "--send-timeout-ms", type=int, default=3000, help="stream: the client's send timeout"
    )
    parser.add_argument(
        "--renew-after", type=int, default=0,
        help="stream: replace the producer by a new one (a new client instance, which fetches "
        "the route at once) after this many failed attempts (0: never)",
    )  # fmt: skip
    parser.add_argument("--expression", default="*", help="consume: tag expression")
    parser.add_argument("--fail-key", default="", help="consume: key to fail once")
    parser.add_argument(
        "--skip-shutdown",
        action="store_true",
        help="consume, transact, checker: exit without shutdown() (client-cpp 2.1 crashes in "
        "the push consumer's with a SIGSEGV in "
        "DefaultMQPushConsumerImpl::shutdownMessageTraceInnerProducer)",
    )
    parser.add_argument(
        "--log-level", type=int, default=0,
        help="transact, checker: the client's log level (1 = FATAL .. 6 = TRACE)",
    )  # fmt: skip
    parser.add_argument("--access-key", help="produce, consume: ACL account to sign with")
    parser.add_argument("--secret-key", help="produce, consume: its secret")
    parser.add_argument("--channel", default="ALIYUN", help="produce, consume: OnsChannel")
    args = parser.parse_args()
    credentials: Credentials = None
    if args.access_key is not None:
        credentials = (args.access_key, args.secret_key or "", args.channel)
    if args.mode == "produce":
        code = produce(args.namesrv, args.group, args.plan, credentials)
    elif args.mode == "stream":
        code = stream(args.namesrv, args.group, args)
    elif args.mode in ("transact", "checker"):
        code = transact(args.namesrv, args.group, args.plan, send=args.mode == "transact",
                        log_level=args.log_level, shutdown=not args.skip_shutdown)  # fmt: skip
    else:
        code = consume(args.namesrv, args.group, args.topic, args.expression, args.fail_key,
                       shutdown=not args.skip_shutdown, credentials=credentials)  # fmt: skip
    sys.stdout.flush()
    # The 2.1 client's destructors can crash at interpreter exit: leave without running them.
    os._exit(code)


if __name__ == "__main__":
    main()
