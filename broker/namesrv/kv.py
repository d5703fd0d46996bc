"""The name server's KV config (RocketMQ's ``KVConfigManager``), sans-IO.

Namespaces of string keys and values, set with PUT_KV_CONFIG and read with GET_KV_CONFIG /
GET_KVLIST_BY_NAMESPACE. Clients ask ``ORDER_TOPIC_CONFIG`` for a topic's order
configuration; an absent key or namespace is an ordinary outcome (``None``), which the
processors answer with QUERY_NOT_FOUND.

Persisted, when the name server has a path for it, as RocketMQ's ``kvConfig.json``
(``{"configTable":{"namespace":{"key":"value"}}}``); :meth:`KVConfig.to_json` and
:meth:`KVConfig.from_json` are the file format and the caller does the writing.
"""

from __future__ import annotations

from protocol.bodies._fields import Fields, as_text
from protocol.bodies._json import dumps, loads_lenient
from protocol.errors import FieldError, InvalidParameterError

#: Longest namespace, key or value accepted (a name server is not a blob store).
MAX_TEXT = 64 * 1024


def _check(kind: str, text: str) -> None:
    if not text and kind != "value":
        raise InvalidParameterError(f"KV {kind} is empty")
    if len(text) > MAX_TEXT:
        raise InvalidParameterError(f"KV {kind} is longer than {MAX_TEXT} characters")


class KVConfig:
    """Namespace → key → value."""

    def __init__(self) -> None:
        self._table: dict[str, dict[str, str]] = {}

    def put(self, namespace: str, key: str, value: str) -> None:
        """Set ``key`` in ``namespace``.

        Raises:
            InvalidParameterError: an empty namespace or key, or an oversized text.
        """
        _check("namespace", namespace)
        _check("key", key)
        _check("value", value)
        self._table.setdefault(namespace, {})[key] = value

    def get(self, namespace: str, key: str) -> str | None:
        """The value, or None."""
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> bool:
        """Remove ``key``; True if it existed. An emptied namespace goes too."""
        keys = self._table.get(namespace)
        if keys is None or keys.pop(key, None) is None:
            return False
        if not keys:
            del self._table[namespace]
        return True

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of every key of ``namespace``, or None when it has none."""
        keys = self._table.get(namespace)
        return dict(keys) if keys else None

    def to_json(self) -> bytes:
        """The ``kvConfig.json`` form."""
        return dumps({"configTable": self._table})

    @classmethod
    def from_json(cls, data: bytes) -> KVConfig:
        """Read the ``kvConfig.json`` form.

        Raises:
            FieldError: the file is not in that form.
        """
        kv = cls()
        for namespace, keys, at in Fields(loads_lenient(data)).entries("configTable"):
            if type(keys) is not dict:
                raise FieldError(f"{at}: not an object", field=at)
            for key, value in keys.items():
                kv._table.setdefault(namespace, {})[key] = as_text(value, f"{at}[{key}]")
        return kv
