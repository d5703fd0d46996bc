"""Admin bodies: KVTable, ResetOffsetBody (fastjson queue keys) and the all-offsets dump."""

from __future__ import annotations

import pytest

from protocol.bodies.admin import ConsumerOffsetSerializeWrapper, KVTable, ResetOffsetBody
from protocol.bodies.consumer import MessageQueue
from protocol.errors import FieldError


def test_kv_table_round_trip() -> None:
    """``{"table":{…}}`` with string values, as KVTable.java writes it."""
    table = KVTable({"brokerVersionDesc": "trimq-0.1.0", "runtime": "[ 0 days ]"})
    assert (
        table.to_json() == b'{"table":{"brokerVersionDesc":"trimq-0.1.0","runtime":"[ 0 days ]"}}'
    )
    assert KVTable.from_json(table.to_json()) == table
    with pytest.raises(FieldError) as exc:
        KVTable.from_json(b'{"table":{"putTps":1.5}}')
    assert exc.value.field == "table[putTps]"


def test_reset_offset_body_fastjson_and_strict_forms() -> None:
    """Queue objects as keys (fastjson) and as JSON text (strict) both decode."""
    body = ResetOffsetBody({MessageQueue("T", "b", 0): 5, MessageQueue("T", "b", 1): 0})
    fastjson = body.to_json()
    assert fastjson.startswith(b'{"offsetTable":{{')
    assert ResetOffsetBody.from_json(fastjson) == body
    assert ResetOffsetBody.from_json(body.to_json(strict_json=True)) == body
    text = b'{"offsetTable":{"MessageQueue [topic=T, brokerName=b, queueId=0]":5}}'
    assert ResetOffsetBody.from_json(text).offset_table == {MessageQueue("T", "b", 0): 5}
    assert ResetOffsetBody.from_json(b'{"offsetTable":{}}') == ResetOffsetBody()


def test_consumer_offsets_bare_keys() -> None:
    """``consumerOffset.json``'s shape, with fastjson's bare queue-id keys."""
    dump = ConsumerOffsetSerializeWrapper.from_json(b'{"offsetTable":{"T@g":{0:12,1:3}}}')
    assert dump.offset_table == {("T", "g"): {0: 12, 1: 3}}
    assert dump.groups == {"g"}
    assert ConsumerOffsetSerializeWrapper.from_json(dump.to_json()) == dump
    for bad in (b'{"offsetTable":{"T":{}}}', b'{"offsetTable":{"T@g":[1]}}'):
        with pytest.raises(FieldError):
            ConsumerOffsetSerializeWrapper.from_json(bad)
