"""The plain_acl.yml model and the decisions (protocol.acl.rules, protocol.acl.decide):
address patterns, permission words and bits, account checks, and the request matrix."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.acl import (
    ADMIN_CODES,
    RESOURCES,
    AclConfigError,
    AclRules,
    AddressPattern,
    Kind,
    Perm,
    authorize_namesrv,
    authorize_request,
    parse_ip,
    rules_from_obj,
    sign,
)
from protocol.acl.rules import perm_allows
from protocol.bodies.heartbeat import (
    ConsumerData,
    ConsumeType,
    HeartbeatData,
    ProducerData,
    SubscriptionData,
)
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, request

SECRET = "12345678"
LOCAL = parse_ip("127.0.0.1")


# ------------------------------------------------------------------ address patterns
def matches(pattern: str, *addresses: str) -> list[bool]:
    parsed = AddressPattern.parse(pattern)
    return [parsed.matches(parse_ip(a)) for a in addresses]


def test_empty_matches_nothing_and_star_everything() -> None:
    assert matches("", "127.0.0.1", "::1") == [False, False]
    assert matches("   ", "127.0.0.1") == [False]
    for star in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
        assert matches(star, "127.0.0.1", "::1", "10.1.2.3") == [True, True, True]
    assert not AddressPattern.parse("*").matches(None)


def test_exact_and_lists() -> None:
    assert matches("192.168.0.1", "192.168.0.1", "192.168.0.2") == [True, False]
    assert matches("::1", "0:0:0:0:0:0:0:1", "::2") == [True, False]
    # An IPv4-mapped IPv6 peer (a dual-stack listener) is its IPv4 address.
    assert matches("127.0.0.1", "::ffff:127.0.0.1") == [True]
    assert matches("192.168.1.{1,2, 3}", "192.168.1.3", "192.168.1.4") == [True, False]
    assert matches("10.0.0.1,10.0.0.2", "10.0.0.2", "10.0.0.3") == [True, False]
    assert matches("fe80::{1,a}", "fe80::a", "fe80::b") == [True, False]


def test_ranges_and_wildcards() -> None:
    assert matches("192.168.*.*", "192.168.7.9", "192.169.0.1") == [True, False]
    assert matches("192.168.1.*", "192.168.1.255", "192.168.2.1") == [True, False]
    assert matches("192.168.1.1-200", "192.168.1.200", "192.168.1.201") == [True, False]
    assert matches("192.168.1-5.*", "192.168.5.77", "192.168.6.1") == [True, False]
    assert matches("10.*.*.*", "10.255.0.1", "11.0.0.1", "::1") == [True, False, False]
    assert matches("fe80::*", "fe80::1234", "fe81::1") == [True, False]
    assert matches("2001:db8:*:*:*:*:*:*", "2001:db8:1::1", "2001:db9::1") == [True, False]
    assert matches("2001:db8::1-ff", "2001:db8::ff", "2001:db8::100") == [True, False]


@pytest.mark.parametrize(
    "bad",
    [
        "10.*.1.1",  # RocketMQ reads 10.*.*.*: refused rather than widened
        "192.168.1.300",
        "192.168.1.9-2",
        "192.168.1.-5",
        "*.1.1.1",
        "1.2.3",
        "host.example",
        "1.2.3.{}",
        "{1,2}",
        "1.2.3.{4,x}",
        "1::2::3",
        "fe80::1-10000",
    ],
)
def test_bad_patterns_are_errors(bad: str) -> None:
    with pytest.raises(AclConfigError, match="address"):
        AddressPattern.parse(bad, "address")


# ------------------------------------------------------------------ permissions
def test_permission_bits_follow_rocketmq() -> None:
    both = Perm.PUB | Perm.SUB
    assert perm_allows(Perm.PUB, both) and perm_allows(Perm.SUB, both)
    assert perm_allows(Perm.PUB, Perm.PUB) and not perm_allows(Perm.SUB, Perm.PUB)
    assert not perm_allows(Perm.PUB, Perm.DENY) and not perm_allows(Perm.SUB, Perm.DENY)
    assert not perm_allows(Perm.PUB, Perm.DENY | Perm.PUB)  # DENY wins
    assert perm_allows(Perm.ANY, Perm.SUB) and perm_allows(Perm.ANY, Perm.PUB)
    assert not perm_allows(Perm.ANY, Perm.DENY) and not perm_allows(Perm.PUB, Perm.NONE)


#: RocketMQ's distribution/conf/plain_acl.yml, as a YAML loader returns it.
SAMPLE: dict[str, Any] = {
    "globalWhiteRemoteAddresses": ["10.10.103.*", "192.168.0.*"],
    "accounts": [
        {
            "accessKey": "RocketMQ",
            "secretKey": 12345678,
            "whiteRemoteAddress": None,
            "admin": False,
            "defaultTopicPerm": "DENY",
            "defaultGroupPerm": "SUB",
            "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
            "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"],
        },
        {
            "accessKey": "rocketmq2",
            "secretKey": "12345678",
            "whiteRemoteAddress": "192.168.1.*",
            "admin": True,
        },
    ],
}


def test_sample_file_reads_as_rocketmq_reads_it() -> None:
    rules = rules_from_obj(SAMPLE)
    assert rules.globally_white(parse_ip("10.10.103.7"))
    assert not rules.globally_white(LOCAL)
    user, admin = rules.accounts["RocketMQ"], rules.accounts["rocketmq2"]
    assert user.secret_key == "12345678" and SECRET not in repr(user)
    assert not user.admin and admin.admin
    assert user.allows(Kind.TOPIC, "topicB", Perm.PUB)
    assert user.allows(Kind.TOPIC, "topicC", Perm.SUB)
    assert not user.allows(Kind.TOPIC, "topicC", Perm.PUB)
    assert not user.allows(Kind.TOPIC, "topicA", Perm.SUB)
    assert not user.allows(Kind.TOPIC, "other", Perm.SUB)  # defaultTopicPerm DENY
    assert user.allows(Kind.GROUP, "other", Perm.SUB)  # defaultGroupPerm SUB
    assert not user.allows(Kind.GROUP, "groupA", Perm.SUB)
    # Retry topics are their groups (classic and pop V2 names).
    assert not user.allows(Kind.TOPIC, "%RETRY%groupA", Perm.SUB)
    assert user.allows(Kind.TOPIC, "%RETRY%groupC", Perm.SUB)
    assert user.allows(Kind.TOPIC, "%RETRY%groupB+topicA", Perm.PUB)
    # An admin without explicit perms may do anything; defaults absent = DENY otherwise.
    assert admin.allows(Kind.TOPIC, "anything", Perm.PUB)
    assert admin.white_remote_address.matches(parse_ip("192.168.1.9"))


def test_admin_with_explicit_perms_is_checked() -> None:
    doc = {
        "accounts": [
            {"accessKey": "adminKey", "secretKey": SECRET, "admin": True, "topicPerms": ["T=SUB"]}
        ]
    }
    account = rules_from_obj(doc).accounts["adminKey"]
    assert account.allows(Kind.TOPIC, "T", Perm.SUB)
    assert not account.allows(Kind.TOPIC, "T", Perm.PUB)
    assert not account.allows(Kind.TOPIC, "U", Perm.SUB)


def test_empty_documents_and_fields_are_valid() -> None:
    assert rules_from_obj(None) == AclRules()
    rules = rules_from_obj({"globalWhiteRemoteAddresses": None, "accounts": None})
    assert rules.accounts == {} and rules.global_white == ()
    doc = {
        "globalWhiteRemoteAddresses": [],
        "accounts": [{"accessKey": "RocketMQ", "secretKey": SECRET, "whiteRemoteAddress": ""}],
    }
    account = rules_from_obj(doc).accounts["RocketMQ"]
    assert not account.white_remote_address.matches(LOCAL)
    assert not account.allows(Kind.TOPIC, "T", Perm.SUB)
    assert rules_from_obj({"accounts": [], "dataVersion": [{"counter": 1}]}) == AclRules()


def account(**fields: Any) -> dict[str, Any]:
    return {"accessKey": "RocketMQ", "secretKey": SECRET, **fields}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "mapping"),
        ({"account": []}, "unknown key"),
        ({"accounts": {}}, "must be a list"),
        ({"accounts": [account(topicPerm=["T=PUB"])]}, "unknown key"),
        ({"accounts": [account(), account()]}, "repeated"),
        ({"accounts": [account(accessKey="short")]}, "at least 7"),
        ({"accounts": [account(secretKey=123)]}, "secretKey must be at least 7"),
        ({"accounts": [account(secretKey=None)]}, "secretKey must be text"),
        ({"accounts": [account(secretKey=1.5)]}, "secretKey must be text"),
        ({"accounts": [account(defaultTopicPerm="PUBLISH")]}, "not PUB, SUB"),
        ({"accounts": [account(topicPerms=["T=READ"])]}, "not PUB, SUB"),
        ({"accounts": [account(topicPerms=["T"])]}, "NAME=PERM"),
        ({"accounts": [account(groupPerms=["=SUB"])]}, "NAME=PERM"),
        ({"accounts": [account(topicPerms=["%RETRY%g=SUB"])]}, "groupPerms"),
        ({"accounts": [account(admin="yes")]}, "true or false"),
        ({"accounts": [account(whiteRemoteAddress="10.*.1.1")]}, "whiteRemoteAddress"),
        ({"globalWhiteRemoteAddresses": ["nope"]}, "globalWhiteRemoteAddresses"),
        ({"accounts": ["RocketMQ"]}, "must be a mapping"),
    ],
)
def test_invalid_documents_name_the_problem(doc: object, message: str) -> None:
    with pytest.raises(AclConfigError, match=message) as info:
        rules_from_obj(doc)
    assert SECRET not in str(info.value)


# ------------------------------------------------------------------ decisions
RULES = rules_from_obj(
    {
        "globalWhiteRemoteAddresses": ["10.0.0.*"],
        "accounts": [
            {
                "accessKey": "producer1",
                "secretKey": "producer-secret",
                "defaultTopicPerm": "DENY",
                "defaultGroupPerm": "DENY",
                "topicPerms": ["orders=PUB", "audit=PUB|SUB", "RMQ_SYS_TRACE_TOPIC=DENY"],
                "groupPerms": ["pgroup=DENY"],
            },
            {
                "accessKey": "consumer1",
                "secretKey": "consumer-secret",
                "whiteRemoteAddress": "192.168.7.*",
                "defaultTopicPerm": "SUB",
                "defaultGroupPerm": "DENY",
                "topicPerms": ["secret=DENY"],
                "groupPerms": ["cg=SUB"],
            },
            {"accessKey": "admin01", "secretKey": "admin-secret", "admin": True},
        ],
    }
)
KEYS = {"producer1": "producer-secret", "consumer1": "consumer-secret", "admin01": "admin-secret"}


def signed(code: int, ext: dict[str, str], body: bytes = b"", *, who: str) -> RemotingCommand:
    return sign(request(code, 1, ext, body), who, KEYS[who])


def verdict(cmd: RemotingCommand, peer: str = "127.0.0.1") -> str | None:
    refusal = authorize_request(RULES, cmd, parse_ip(peer))
    return None if refusal is None else refusal.remark


def heartbeat(group: str, *topics: str) -> bytes:
    subs = tuple(SubscriptionData(topic=t, sub_string="*") for t in topics)
    data = HeartbeatData(
        client_id="c1",
        producer_data_set=(ProducerData("pgroup"),),
        consumer_data_set=(
            ConsumerData(group, ConsumeType.CONSUME_PASSIVELY, subscription_data_set=subs),
        ),
    )
    return data.to_json()


def test_authentication_refusals_and_bypasses() -> None:
    unsigned = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": "orders"})
    assert "no AccessKey" in (verdict(unsigned) or "")
    unknown = sign(unsigned, "stranger", "whatever1")
    assert verdict(unknown) == "AccessKey 'stranger' is not in the ACL file"
    forged = sign(unsigned, "producer1", "wrong-secret")
    assert verdict(forged) == "signature check failed for AccessKey 'producer1'"
    assert verdict(signed(105, {"topic": "orders"}, who="producer1")) is None
    # A globally white peer needs nothing at all, not even for admin codes.
    assert verdict(unsigned, "10.0.0.9") is None
    assert (
        verdict(request(RequestCode.DELETE_TOPIC_IN_BROKER, 1, {"topic": "x"}), "10.0.0.9") is None
    )
    # The account's own address skips the signature, not its permissions.
    claimed = request(
        RequestCode.PULL_MESSAGE, 1, {"AccessKey": "consumer1", "topic": "t", "consumerGroup": "cg"}
    )
    assert verdict(claimed, "192.168.7.1") is None
    assert "signature check failed" in (verdict(claimed, "192.168.8.1") or "")
    denied = request(
        RequestCode.PULL_MESSAGE,
        1,
        {"AccessKey": "consumer1", "topic": "secret", "consumerGroup": "cg"},
    )
    assert "no SUB permission on topic 'secret'" in (verdict(denied, "192.168.7.1") or "")


def test_sends() -> None:
    def send(topic: str, who: str = "producer1", code: int = RequestCode.SEND_MESSAGE_V2) -> Any:
        ext = (
            {"a": "pgroup", "b": topic}
            if code != RequestCode.SEND_MESSAGE
            else {"producerGroup": "pgroup", "topic": topic}
        )
        return verdict(signed(code, ext, b"body", who=who))

    # Producer groups are not checked (pgroup is DENY).
    assert send("orders") is None
    assert send("orders", code=RequestCode.SEND_MESSAGE) is None
    assert send("orders", code=RequestCode.SEND_BATCH_MESSAGE) is None
    assert send("other") == "AccessKey 'producer1' has no PUB permission on topic 'other'"
    assert send("orders", "consumer1") == (
        "AccessKey 'consumer1' has no PUB permission on topic 'orders'"
    )
    # Traces pass whatever the perms say; a send back through %RETRY% needs SUB on the group.
    assert send("RMQ_SYS_TRACE_TOPIC") is None
    assert send("%RETRY%cg", "consumer1") is None
    assert send("%RETRY%other", "consumer1") == (
        "AccessKey 'consumer1' has no SUB permission on group 'other'"
    )


def test_consuming_requests_need_the_topic_and_the_group() -> None:
    def ask(code: int, ext: dict[str, str], body: bytes = b"") -> str | None:
        return verdict(signed(code, ext, body, who="consumer1"))

    for code in (
        RequestCode.PULL_MESSAGE,
        RequestCode.POP_MESSAGE,
        RequestCode.UPDATE_CONSUMER_OFFSET,
        RequestCode.QUERY_CONSUMER_OFFSET,
        RequestCode.ACK_MESSAGE,
        RequestCode.LITE_PULL_MESSAGE,
    ):
        assert ask(code, {"topic": "t", "consumerGroup": "cg"}) is None
        assert "topic 'secret'" in (ask(code, {"topic": "secret", "consumerGroup": "cg"}) or "")
        assert "group 'g2'" in (ask(code, {"topic": "t", "consumerGroup": "g2"}) or "")
    assert ask(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "cg", "offset": "1"}) is None
    assert "group 'g2'" in (ask(RequestCode.CONSUMER_SEND_MSG_BACK, {"group": "g2"}) or "")
    assert ask(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "cg"}) is None
    assert ask(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "consumerGroup": "g2"})
    assert ask(RequestCode.UNREGISTER_CLIENT, {"clientID": "c", "producerGroup": "p"}) is None
    assert ask(RequestCode.QUERY_MESSAGE, {"topic": "secret"})
    # Heartbeats name their groups and subscriptions in the body.
    assert ask(RequestCode.HEART_BEAT, {}, heartbeat("cg", "t", "%RETRY%cg")) is None
    assert "topic 'secret'" in (ask(RequestCode.HEART_BEAT, {}, heartbeat("cg", "secret")) or "")
    assert "group 'g2'" in (ask(RequestCode.HEART_BEAT, {}, heartbeat("g2", "t")) or "")
    assert "unreadable" in (ask(RequestCode.HEART_BEAT, {}, b"{not json") or "")


def test_admin_codes_need_admin() -> None:
    assert {17, 25, 215, 200, 207} <= ADMIN_CODES
    for code in sorted(ADMIN_CODES):
        remark = verdict(signed(code, {"topic": "orders"}, who="producer1"))
        assert remark == f"AccessKey 'producer1' is not admin: request code {code} needs admin"
        assert verdict(signed(code, {"topic": "orders"}, who="admin01")) is None


def test_remarks_never_carry_a_secret_and_long_names_are_cut() -> None:
    long_topic = "T" * 500
    remark = verdict(signed(RequestCode.SEND_MESSAGE_V2, {"b": long_topic}, who="producer1"))
    assert remark is not None and len(remark) < 200
    for who, secret in KEYS.items():
        for cmd in (
            signed(RequestCode.SEND_MESSAGE_V2, {"b": "x"}, who=who),
            sign(request(10, 1, {"topic": "x"}), who, "bad" + secret),
        ):
            assert secret not in (verdict(cmd) or "")


def test_name_server_protects_registration_only() -> None:
    def ask(cmd: RemotingCommand, peer: str = "10.0.0.9") -> str | None:
        refusal = authorize_namesrv(RULES, cmd, ipaddress.ip_address(peer))
        return None if refusal is None else refusal.remark

    assert ask(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": "t"})) is None
    assert ask(request(RequestCode.GET_KVLIST_BY_NAMESPACE, 1, {"namespace": "n"})) is None
    for code in (
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.PUT_KV_CONFIG,
        RequestCode.DELETE_KV_CONFIG,
    ):
        # No whitelist admits a registration: the global one is 10.0.0.*.
        assert "no AccessKey" in (ask(request(code, 1, {"brokerName": "b"})) or "")
        assert ask(sign(request(code, 1, {}), "producer1", "nope-nope")) is not None
        assert ask(signed(code, {"brokerName": "b"}, who="producer1")) is None
    delete = RequestCode.DELETE_TOPIC_IN_NAMESRV
    assert "not admin" in (ask(signed(delete, {"topic": "t"}, who="producer1")) or "")
    assert ask(signed(delete, {"topic": "t"}, who="admin01")) is None


_KEYS = st.sampled_from(
    ["AccessKey", "Signature", "topic", "b", "consumerGroup", "group", "_UNIQUE_KEY_QUERY", "x"]
)
_NAMES = st.sampled_from(["producer1", "consumer1", "admin01", "", "%RETRY%cg", "secret", "é"])


@given(
    code=st.sampled_from(
        sorted(
            {
                *RESOURCES,
                *ADMIN_CODES,
                RequestCode.HEART_BEAT,
                RequestCode.BATCH_ACK_MESSAGE,
                105,
                9999,
            }
        )
    ),
    ext=st.dictionaries(_KEYS, _NAMES | st.text(max_size=20), max_size=6),
    body=st.binary(max_size=64) | st.sampled_from([b"{}", b"[]", b'{"clientID": 1}', b"null"]),
    version=st.integers(-(2**15), 2**15 - 1),
    peer=st.sampled_from(["127.0.0.1", "10.0.0.9", "192.168.7.1", "::1", "?"]),
    sign_as=st.sampled_from([None, *KEYS]),
)
def test_any_request_gets_a_decision_never_an_exception(
    code: int, ext: dict[str, str], body: bytes, version: int, peer: str, sign_as: str | None
) -> None:
    """Garbage headers and bodies (signatures over garbage included) are decided, never
    crash the check."""
    cmd = request(code, 1, ext, body, version=version)
    if sign_as is not None:
        cmd = sign(cmd, sign_as, KEYS[sign_as])
    for decide in (authorize_request, authorize_namesrv):
        refusal = decide(RULES, cmd, parse_ip(peer))
        assert refusal is None or (refusal.remark and len(refusal.remark) < 400)
