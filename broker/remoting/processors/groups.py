"""Subscription-group administration (``mqadmin updateSubGroup`` / ``deleteSubGroup``): the
Remoting adapter over :class:`broker.core.admin.AdminService`.

UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200, the configuration as the body),
GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201, answers a ``SubscriptionGroupWrapper``),
DELETE_SUBSCRIPTIONGROUP (207, header ``groupName`` and ``cleanOffset``) and
GET_SUBSCRIPTIONGROUP_CONFIG (352, header ``group``, answers the configuration).
"""

from __future__ import annotations

from broker.remoting.connection import Connection
from broker.remoting.context import BrokerContext
from protocol.bodies.subscription import SubscriptionGroupConfig
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand
from protocol.errors import BrokerError
from protocol.headers.admin import (
    DeleteSubscriptionGroupRequestHeader,
    GetSubscriptionGroupConfigRequestHeader,
)


async def update_group(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Create or replace a group's configuration (the body)."""
    if not cmd.body:
        raise BrokerError(
            "the request carries no subscription group configuration",
            code=ResponseCode.INVALID_PARAMETER,
        )
    ctx.broker.admin.update_group(SubscriptionGroupConfig.from_json(cmd.body))
    return cmd.response()


async def all_groups(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """Every group's configuration, with the table's data version."""
    return cmd.response(body=ctx.broker.admin.group_table().to_json())


async def delete_group(
    ctx: BrokerContext, conn: Connection, cmd: RemotingCommand
) -> RemotingCommand:
    """Delete a group's configuration (with ``cleanOffset``, its committed offsets too)."""
    header = DeleteSubscriptionGroupRequestHeader.from_ext(cmd.ext_fields)
    ctx.broker.admin.delete_group(header.group_name, clean_offset=header.clean_offset)
    return cmd.response()


async def get_group(ctx: BrokerContext, conn: Connection, cmd: RemotingCommand) -> RemotingCommand:
    """One group's configuration (``SUBSCRIPTION_GROUP_NOT_EXIST`` when it has none)."""
    header = GetSubscriptionGroupConfigRequestHeader.from_ext(cmd.ext_fields)
    return cmd.response(body=ctx.broker.admin.group_config(header.group).to_json())
