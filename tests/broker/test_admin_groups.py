"""Subscription-group administration over Remoting: UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
GET_SUBSCRIPTIONGROUP_CONFIG (352), GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) and
DELETE_SUBSCRIPTIONGROUP (207) against a real broker over TCP, the table surviving a restart,
and the group's ``retryMaxTimes`` bounding redeliveries (pop revive and send-back) instead of
the broker's ``max_reconsume_times``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio
import trio.testing

from protocol.bodies.subscription import SubscriptionGroupConfig, SubscriptionGroupWrapper
from protocol.codes import RequestCode, ResponseCode
from protocol.command import RemotingCommand
from protocol.headers.admin import (
    DeleteSubscriptionGroupRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
)
from protocol.headers.send import ConsumerSendMsgBackRequestHeader
from tests.broker.client import BrokerClient, open_broker, open_client
from tests.broker.memory import open_memory_broker
from tests.broker.pop_client import pop
from tests.broker.test_pop import create_topic
from tests.broker.test_sendback import messages
from tests.broker.test_timers import send

pytestmark = pytest.mark.integration

TIMEOUT = 10
GROUP = "OrdersGroup"


async def update(client: BrokerClient, body: bytes) -> RemotingCommand:
    return await client.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, body)


async def get(client: BrokerClient, group: str) -> RemotingCommand:
    ext = GetSubscriptionGroupConfigRequestHeader(group=group).to_ext()
    return await client.call(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, ext)


async def get_all(client: BrokerClient) -> SubscriptionGroupWrapper:
    reply = await client.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {})
    assert reply.code == ResponseCode.SUCCESS, reply.remark
    return SubscriptionGroupWrapper.from_json(reply.body)


async def delete(client: BrokerClient, group: str, *, clean_offset: bool = False) -> None:
    ext = DeleteSubscriptionGroupRequestHeader(group_name=group, clean_offset=clean_offset)
    reply = await client.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, ext.to_ext())
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def test_create_get_list_delete_and_restart(tmp_path: Path) -> None:
    """A configuration as mqadmin sends it is served back, listed, kept across a restart
    (with what trimq does not interpret) and deleted."""
    body = json.dumps({
        "groupName": GROUP, "consumeMessageOrderly": True, "retryMaxTimes": 3,
        "consumeBroadcastEnable": False, "consumeFromMinEnable": False,
        "groupRetryPolicy": {"type": "CUSTOMIZED"},
    }).encode()  # fmt: skip
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            assert (await update(client, body)).code == ResponseCode.SUCCESS
            reply = await get(client, GROUP)
            assert reply.code == ResponseCode.SUCCESS, reply.remark
            served = SubscriptionGroupConfig.from_json(reply.body)
            assert served.consume_message_orderly and served.retry_max_times == 3
            assert served.extra == {"groupRetryPolicy": {"type": "CUSTOMIZED"}}
            assert handle.broker.groups.orderly(GROUP)
            table = await get_all(client)
            assert table.subscription_group_table == {GROUP: served}
            assert table.data_version.counter == 1
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            assert SubscriptionGroupConfig.from_json((await get(client, GROUP)).body) == served
            await delete(client, GROUP)
            reply = await get(client, GROUP)
            assert reply.code == ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, reply.remark
            assert (await get_all(client)).subscription_group_table == {}
            await delete(client, GROUP)  # a missing group is no error (RocketMQ's answer)
            assert not handle.broker.groups.orderly(GROUP)
        async with open_broker(tmp_path) as handle:
            assert handle.broker.groups.names() == []


async def test_delete_with_clean_offset_removes_the_committed_offsets(tmp_path: Path) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            offsets = handle.broker.store.offsets
            for group in (GROUP, "Other"):
                offsets.commit(group, "T", 0, 5)
                body = SubscriptionGroupConfig(group).to_json()
                assert (await update(client, body)).code == ResponseCode.SUCCESS
            await delete(client, "Other")  # without cleanOffset: the offsets stay
            assert offsets.query("Other", "T", 0) == 5
            await delete(client, GROUP, clean_offset=True)
            assert offsets.query(GROUP, "T", 0) is None
            assert offsets.query("Other", "T", 0) == 5


@pytest.mark.parametrize(
    ("body", "code", "remark"),
    [
        (b"", ResponseCode.INVALID_PARAMETER, "no subscription group configuration"),
        (b'{"groupName":"bad group"}', ResponseCode.INVALID_PARAMETER, "illegal character"),
        (b'{"retryMaxTimes":1}', ResponseCode.INVALID_PARAMETER, "groupName"),
        (b'{"groupName":"g","retryMaxTimes":-1}', ResponseCode.INVALID_PARAMETER, "negative"),
        (b"not json", ResponseCode.INVALID_PARAMETER, ""),
    ],
)
async def test_bad_configurations_are_refused(
    tmp_path: Path, body: bytes, code: ResponseCode, remark: str
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            reply = await update(client, body)
            assert reply.code == code, reply.remark
            assert remark in (reply.remark or "")
            assert handle.broker.groups.names() == []
            missing = await client.call(RequestCode.DELETE_SUBSCRIPTIONGROUP, {})
            assert missing.code == ResponseCode.INVALID_PARAMETER  # groupName is required


# ------------------------------------------------------------------ retryMaxTimes is honoured
async def test_pop_dead_letters_after_the_group_s_retry_max_times(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The broker allows 16 redeliveries; the group's configuration allows one: the second
    expired lease goes to ``%DLQ%group``. Another group keeps the broker's limit."""
    with trio.fail_after(15):
        async with open_memory_broker(tmp_path) as broker, broker.connect() as client:
            await create_topic(client, "T", queues=1)
            config = SubscriptionGroupConfig("g", retry_max_times=1).to_json()
            assert (await update(client, config)).code == ResponseCode.SUCCESS
            await send(client, "T", b"poison")
            for group in ("g", "other"):
                _, (_first,) = await pop(client, group, "T", invisible_ms=200)
                _, (again,) = await pop(client, group, "T", invisible_ms=200, poll_ms=3_000)
                assert again.msg.reconsume_times == 1
            for _ in range(300):  # bounded: the second expiry dead-letters g's copy
                if broker.statistics().core.pop.dead_lettered:
                    break
                await trio.sleep(0.01)
            assert broker.broker.store.get("%DLQ%g", 0, 0, 8).count == 1
            reply, rest = await pop(client, "g", "T", poll_ms=300)
            assert reply.code == ResponseCode.POLLING_TIMEOUT and rest == []
            # "other" has no configuration: its third delivery comes.
            _, (third,) = await pop(client, "other", "T", invisible_ms=200, poll_ms=3_000)
            assert third.msg.reconsume_times == 2
            assert broker.broker.store.get("%DLQ%other", 0, 0, 8).count == 0


async def test_send_back_uses_the_group_s_retry_max_times(tmp_path: Path) -> None:
    """A send-back that names no maximum (``maxReconsumeTimes`` absent or -1) is bounded by
    the group's ``retryMaxTimes``: with 0, the first failure is dead-lettered."""
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path) as handle, open_client(handle.port) as client:
            store = handle.broker.store
            config = SubscriptionGroupConfig("cg", retry_max_times=0).to_json()
            assert (await update(client, config)).code == ResponseCode.SUCCESS
            await send(client, "Orders", b"poison")
            (original,) = messages(store, "Orders")
            for limit in (None, -1):
                header = ConsumerSendMsgBackRequestHeader(
                    offset=original.commit_log_offset, group="cg", delay_level=0,
                    max_reconsume_times=limit,
                )  # fmt: skip
                reply = await client.call(RequestCode.CONSUMER_SEND_MSG_BACK, header.to_ext())
                assert reply.code == ResponseCode.SUCCESS, reply.remark
            assert [m.body for m in messages(store, "%DLQ%cg")] == [b"poison", b"poison"]
            assert messages(store, "%RETRY%cg") == []
