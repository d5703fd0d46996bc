"""The official Python gRPC client against a broker whose ``--acl-file`` is an ACL 2.0 file
(users and Allow entries instead of plain_acl.yml accounts): the producer and the
SimpleConsumer, signed as their users, are allowed what their entries allow, and a send the
producer's entries do not allow is refused FORBIDDEN with the 2.0 remark. The driver, its
bounds and the broker are :mod:`tests.interop.test_grpc_python`'s."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.interop.grpc_broker import Running, grpc_broker, wait_until
from tests.interop.test_grpc_python import (
    ACL_GROUP,
    ACL_SUB_ONLY_TOPIC,
    ACL_TOPIC,
    CONSUMER_AK,
    CONSUMER_SK,
    FORBIDDEN,
    PRODUCER_AK,
    PRODUCER_SK,
    SEND_REFUSED,
    TEST_TIMEOUT,
    AclDecision,
    PyGrpc,
    acl_args,
    acl_decisions,
    acl_produce,
    assert_logged,
    assert_signed,
    py_grpc,
    stored_in,
)

pytestmark = [
    pytest.mark.interop,
    pytest.mark.parametrize("client_env", [pytest.param("py-grpc", id="py-grpc")], indirect=True),
]
# Imported fixtures: pytest finds them by name in this module (the tests ask for them).
__all__ = ["acl_decisions", "py_grpc"]

ACL2 = f"""\
users:
  - {{username: {PRODUCER_AK}, password: {PRODUCER_SK}}}
  - {{username: {CONSUMER_AK}, password: {CONSUMER_SK}}}
acls:
  - subject: User:{PRODUCER_AK}
    policies:
      - entries:
          - {{resource: [Topic:{ACL_TOPIC}], actions: [Pub], decision: Allow}}
          - {{resource: [Topic:{ACL_SUB_ONLY_TOPIC}], actions: [Sub], decision: Allow}}
  - subject: User:{CONSUMER_AK}
    policies:
      - entries:
          - {{resource: [Topic:{ACL_TOPIC}, Group:{ACL_GROUP}], actions: [Sub], decision: Allow}}
"""


async def test_acl_2_0_users_allowed_and_forbidden(
    py_grpc: Callable[[Running], PyGrpc], tmp_path: Path, acl_decisions: list[AclDecision]
) -> None:
    """Two sends to the producer's topic go through around one to a topic it may only
    subscribe to (each of the client's 3 attempts FORBIDDEN, ``send`` raises
    ForbiddenException with the 2.0 remark); the consumer receives both; every call was
    signed; nothing reaches the refused topic."""
    plan: list[dict[str, Any]] = [
        {"topic": ACL_TOPIC, "body": "allowed before"},
        {"topic": ACL_SUB_ONLY_TOPIC, "body": "sub only", "refused": True},
        {"topic": ACL_TOPIC, "body": "allowed after"},
    ]
    no_pub = (
        f"user '{PRODUCER_AK}' has no Pub permission on Topic '{ACL_SUB_ONLY_TOPIC}' from "
        "127.0.0.1: no matched policies"
    )
    acl = tmp_path / "acl.yml"
    acl.write_text(ACL2)
    with trio.fail_after(TEST_TIMEOUT):
        async with grpc_broker(tmp_path, acl_file=acl) as broker:
            py = py_grpc(broker)
            args = ("--topics", ACL_TOPIC, *acl_args(PRODUCER_AK, PRODUCER_SK))
            run = await acl_produce(py, "producer", plan, args)
            assert_logged(run, SEND_REFUSED)
            report = run.report()
            assert [e["index"] for e in run.of("sent")] == [0, 2], report
            (refused,) = run.of("refused")
            assert refused["type"] == "ForbiddenException", report
            assert refused["text"] == f"{FORBIDDEN}, {no_pub}", report
            consumer = await py.run(
                "consumer", "receive", "--group", ACL_GROUP, "--topic", ACL_TOPIC,
                "--count", "2", "--within", "20", "--await", "3",
                *acl_args(CONSUMER_AK, CONSUMER_SK),
            )  # fmt: skip
            bodies = sorted(e["body"] for e in consumer.of("received"))
            assert bodies == ["allowed after", "allowed before"], consumer.report()
            await wait_until("every lease acked", lambda: broker.in_flight() == 0, 10)
            assert stored_in(broker, ACL_TOPIC) == 2 and stored_in(broker, ACL_SUB_ONLY_TOPIC) == 0
            assert_signed(acl_decisions, {PRODUCER_AK: PRODUCER_SK, CONSUMER_AK: CONSUMER_SK})
            sends = [d.code for d in acl_decisions if d.method == "SendMessage"]
            assert (sends.count(None), sends.count(FORBIDDEN)) == (2, 3), acl_decisions
