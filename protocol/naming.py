"""Topic and group names: RocketMQ's validation rules and its retry/DLQ naming schemes.

Validation mirrors ``TopicValidator`` (RocketMQ 5): names use only ``a-zA-Z0-9 % - _ |``,
topics are at most 127 characters, ``%RETRY%``/``%DLQ%`` topics at most 255, groups at most
120 (the room left so that ``%RETRY%group_topic`` stays under 255). One deliberate extension:
``+`` is accepted in exactly one place, as the separator of a pop retry V2 name
``%RETRY%group+topic`` (Java builds those internally and never validates them).

Pop retry names come from ``KeyBuilder``: V1 ``%RETRY%group_topic`` is not injective (RocketMQ
issue #9633), V2 ``%RETRY%group+topic`` is, because ``+`` is not a legal name character. The
V1 helpers at the end detect collisions and resolve a V1 name back to its owner, so the broker
can refuse a colliding subscription and wake only the owning group (#9632).
"""

from __future__ import annotations

import string
from collections.abc import Collection, Container, Iterable
from dataclasses import dataclass

from protocol.errors import IllegalNameError, RetryNameCollisionError

#: ``MixAll.RETRY_GROUP_TOPIC_PREFIX`` / ``DLQ_GROUP_TOPIC_PREFIX``.
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
#: ``KeyBuilder.POP_RETRY_SEPARATOR_V1`` / ``_V2``.
V1_SEPARATOR = "_"
V2_SEPARATOR = "+"
#: ``TopicValidator`` limits.
TOPIC_MAX_LENGTH = 127
RETRY_OR_DLQ_TOPIC_MAX_LENGTH = 255
GROUP_MAX_LENGTH = 120

#: ``TopicValidator.VALID_CHAR_BIT_MAP``: the regex ``^[%|a-zA-Z0-9_-]+$``.
LEGAL_CHARS = frozenset(string.ascii_letters + string.digits + "%-_|")
_ALLOWED_TEXT = "allowed: a-z A-Z 0-9 % - _ |"
_MAX_REPORTED = 5

#: ``TopicValidator.SYSTEM_TOPIC_PREFIX``: every ``rmq_sys_*`` topic is a system topic.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
#: ``TopicValidator.NOT_ALLOWED_SEND_TOPIC_SET`` (union of the 5.x variants).
NOT_ALLOWED_SEND_TOPICS = frozenset(
    {
        "SCHEDULE_TOPIC_XXXX",
        "RMQ_SYS_TRANS_HALF_TOPIC",
        "RMQ_SYS_TRANS_OP_HALF_TOPIC",
        "RMQ_SYS_ROCKSDB_TRANS_HALF_TOPIC",
        "RMQ_SYS_ROCKSDB_TRANS_OP_HALF_TOPIC",
        "TRANS_CHECK_MAX_TIME_TOPIC",
        "SELF_TEST_TOPIC",
        "OFFSET_MOVED_EVENT",
        "RMQ_SYS_TOPIC_CONFIG_SYNC",
        "RMQ_SYS_CONSUMER_OFFSET_SYNC",
        "RMQ_SYS_DELAY_OFFSET_SYNC",
        "RMQ_SYS_SUBSCRIPTION_GROUP_SYNC",
        "RMQ_SYS_MESSAGE_MODE_SYNC",
        "RMQ_SYS_TIMER_METRICS_SYNC",
    }
)
#: ``TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC``: the default topic a producer names when it
#: sends to a topic no name server knows; a broker that allows it creates the topic from it.
DEFAULT_TOPIC = "TBW102"
#: ``TopicValidator.SYSTEM_TOPIC_SET``: the not-sendable ones plus those clients may send to.
SYSTEM_TOPICS = NOT_ALLOWED_SEND_TOPICS | {
    DEFAULT_TOPIC,
    "BenchmarkTest",
    "RMQ_SYS_TRACE_TOPIC",
    "CHECKPOINT_TOPIC",
}


def _show(text: object) -> str:
    """``repr`` of ``text``, shortened so that error messages stay readable."""
    shown = repr(text)
    return shown if len(shown) <= 60 else shown[:57] + "..."


# ------------------------------------------------------------------ validation
def _illegal_message(kind: str, name: str, bad: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"{ch!r} at index {i}" for i, ch in bad[:_MAX_REPORTED])
    more = f" and {len(bad) - _MAX_REPORTED} more" if len(bad) > _MAX_REPORTED else ""
    noun = "an illegal character" if len(bad) == 1 else "illegal characters"
    return f"{kind} {_show(name)} has {noun} {shown}{more} ({_ALLOWED_TEXT})"


def _check_chars(kind: str, name: str, *, skip: int = -1) -> None:
    bad = [(i, ch) for i, ch in enumerate(name) if ch not in LEGAL_CHARS and i != skip]
    if not bad:
        return
    message = _illegal_message(kind, name, bad)
    plus_bad = any(ch == V2_SEPARATOR for _, ch in bad)
    if kind == "topic" and plus_bad and name.startswith(RETRY_PREFIX):
        message += "; '+' is legal only once, in a pop retry V2 name %RETRY%<group>+<topic>"
    raise IllegalNameError(message)


def _check_length(kind: str, name: str, limit: int) -> None:
    if len(name) > limit:
        raise IllegalNameError(
            f"{kind} {_show(name)} is {len(name)} characters long, over the limit of {limit}"
        )


def _check_plain(kind: str, name: str, limit: int) -> None:
    # Java's order: blank, then characters, then length (TopicValidator.validateTopic).
    if not name:
        raise IllegalNameError(f"{kind} name is empty")
    _check_chars(kind, name)
    _check_length(kind, name, limit)


def _v2_separator_index(name: str) -> int:
    """Index of the ``+`` of a name shaped like ``%RETRY%…+…`` with exactly one ``+``, else -1."""
    if name.startswith(RETRY_PREFIX) and name.count(V2_SEPARATOR) == 1:
        return name.index(V2_SEPARATOR)
    return -1


def validate_group(name: str) -> None:
    """Raise :class:`IllegalNameError` unless ``name`` is a legal consumer/producer group name."""
    _check_plain("group", name, GROUP_MAX_LENGTH)


def validate_topic(name: str) -> None:
    """Raise :class:`IllegalNameError` unless ``name`` is a legal topic name.

    ``%RETRY%``/``%DLQ%`` names may be 255 characters long; a ``+`` is accepted only as the
    separator of a well-formed pop retry V2 name, whose group and topic parts must then be a
    legal group and a legal plain topic.
    """
    if not name:
        raise IllegalNameError("topic name is empty")
    plus = _v2_separator_index(name)
    _check_chars("topic", name, skip=plus)
    if plus >= 0:
        _check_v2_parts(name, plus)
    retry_or_dlq = name.startswith((RETRY_PREFIX, DLQ_PREFIX))
    limit = RETRY_OR_DLQ_TOPIC_MAX_LENGTH if retry_or_dlq else TOPIC_MAX_LENGTH
    _check_length("retry/DLQ topic" if retry_or_dlq else "topic", name, limit)


def _check_v2_parts(name: str, plus: int) -> None:
    group, topic = name[len(RETRY_PREFIX) : plus], name[plus + 1 :]
    try:
        _check_plain("group part", group, GROUP_MAX_LENGTH)
        _check_plain("topic part", topic, TOPIC_MAX_LENGTH)
    except IllegalNameError as exc:
        raise IllegalNameError(f"pop retry V2 topic {_show(name)}: {exc.message}") from exc


def is_valid_topic(name: str) -> bool:
    """Whether :func:`validate_topic` accepts ``name``."""
    try:
        validate_topic(name)
    except IllegalNameError:
        return False
    return True


def is_valid_group(name: str) -> bool:
    """Whether :func:`validate_group` accepts ``name``."""
    try:
        validate_group(name)
    except IllegalNameError:
        return False
    return True


def is_system_topic(name: str, extra: Collection[str] = ()) -> bool:
    """``TopicValidator.isSystemTopic``; ``extra`` holds the names a broker adds at start-up
    (RocketMQ registers its cluster and broker names as system topics)."""
    return name in SYSTEM_TOPICS or name.startswith(SYSTEM_TOPIC_PREFIX) or name in extra


def is_send_allowed(name: str) -> bool:
    """Whether clients may send to ``name`` (not in ``NOT_ALLOWED_SEND_TOPIC_SET``)."""
    return name not in NOT_ALLOWED_SEND_TOPICS


#: System topics producers may still write: clients send message traces there.
TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"


def producer_may_send(name: str) -> bool:
    """Whether a producer may send to ``name`` — stricter than RocketMQ's set: no system
    topic of RocketMQ's not-allowed set, no ``rmq_sys_*``/``RMQ_SYS_*`` topic but the trace
    topic, not ``TBW102`` (a template: a send names it as its default topic), no ``%DLQ%``
    topic, and a ``%RETRY%`` name only as a classic ``%RETRY%<legal group>`` (Java and
    client-cpp fall back to sending there when a send-back fails). The broker's own services
    (timers, revive, transactions, dead-lettering) write their topics without this check."""
    if not is_send_allowed(name) or name == DEFAULT_TOPIC or name.startswith(DLQ_PREFIX):
        return False
    if name.upper().startswith("RMQ_SYS_"):
        return name == TRACE_TOPIC
    if name.startswith(RETRY_PREFIX):
        return is_valid_group(name[len(RETRY_PREFIX) :])
    return True


# ------------------------------------------------------------------ retry and DLQ names
def retry_topic(group: str) -> str:
    """The classic (push/pull) retry topic ``%RETRY%group`` (``MixAll.getRetryTopic``)."""
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic ``%DLQ%group`` (``MixAll.getDLQTopic``)."""
    return DLQ_PREFIX + group


def pop_retry_topic_v1(group: str, topic: str) -> str:
    """``%RETRY%group_topic`` (``KeyBuilder.buildPopRetryTopicV1``): not injective, see #9633."""
    return RETRY_PREFIX + group + V1_SEPARATOR + topic


def pop_retry_topic_v2(group: str, topic: str) -> str:
    """``%RETRY%group+topic`` (``KeyBuilder.buildPopRetryTopicV2``).

    Raises :class:`IllegalNameError` if either part contains ``+``: the name could not be
    split back (Java would build it and then fail to parse it).
    """
    if V2_SEPARATOR in group or V2_SEPARATOR in topic:
        raise IllegalNameError(f"'+' in group {_show(group)} or topic {_show(topic)}")
    return RETRY_PREFIX + group + V2_SEPARATOR + topic


def pop_retry_topic(group: str, topic: str, *, v2: bool) -> str:
    """``KeyBuilder.buildPopRetryTopic(topic, cid, enableRetryV2)``."""
    return pop_retry_topic_v2(group, topic) if v2 else pop_retry_topic_v1(group, topic)


def is_retry_topic(name: str) -> bool:
    """Whether ``name`` starts with ``%RETRY%`` (classic, pop V1 or pop V2)."""
    return name.startswith(RETRY_PREFIX)


def is_dlq_topic(name: str) -> bool:
    """Whether ``name`` starts with ``%DLQ%``."""
    return name.startswith(DLQ_PREFIX)


def is_pop_retry_topic_v2(name: str) -> bool:
    """``KeyBuilder.isPopRetryTopicV2``: a ``%RETRY%`` name containing ``+``."""
    return name.startswith(RETRY_PREFIX) and V2_SEPARATOR in name


def parse_pop_retry_topic_v2(name: str) -> tuple[str, str]:
    """Split ``%RETRY%group+topic`` into ``(group, topic)``.

    Stricter than ``KeyBuilder.parseGroup``/``parseNormalTopic``, which silently return the
    whole name when it has more than one ``+``: here that, and empty parts, are errors.
    """
    plus = _v2_separator_index(name)
    if plus < 0:
        raise IllegalNameError(f"{_show(name)} is not a pop retry V2 topic %RETRY%<group>+<topic>")
    group, topic = name[len(RETRY_PREFIX) : plus], name[plus + 1 :]
    if not group or not topic:
        raise IllegalNameError(f"pop retry V2 topic {_show(name)} has an empty group or topic")
    return group, topic


def parse_pop_retry_topic(name: str, group: str) -> str:
    """The original topic of ``group``'s pop retry topic ``name``, V1 or V2.

    Like ``KeyBuilder.parseNormalTopic(topic, cid)``: knowing the group makes V1 unambiguous.
    Raises :class:`IllegalNameError` when ``name`` is not a pop retry topic of ``group``
    (where Java would return a wrong substring or throw ``StringIndexOutOfBoundsException``).
    """
    for separator in (V2_SEPARATOR, V1_SEPARATOR):
        head = RETRY_PREFIX + group + separator
        if name.startswith(head) and len(name) > len(head):
            return name[len(head) :]
    raise IllegalNameError(f"{_show(name)} is not a pop retry topic of group {_show(group)}")


def group_of_classic_retry(name: str) -> str:
    """The group of a classic retry topic ``%RETRY%group``.

    A V1 pop retry name looks exactly like a classic one (``%RETRY%g_t`` could be group
    ``g_t``); callers that may see V1 names must resolve them first (:class:`V1RetryNames`).
    """
    if not name.startswith(RETRY_PREFIX) or len(name) == len(RETRY_PREFIX):
        raise IllegalNameError(f"{_show(name)} is not a classic retry topic %RETRY%<group>")
    if V2_SEPARATOR in name:
        raise IllegalNameError(f"{_show(name)} is a pop retry V2 topic, not a classic one")
    return name[len(RETRY_PREFIX) :]


def pop_retry_owner(name: str, origin_topic: str) -> tuple[str, str]:
    """``(group, topic)`` owning pop retry topic ``name`` given the message's ``ORIGIN_TOPIC``.

    The suffix ``_origin``/``+origin`` fixes the split, so this is unambiguous even for
    colliding V1 names (it is what PR #9637 does, minus its crash on short names).
    """
    for separator in (V2_SEPARATOR, V1_SEPARATOR):
        tail = separator + origin_topic
        group = name[len(RETRY_PREFIX) : len(name) - len(tail)]
        well_formed = group and V2_SEPARATOR not in group and name.startswith(RETRY_PREFIX)
        if origin_topic and well_formed and name.endswith(tail):
            return group, origin_topic
    raise IllegalNameError(f"{_show(name)} is not a pop retry topic of topic {_show(origin_topic)}")


# ------------------------------------------------------------------ V1 collisions (#9633)
@dataclass(frozen=True, slots=True)
class V1Collision:
    """One V1 retry topic name claimed by several owners.

    ``pairs`` are the pop (group, topic) pairs; ``classic_group`` is set when a group's classic
    retry topic ``%RETRY%group`` is the same name (it would consume those retries too).
    """

    retry_topic: str
    pairs: frozenset[tuple[str, str]]
    classic_group: str | None = None


def find_v1_collisions(
    pairs: Iterable[tuple[str, str]], *, classic_groups: Iterable[str] = ()
) -> list[V1Collision]:
    """Every V1 name shared by two or more distinct owners, sorted by name.

    ``pairs`` are ``(group, topic)`` pairs consuming by pop; ``classic_groups`` optionally lists
    groups consuming their classic ``%RETRY%group`` topic, which V1 names can also hit.
    """
    owners: dict[str, set[tuple[str, str]]] = {}
    for group, topic in pairs:
        owners.setdefault(pop_retry_topic_v1(group, topic), set()).add((group, topic))
    classic = {retry_topic(group): group for group in classic_groups}
    return [
        V1Collision(name, frozenset(found), classic.get(name))
        for name, found in sorted(owners.items())
        if len(found) > 1 or name in classic
    ]


def v1_candidates(name: str, known_pairs: Container[tuple[str, str]]) -> list[tuple[str, str]]:
    """The ``(group, topic)`` pairs in ``known_pairs`` whose V1 retry topic is ``name``.

    Tries each ``_`` as the split point (the reviewers' suggestion on PR #9637) instead of
    rebuilding every known pair's name: O(number of ``_``) lookups with a set or dict. A name
    longer than a retry topic may be (255 characters) has no candidates: each lookup slices
    and hashes the whole name, so that bound also keeps the work small.
    """
    if not name.startswith(RETRY_PREFIX) or len(name) > RETRY_OR_DLQ_TOPIC_MAX_LENGTH:
        return []
    body = name[len(RETRY_PREFIX) :]
    splits = ((body[:i], body[i + 1 :]) for i, ch in enumerate(body) if ch == V1_SEPARATOR)
    return [pair for pair in splits if pair in known_pairs]


class V1RetryNames:
    """The V1 retry topic names in use, each owned by exactly one (group, topic) pair.

    The broker registers a pair when a group starts popping a topic with V1 retry names;
    a second pair that maps to the same name is refused with
    :class:`RetryNameCollisionError` instead of silently sharing the retry topic.
    """

    def __init__(self) -> None:
        self._owners: dict[str, tuple[str, str]] = {}
        self._classic: dict[str, str] = {}

    def register(self, group: str, topic: str) -> str:
        """Claim the V1 retry name of ``(group, topic)`` and return it (idempotent)."""
        name = pop_retry_topic_v1(group, topic)
        owner = self._owners.get(name)
        if owner is not None and owner != (group, topic):
            raise RetryNameCollisionError(
                f"V1 retry topic {name} of (group {group!r}, topic {topic!r}) is already used"
                f" by (group {owner[0]!r}, topic {owner[1]!r}); use retry topic V2"
            )
        if name in self._classic:
            raise RetryNameCollisionError(
                f"V1 retry topic {name} of (group {group!r}, topic {topic!r}) is the classic"
                f" retry topic of group {self._classic[name]!r}; use retry topic V2"
            )
        self._owners[name] = (group, topic)
        return name

    def reserve_classic(self, group: str) -> str:
        """Claim ``%RETRY%group`` for a classic consumer group (idempotent)."""
        name = retry_topic(group)
        owner = self._owners.get(name)
        if owner is not None:
            raise RetryNameCollisionError(
                f"classic retry topic {name} of group {group!r} is already the V1 retry topic"
                f" of (group {owner[0]!r}, topic {owner[1]!r})"
            )
        self._classic[name] = group
        return name

    def unregister(self, group: str, topic: str) -> None:
        """Release the V1 name of ``(group, topic)`` if that pair owns it."""
        name = pop_retry_topic_v1(group, topic)
        if self._owners.get(name) == (group, topic):
            del self._owners[name]

    def owner(self, name: str) -> tuple[str, str] | None:
        """The ``(group, topic)`` pair owning V1 retry topic ``name``, if registered."""
        return self._owners.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._owners

    def __len__(self) -> int:
        return len(self._owners)
