"""RocketMQ's tag-expression syntax, shared by the broker and the clients.

A subscription is an expression of a type: ``TAG`` (the default) is ``*`` for everything or
tags joined by ``||`` (Java's ``FilterAPI.buildSubscriptionData``); the broker filters on the
tags' Java ``String.hashCode`` values, as consume-queue entries carry them.
"""

from __future__ import annotations

from protocol.properties import java_string_hash

#: ``SubscriptionData.SUB_ALL``: the expression that matches every tag.
SUB_ALL = "*"
#: ``ExpressionType.TAG``.
EXPRESSION_TAG = "TAG"
#: The tag separator in a ``TAG`` expression.
TAG_SEPARATOR = "||"


def split_tags(expression: str | None) -> tuple[str, ...] | None:
    """The tags of a ``TAG`` expression, ``None`` for "every message".

    Tags are split on ``||`` and stripped; ``*`` or an empty expression matches everything.
    An expression with no tag at all (``"||"``) also matches everything here, where Java would
    match nothing: no client means that.
    """
    if expression is None or expression.strip() in ("", SUB_ALL):
        return None
    tags = tuple(tag.strip() for tag in expression.split(TAG_SEPARATOR) if tag.strip())
    return tags or None


def tag_codes(expression: str | None) -> frozenset[int] | None:
    """The tag-hash filter of a ``TAG`` expression, ``None`` for "every message"."""
    tags = split_tags(expression)
    return None if tags is None else frozenset(java_string_hash(tag) for tag in tags)
