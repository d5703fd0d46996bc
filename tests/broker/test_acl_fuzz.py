"""The Remoting server with ACL on, fuzzed over TCP: well-framed requests with any code, any
ext fields, AccessKeys real and made up, and signatures that are garbage or made with a wrong
secret, then one properly signed request on the same connection. Every fuzzed request is
refused or answered as an error (never run: nothing is ever stored), the connection still
answers the signed request (no crash, no hang), and the broker keeps serving.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.acl import sign
from protocol.codes import RequestCode, ResponseCode, SerializeType
from protocol.command import RemotingCommand
from protocol.frame import FrameDecoder, encode_command
from tests.client.harness import BrokerThread, broker_thread

pytestmark = pytest.mark.integration

ACL = """\
accounts:
  - accessKey: producer1
    secretKey: producer-secret
    topicPerms: [orders=PUB]
  - accessKey: admin001
    secretKey: admin-secret
    admin: true
"""
KEYS = ["producer1", "admin001", "nobody00", ""]
#: The opaque of the signed request that ends each example (fuzzed ones stay below it).
PROBE = 7_777_777
CODES = st.sampled_from(
    [int(c) for c in RequestCode] + [0, -1, 9999, 2**31 - 1, -(2**31)]
) | st.integers(-(2**31), 2**31 - 1)
FIELDS = st.sampled_from(
    ["topic", "b", "a", "consumerGroup", "group", "producerGroup", "queueId", "AccessKey",
     "Signature", "OnsChannel", "commitLogOffset", "extraInfo", "msgId", "bodyCrc32"]
) | st.text(max_size=12)  # fmt: skip
VALUES = st.sampled_from(["orders", "%RETRY%cg", "TBW102", "0", "-1", "true", ""]) | st.text(
    max_size=30
)


@st.composite
def fuzzed_frame(draw: st.DrawFn) -> bytes:
    """A frame whose length fields are right; what is inside may be anything."""
    if draw(st.booleans()):
        stype = draw(st.sampled_from([0, 1, 0x4D]))
        header, body = draw(st.binary(max_size=300)), draw(st.binary(max_size=100))
        return struct.pack(">II", 4 + len(header) + len(body), (stype << 24) | len(header)) + (
            header + body
        )
    ext = draw(st.dictionaries(FIELDS, VALUES, max_size=8))
    signing = draw(st.sampled_from(["wrong secret", "garbage", "none"]))
    if signing == "garbage":
        ext |= {"AccessKey": draw(st.sampled_from(KEYS)), "Signature": draw(st.text(max_size=40))}
    cmd = RemotingCommand(
        code=draw(CODES),
        opaque=draw(st.integers(0, PROBE - 1)),
        flag=draw(st.sampled_from([0, 0, 0, 2, 1, 3])),
        ext_fields=ext,
        body=draw(st.binary(max_size=200)),
        serialize_type=draw(st.sampled_from([SerializeType.JSON, SerializeType.ROCKETMQ])),
    )
    if signing == "wrong secret":
        cmd = sign(cmd, draw(st.sampled_from(KEYS)), draw(st.text(min_size=1, max_size=20)))
    try:
        return encode_command(cmd)
    except Exception:  # a field the header format cannot carry: send it as raw garbage
        return struct.pack(">II", 4 + 2, 2) + b"{}"


@pytest.fixture(scope="module")
def acl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    root: Path = tmp_path_factory.mktemp("acl-fuzz")
    acl = root / "plain_acl.yml"
    acl.write_text(ACL)
    with broker_thread(root / "data", acl_file=acl) as broker:
        yield broker


async def exchange(port: int, frames: list[bytes]) -> list[RemotingCommand]:
    """Send the frames and then the signed probe on one connection; every reply up to the
    probe's (bounded: fails if the probe is not answered within 10 s)."""
    probe = sign(
        RemotingCommand(
            code=RequestCode.GET_ROUTEINFO_BY_TOPIC, opaque=PROBE, ext_fields={"topic": "orders"}
        ),
        "producer1",
        "producer-secret",
    )
    replies: list[RemotingCommand] = []
    decoder = FrameDecoder()
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(b"".join(frames) + encode_command(probe))
            while True:  # bounded by fail_after
                data = await stream.receive_some(65536)
                assert data, "the broker closed a connection that sent only well-framed input"
                decoder.feed(data)
                while (cmd := decoder.next_command()) is not None:
                    replies.append(cmd)
                    if cmd.opaque == PROBE:
                        return replies


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames=st.lists(fuzzed_frame(), min_size=1, max_size=12))
def test_fuzzed_requests_with_acl_on_are_refused_and_the_connection_lives(
    acl_broker: BrokerThread, frames: list[bytes]
) -> None:
    replies = trio.run(exchange, acl_broker.port, frames)
    assert replies[-1].code == ResponseCode.SUCCESS, replies[-1].remark
    # Nothing a fuzzed request carried ran: none was properly signed.
    for reply in replies[:-1]:
        assert reply.code != ResponseCode.SUCCESS or not reply.is_response, reply


def test_after_the_fuzz_nothing_was_stored_and_the_broker_serves(
    acl_broker: BrokerThread,
) -> None:
    unsigned = RemotingCommand(code=RequestCode.SEND_MESSAGE, opaque=1, ext_fields={"a": "x"})
    replies = trio.run(exchange, acl_broker.port, [encode_command(unsigned)])
    assert [r.code for r in replies] == [ResponseCode.NO_PERMISSION, ResponseCode.SUCCESS]
    stats = acl_broker.call(lambda handle: handle.statistics())
    assert stats.core.store.puts == 0
    assert stats.remoting.denied > 0
