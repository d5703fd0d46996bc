"""Admin bodies: broker runtime info, offset resets and the all-offsets dump.

* ``GET_BROKER_RUNTIME_INFO`` (28) answers :class:`KVTable` (``{"table":{"k":"v",…}}``, every
  value a string, as ``KVTable.java`` holds ``HashMap<String, String>``);
* ``INVOKE_BROKER_TO_RESET_OFFSET`` (222) answers :class:`ResetOffsetBody`, a Java
  ``Map<MessageQueue, Long>`` written by fastjson with queue objects as keys (see
  ``protocol.bodies.broker`` for that form);
* ``GET_ALL_CONSUMER_OFFSET`` (43) answers :class:`ConsumerOffsetSerializeWrapper`
  (``{"offsetTable":{"topic@group":{0:12}}}``, the shape of ``consumerOffset.json``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Self

from protocol.bodies._fields import INT32, Fields, JsonBody, as_int, as_text
from protocol.bodies._json import dumps_text
from protocol.bodies.broker import _queue_key
from protocol.bodies.consumer import MessageQueue
from protocol.errors import FieldError

#: ``TopicQueueMappingUtils``/``ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR``.
TOPIC_GROUP_SEPARATOR: Final = "@"


@dataclass(frozen=True, slots=True)
class KVTable(JsonBody):
    """A string-to-string table (``KVTable``): broker runtime info and similar."""

    table: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object; every value must be a string."""
        f = Fields(obj, path)
        return cls({key: as_text(value, at) for key, value, at in f.entries("table")})

    def to_obj(self) -> dict[str, object]:
        """The JSON object."""
        return {"table": dict(self.table)}


@dataclass(frozen=True, slots=True)
class ResetOffsetBody(JsonBody):
    """``ResetOffsetBody``: the offset each queue of a topic was reset to."""

    offset_table: Mapping[MessageQueue, int] = field(default_factory=dict)

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (queue keys as JSON text or ``toString()``)."""
        f = Fields(obj, path)
        return cls(
            {_queue_key(key, at): as_int(value, at) for key, value, at in f.entries("offsetTable")}
        )

    def to_obj(self) -> dict[str, object]:
        """The standard-JSON form (queue keys as JSON text)."""
        return {"offsetTable": {dumps_text(mq.to_obj()): v for mq, v in self.offset_table.items()}}

    def to_json(self, *, strict_json: bool = False) -> bytes:
        """fastjson's form (queue objects as keys), or standard JSON with ``strict_json``."""
        if strict_json:
            return JsonBody.to_json(self)
        entries = ",".join(
            f"{dumps_text(mq.to_obj())}:{offset}" for mq, offset in self.offset_table.items()
        )
        return f'{{"offsetTable":{{{entries}}}}}'.encode()


@dataclass(frozen=True, slots=True)
class ConsumerOffsetSerializeWrapper(JsonBody):
    """Every committed offset of a broker: ``(topic, group)`` → queue id → offset."""

    offset_table: Mapping[tuple[str, str], Mapping[int, int]] = field(default_factory=dict)

    @property
    def groups(self) -> set[str]:
        """Every group with a committed offset."""
        return {group for _, group in self.offset_table}

    @classmethod
    def from_obj(cls, obj: object, path: str = "") -> Self:
        """Build from a parsed JSON object (queue ids as bare or quoted keys)."""
        f = Fields(obj, path)
        table: dict[tuple[str, str], dict[int, int]] = {}
        for key, queues, at in f.entries("offsetTable"):
            topic, sep, group = key.rpartition(TOPIC_GROUP_SEPARATOR)
            if not sep or not topic or not group:
                raise FieldError(f"{at}: key is not topic@group", field=at)
            if type(queues) is not dict:
                raise FieldError(f"{at}: expected an object", field=at)
            table[(topic, group)] = {
                as_int(qid, f"{at}[{qid}]", INT32): as_int(offset, f"{at}[{qid}]")
                for qid, offset in queues.items()
            }
        return cls(table)

    def to_obj(self) -> dict[str, object]:
        """The JSON object, queue ids as quoted keys."""
        return {
            "offsetTable": {
                f"{topic}{TOPIC_GROUP_SEPARATOR}{group}": {str(q): o for q, o in queues.items()}
                for (topic, group), queues in self.offset_table.items()
            }
        }
