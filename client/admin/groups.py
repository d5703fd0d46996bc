"""Subscription-group commands: ``updateSubGroup``, ``deleteSubGroup`` and ``subGroupList``
(mqadmin's ``tools/command/consumer`` group commands).

``updateSubGroup`` changes only what its options name: it reads the broker's current
configuration of the group (GET_SUBSCRIPTIONGROUP_CONFIG, 352) and sends it back with the
options applied (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, 200). mqadmin instead sends a fresh
configuration, so ``mqadmin updateSubGroup -g G -r 3`` also turns an orderly group back to
concurrent; here ``-r 3`` leaves ``-o`` alone. A group the broker does not know starts from
RocketMQ's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from client.admin.output import Result, table
from client.admin.session import Admin, AdminError, BrokerRef
from protocol.bodies.subscription import SubscriptionGroupConfig, SubscriptionGroupWrapper
from protocol.codes import RequestCode, ResponseCode
from protocol.errors import for_code
from protocol.headers.admin import (
    DeleteSubscriptionGroupRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
)

#: Answers to GET_SUBSCRIPTIONGROUP_CONFIG that mean "no configuration here": trimq's
#: SUBSCRIPTION_GROUP_NOT_EXIST, RocketMQ's SYSTEM_ERROR ("No group in this broker"), and a
#: broker that does not serve the code.
_NO_CONFIG = (
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
    ResponseCode.SYSTEM_ERROR,
    ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
)
#: ``updateSubGroup`` options → configuration fields.
_OPTIONS = {
    "consumeMessageOrderly": "consume_message_orderly",
    "retryMaxTimes": "retry_max_times",
    "retryQueueNums": "retry_queue_nums",
    "consumeEnable": "consume_enable",
    "consumeFromMinEnable": "consume_from_min_enable",
    "consumeBroadcastEnable": "consume_broadcast_enable",
    "notifyConsumerIdsChanged": "notify_consumer_ids_changed_enable",
    "brokerId": "broker_id",
    "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
}


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, not {text!r}")


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, not {value}")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the subscription-group commands to the CLI."""
    p = sub.add_parser("updateSubGroup", help="create or update a subscription group")
    p.add_argument("-g", "--groupName", required=True)
    p.add_argument("-b", "--brokerAddr", help="one broker (wins over -c)")
    p.add_argument("-c", "--clusterName", help="every broker of a cluster (default: all)")
    p.add_argument("-o", "--consumeMessageOrderly", type=_bool, metavar="true|false",
                   help="consume in order (FIFO)")  # fmt: skip
    p.add_argument("-r", "--retryMaxTimes", type=_count, metavar="N",
                   help="redeliveries before the DLQ")  # fmt: skip
    p.add_argument("-q", "--retryQueueNums", type=_count, metavar="N")
    switches = (
        ("-s", "--consumeEnable"),
        ("-m", "--consumeFromMinEnable"),
        ("-d", "--consumeBroadcastEnable"),
        ("-a", "--notifyConsumerIdsChanged"),
    )
    for short, name in switches:
        p.add_argument(short, name, type=_bool, metavar="true|false")
    p.add_argument("-i", "--brokerId", type=_count, metavar="ID")
    p.add_argument("-w", "--whichBrokerWhenConsumeSlowly", type=_count, metavar="ID")
    p.set_defaults(run=update_sub_group)

    p = sub.add_parser("deleteSubGroup", help="delete a subscription group's configuration")
    p.add_argument("-g", "--groupName", required=True)
    p.add_argument("-b", "--brokerAddr", help="one broker (wins over -c)")
    p.add_argument("-c", "--clusterName", help="every broker of a cluster (default: all)")
    p.add_argument("-r", "--removeOffset", type=_bool, default=False, metavar="true|false",
                   help="also remove the group's committed offsets")  # fmt: skip
    p.set_defaults(run=delete_sub_group)

    p = sub.add_parser("subGroupList", help="every subscription group's configuration")
    p.add_argument("-b", "--brokerAddr", help="one broker (wins over -c)")
    p.add_argument("-c", "--clusterName", help="every broker of a cluster (default: all)")
    p.set_defaults(run=sub_group_list)


async def _targets(admin: Admin, broker: str | None, cluster: str | None) -> list[BrokerRef]:
    """``-b`` wins over ``-c``; neither means every broker the name servers know."""
    if broker:
        return [await admin.resolve(broker)]
    refs = await admin.brokers(cluster)
    if not refs:
        raise AdminError("no broker is registered with the name server")
    return refs


def group_config_text(c: SubscriptionGroupConfig) -> str:
    """``SubscriptionGroupConfig.toString()`` (its main fields)."""
    return (
        f"SubscriptionGroupConfig [groupName={c.group_name}, "
        f"consumeEnable={str(c.consume_enable).lower()}, "
        f"consumeFromMinEnable={str(c.consume_from_min_enable).lower()}, "
        f"consumeBroadcastEnable={str(c.consume_broadcast_enable).lower()}, "
        f"consumeMessageOrderly={str(c.consume_message_orderly).lower()}, "
        f"retryQueueNums={c.retry_queue_nums}, retryMaxTimes={c.retry_max_times}, "
        f"brokerId={c.broker_id}, "
        f"whichBrokerWhenConsumeSlowly={c.which_broker_when_consume_slowly}, "
        f"notifyConsumerIdsChangedEnable={str(c.notify_consumer_ids_changed_enable).lower()}, "
        f"groupSysFlag={c.group_sys_flag}, consumeTimeoutMinute={c.consume_timeout_minute}]"
    )


async def current_config(admin: Admin, address: str, group: str) -> SubscriptionGroupConfig:
    """The broker's configuration of ``group``, or RocketMQ's defaults when it has none.

    Raises:
        AdminError: unreachable broker.
        BrokerError: the broker answered another error.
    """
    ext = GetSubscriptionGroupConfigRequestHeader(group=group).to_ext()
    reply = await admin.invoke(
        address, admin.request(RequestCode.GET_SUBSCRIPTIONGROUP_CONFIG, ext)
    )
    if reply.code in _NO_CONFIG:
        return SubscriptionGroupConfig(group)
    if reply.code != ResponseCode.SUCCESS:
        raise for_code(reply.code, reply.remark)
    return SubscriptionGroupConfig.from_json(reply.body)


async def update_sub_group(admin: Admin, args: argparse.Namespace) -> Result:
    """Apply the given options to the group's configuration on the chosen brokers."""
    changes = {
        field: getattr(args, option)
        for option, field in _OPTIONS.items()
        if getattr(args, option) is not None
    }
    lines: list[str] = []
    done: list[dict[str, Any]] = []
    for ref in await _targets(admin, args.brokerAddr, args.clusterName):
        config = dataclasses.replace(
            await current_config(admin, ref.address, args.groupName), **changes
        )
        cmd = admin.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=config.to_json())
        await admin.broker(ref.address, cmd)
        lines += [f"create subscription group to {ref.address} success.", group_config_text(config)]
        done.append({"brokerName": ref.name, "brokerAddr": ref.address,
                     "subscriptionGroupConfig": config.to_obj()})  # fmt: skip
    return Result({"groupName": args.groupName, "brokers": done}, "\n".join(lines))


async def delete_sub_group(admin: Admin, args: argparse.Namespace) -> Result:
    """Delete the group's configuration on the chosen brokers (a missing one is no error, as
    in RocketMQ)."""
    ext = DeleteSubscriptionGroupRequestHeader(
        group_name=args.groupName, clean_offset=args.removeOffset
    ).to_ext()
    lines: list[str] = []
    done: list[str] = []
    for ref in await _targets(admin, args.brokerAddr, args.clusterName):
        await admin.broker(ref.address, admin.request(RequestCode.DELETE_SUBSCRIPTIONGROUP, ext))
        where = f" in cluster [{ref.cluster}]" if ref.cluster else ""
        lines.append(
            f"delete subscription group [{args.groupName}] from broker [{ref.address}]"
            f"{where} success."
        )
        done.append(ref.address)
    doc = {"groupName": args.groupName, "brokers": done, "removeOffset": args.removeOffset}
    return Result(doc, "\n".join(lines))


async def sub_group_list(admin: Admin, args: argparse.Namespace) -> Result:
    """Every configured group of the chosen brokers, one row per broker and group."""
    rows: list[tuple[object, ...]] = []
    doc: list[dict[str, object]] = []
    for ref in await _targets(admin, args.brokerAddr, args.clusterName):
        reply = await admin.broker(
            ref.address, admin.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        )
        wrapper = SubscriptionGroupWrapper.from_json(reply.body)
        for name, c in sorted(wrapper.subscription_group_table.items()):
            rows.append((ref.name, name, str(c.consume_message_orderly).lower(),
                         c.retry_max_times, str(c.consume_enable).lower(),
                         c.retry_queue_nums))  # fmt: skip
            doc.append({"brokerName": ref.name, "brokerAddr": ref.address, **c.to_obj()})
    headers = ("Broker Name", "Group", "Orderly", "Retry Max Times", "Consume Enable",
               "Retry Queues")  # fmt: skip
    return Result(doc, table(headers, rows))
