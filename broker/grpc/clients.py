"""gRPC clients: their settings, the settings we answer, and their consumer memberships.

A v2 client announces itself with a ``Settings`` command on its Telemetry stream, keyed by its
``x-mq-client-id``; every later call carries that id. The answer (:func:`reply_settings`) is
what the proxy answers (``GrpcClientSettingsManager``), complete, because the clients break
without parts of it: the Python push consumer waits for it and applies it only with status
OK, a Node producer crashes without an exponential back-off policy, a producer refuses every
send when ``max_body_size`` is 0.

Consumers join their group in the broker's :class:`~broker.core.clients.ClientRegistry` as pop
consumers (channel: the client id), from their settings or heartbeats, and leave on
NotifyClientTermination or when their Telemetry stream ends — the stream lives as long as the
client does (the Python client gives it a one-year deadline, Node none).

Whether a group consumes in order is the group's configuration, as in the proxy
(``subscription.fifo = consumeMessageOrderly``, set with ``trimq-admin updateSubGroup -o
true``), never the client's own settings: no official client sets ``fifo`` there, and one
that did could turn a group's consumption orderly for every other member. Likewise the
consumer's ``max_attempts`` is the group's ``retryMaxTimes`` + 1.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from broker.core.clients import (
    ClientRegistry,
    ConsumerRegistration,
    ConsumeType,
    MessageModel,
    Subscription,
    TransactionCheck,
)
from broker.core.offsets import OffsetReset
from broker.groups import SubscriptionGroupManager
from broker.grpc.server import Call
from protocol.errors import RecordError
from protocol.grpc import schema
from protocol.grpc.convert import encode_transaction_id, set_duration, to_message
from protocol.message import decode_record

#: The proxy's producer back-off: 3 attempts, 10 ms doubling up to 1 s.
PRODUCER_MAX_ATTEMPTS: Final = 3
#: The proxy's consumer back-off between redeliveries (``CustomizedRetryPolicy``), seconds.
CONSUMER_BACKOFF_S: Final = (
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
)  # fmt: skip
RECEIVE_BATCH_SIZE: Final = 32
LONG_POLLING_TIMEOUT_MS: Final = 20_000
_CONSUMERS: Final = frozenset(
    {
        schema.ClientType.PUSH_CONSUMER,
        schema.ClientType.SIMPLE_CONSUMER,
        schema.ClientType.PULL_CONSUMER,
    }
)


@dataclass(frozen=True, slots=True)
class _Channel:
    """A gRPC client as the client registry sees it: its id. The registry's notifications
    (membership changes, offset resets) are Remoting rebalance signals; pop consumers have
    nothing to rebalance, so they are not sent. Transaction checks go to the client's
    Telemetry stream (``recover``)."""

    client_id: str
    recover: Callable[[str, TransactionCheck], bool] = field(compare=False)

    @property
    def channel_id(self) -> Hashable:
        return ("grpc", self.client_id)

    def notify_consumer_ids_changed(self, group: str) -> bool:
        return False

    def notify_reset_offset(self, reset: OffsetReset, offsets: Mapping[int, int]) -> bool:
        return False

    def check_transaction_state(self, check: TransactionCheck) -> bool:
        return self.recover(self.client_id, check)


@dataclass(slots=True)
class Session:
    """What we know of one client id."""

    client_id: str
    client_type: int = schema.ClientType.CLIENT_TYPE_UNSPECIFIED
    group: str | None = None
    subscriptions: tuple[Subscription, ...] = ()
    #: The Telemetry call the settings came on: the client is gone when it ends.
    telemetry: object | None = None


class GrpcClients:
    """Sessions by client id, and their registration in the broker's client registry."""

    def __init__(
        self,
        registry: ClientRegistry,
        groups: SubscriptionGroupManager,
        release: Callable[[str], object],
        *,
        max_message_size: int,
    ) -> None:
        """``groups``: the subscription-group configurations (FIFO, retry limit);
        ``release``: what a client that goes away kept invisible comes back (the pop
        service's auto-renewed leases)."""
        self._registry = registry
        self._groups = groups
        self._release = release
        self._max_message_size = max_message_size
        self._sessions: dict[str, Session] = {}

    def fifo(self, group: str) -> bool:
        """Whether ``group`` consumes in order: its configuration's
        ``consumeMessageOrderly``."""
        return self._groups.orderly(group)

    def max_attempts(self, group: str) -> int:
        """A consumer's deliveries of a message before it goes to the DLQ: the group's
        ``retryMaxTimes`` + 1."""
        return self._groups.retry_max_times(group) + 1

    def apply_settings(self, client_id: str, settings: Any, telemetry: object) -> Any:
        """Remember a client's settings (registering a consumer in its group) and return the
        settings to answer it with.

        Raises:
            ValueError: settings with neither publishing nor subscription (the proxy answers
                INVALID_ARGUMENT).
            IllegalNameError: the consumer group's name is illegal.
        """
        kind = settings.WhichOneof("pub_sub")
        if kind is None:
            raise ValueError("settings carry neither publishing nor subscription")
        session = self._sessions.get(client_id) or Session(client_id)
        session.client_type = settings.client_type
        session.telemetry = telemetry
        if kind == "subscription":
            sub = settings.subscription
            session.group = sub.group.name
            session.subscriptions = tuple(
                Subscription(e.topic.name, e.expression.expression or "*", _expression_type(e))
                for e in sub.subscriptions
            )
            self._register(session)
        else:
            # The proxy's rule: a gRPC producer checks transactions for its topics (the
            # producer group of a gRPC half message is its topic).
            topics = [topic.name for topic in settings.publishing.topics]
            self._registry.heartbeat(_Channel(client_id, self._recover), client_id, topics, ())
        self._sessions[client_id] = session
        return self.reply_settings(settings, session)

    def heartbeat(self, client_id: str, group: str | None) -> bool:
        """A heartbeat: refresh the consumer's membership. False when the client never sent
        settings (the proxy answers UNRECOGNIZED_CLIENT_TYPE; clients only log it)."""
        session = self._sessions.get(client_id)
        if session is None:
            return False
        if group and session.group == group:
            self._register(session)
        return True

    def terminate(self, client_id: str) -> None:
        """NotifyClientTermination: the client leaves its group and is forgotten."""
        session = self._sessions.pop(client_id, None)
        self._release(client_id)
        if session is not None:
            self._registry.channel_closed(_Channel(client_id, self._recover))

    def telemetry_ended(self, client_id: str, telemetry: object) -> None:
        """The client's Telemetry stream ended: it is gone (unless a newer stream took over)."""
        session = self._sessions.get(client_id)
        if session is not None and session.telemetry is telemetry:
            self.terminate(client_id)

    def _recover(self, client_id: str, check: TransactionCheck) -> bool:
        """Ask a producer about a half message: a ``recover_orphaned_transaction_command``
        on its Telemetry stream; it answers with EndTransaction (source SERVER_CHECK)."""
        session = self._sessions.get(client_id)
        call = session.telemetry if session is not None else None
        if not isinstance(call, Call):
            return False
        try:
            msg, _ = decode_record(check.record)
        except RecordError:
            return False
        command = schema.TelemetryCommand()
        recover = command.recover_orphaned_transaction_command
        to_message(msg, out=recover.message)
        recover.transaction_id = encode_transaction_id(check.commit_offset, check.queue_offset)
        return call.push_nowait(command.SerializeToString())

    def _register(self, session: Session) -> None:
        if session.group is None or session.client_type not in _CONSUMERS:
            return
        registration = ConsumerRegistration(
            session.group,
            session.subscriptions,
            MessageModel.CLUSTERING,
            ConsumeType.CONSUME_POP,
        )
        self._registry.heartbeat(
            _Channel(session.client_id, self._recover), session.client_id, (), [registration]
        )

    # ------------------------------------------------------------------ the answer
    def reply_settings(self, settings: Any, session: Session) -> Any:
        """The complete settings a client is answered with (the proxy's merge)."""
        out = schema.Settings()
        out.CopyFrom(settings)
        if settings.WhichOneof("pub_sub") == "publishing":
            policy = out.backoff_policy
            policy.Clear()
            policy.max_attempts = PRODUCER_MAX_ATTEMPTS
            backoff = policy.exponential_backoff
            set_duration(backoff.initial, 10)
            set_duration(backoff.max, 1000)
            backoff.multiplier = 2.0
            out.publishing.max_body_size = self._max_message_size
            out.publishing.validate_message_type = True
        else:
            sub = out.subscription
            group = sub.group.name
            sub.fifo = self.fifo(group)
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            set_duration(sub.long_polling_timeout, LONG_POLLING_TIMEOUT_MS)
            policy = out.backoff_policy
            policy.Clear()
            policy.max_attempts = self.max_attempts(group)
            for seconds in CONSUMER_BACKOFF_S:
                set_duration(policy.customized_backoff.next.add(), seconds * 1000)
        out.metric.on = False
        return out


def _expression_type(entry: Any) -> str:
    return "SQL92" if entry.expression.type == schema.FilterType.SQL else "TAG"
