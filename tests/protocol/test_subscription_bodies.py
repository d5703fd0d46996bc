"""Subscription-group bodies: RocketMQ's JSON names and defaults, fields trimq does not
interpret kept, and the wrapper (``subscriptionGroup.json``, GET_ALL_SUBSCRIPTIONGROUP_CONFIG)."""

from __future__ import annotations

import json

import pytest

from protocol.bodies.broker import DataVersion
from protocol.bodies.subscription import SubscriptionGroupConfig, SubscriptionGroupWrapper
from protocol.errors import FieldError

#: A configuration as a RocketMQ 5 broker writes it (fastjson, getters in alphabetical order),
#: with the fields trimq keeps without interpreting, and one it does not know at all.
JAVA_CONFIG = b"""{"attributes":{"k":"v"},"brokerId":0,"consumeBroadcastEnable":false,
"consumeEnable":true,"consumeFromMinEnable":false,"consumeMessageOrderly":true,
"consumeTimeoutMinute":15,"groupName":"orders","groupRetryPolicy":{"type":"CUSTOMIZED",
"customizedRetryPolicy":{"next":[1000,5000]}},"groupSysFlag":0,
"notifyConsumerIdsChangedEnable":true,"retryMaxTimes":3,"retryQueueNums":1,
"subscriptionDataSet":[{"topic":"T","expType":"TAG","expression":"*"}],
"whichBrokerWhenConsumeSlowly":1,"someFutureField":[1,2]}"""


def test_java_config_decodes_with_rocketmq_names() -> None:
    config = SubscriptionGroupConfig.from_json(JAVA_CONFIG)
    assert config.group_name == "orders"
    assert config.consume_message_orderly is True
    assert config.retry_max_times == 3
    assert config.consume_broadcast_enable is False and config.consume_from_min_enable is False
    assert config.consume_enable is True and config.notify_consumer_ids_changed_enable is True
    assert (config.retry_queue_nums, config.broker_id, config.which_broker_when_consume_slowly,
            config.group_sys_flag, config.consume_timeout_minute) == (1, 0, 1, 0, 15)  # fmt: skip
    assert config.attributes == {"k": "v"}
    assert set(config.extra) == {"groupRetryPolicy", "subscriptionDataSet", "someFutureField"}


def test_round_trip_keeps_every_field() -> None:
    """Decoding and encoding again loses nothing, uninterpreted fields included."""
    config = SubscriptionGroupConfig.from_json(JAVA_CONFIG)
    assert json.loads(config.to_json()) == json.loads(JAVA_CONFIG)
    assert SubscriptionGroupConfig.from_json(config.to_json()) == config


def test_defaults_are_rocketmq_s() -> None:
    """Only ``groupName`` is required; the rest keeps ``SubscriptionGroupConfig.java``'s
    defaults (``null`` counts as absent)."""
    config = SubscriptionGroupConfig.from_json(b'{"groupName":"g","retryMaxTimes":null}')
    assert config == SubscriptionGroupConfig("g")
    assert json.loads(config.to_json()) == {
        "groupName": "g",
        "consumeEnable": True,
        "consumeFromMinEnable": True,
        "consumeBroadcastEnable": True,
        "consumeMessageOrderly": False,
        "retryQueueNums": 1,
        "retryMaxTimes": 16,
        "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1,
        "notifyConsumerIdsChangedEnable": True,
        "groupSysFlag": 0,
        "consumeTimeoutMinute": 15,
        "attributes": {},
    }


def test_fastjson_leniency() -> None:
    """Numbers as strings and booleans as "true" are read as Java reads them."""
    text = b'{"groupName":"g","consumeMessageOrderly":"true","retryMaxTimes":"2"}'
    config = SubscriptionGroupConfig.from_json(text)
    assert config.consume_message_orderly is True and config.retry_max_times == 2


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (b'{"retryMaxTimes":1}', "groupName"),
        (b'{"groupName":"g","retryMaxTimes":"many"}', "retryMaxTimes"),
        (b'{"groupName":"g","retryMaxTimes":4294967296}', "retryMaxTimes"),
        (b'{"groupName":"g","consumeMessageOrderly":"maybe"}', "consumeMessageOrderly"),
        (b'{"groupName":"g","attributes":{"k":1}}', "attributes[k]"),
        (b"[]", "$"),
    ],
)
def test_malformed_configs_name_the_field(text: bytes, field: str) -> None:
    with pytest.raises(FieldError) as exc:
        SubscriptionGroupConfig.from_json(text)
    assert exc.value.field == field


def test_wrapper_round_trip() -> None:
    wrapper = SubscriptionGroupWrapper(
        {
            "a": SubscriptionGroupConfig("a", consume_message_orderly=True),
            "b": SubscriptionGroupConfig("b", retry_max_times=0),
        },
        {"a": {"T": 1}},
        DataVersion(timestamp=1700000000000, counter=3),
    )
    doc = json.loads(wrapper.to_json())
    assert set(doc) == {"subscriptionGroupTable", "forbiddenTable", "dataVersion"}
    assert doc["subscriptionGroupTable"]["a"]["consumeMessageOrderly"] is True
    assert doc["dataVersion"] == {"counter": 3, "stateVersion": 0, "timestamp": 1700000000000}
    assert SubscriptionGroupWrapper.from_json(wrapper.to_json()) == wrapper


def test_wrapper_from_a_rocketmq_4_file() -> None:
    """4.x wrote no ``forbiddenTable``; a Java ``AtomicLong`` counter is a number."""
    text = (
        b'{"dataVersion":{"counter":7,"timestamp":1},"subscriptionGroupTable":{"g":'
        + JAVA_CONFIG.replace(b'"orders"', b'"g"')
        + b"}}"
    )
    wrapper = SubscriptionGroupWrapper.from_json(text)
    assert list(wrapper.subscription_group_table) == ["g"]
    assert wrapper.forbidden_table == {} and wrapper.data_version.counter == 7
    with pytest.raises(FieldError) as exc:
        SubscriptionGroupWrapper.from_json(b'{"forbiddenTable":{"g":{"T":"x"}}}')
    assert exc.value.field == "forbiddenTable[g][T]"
