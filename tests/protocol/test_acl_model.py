"""ACL 2.0 (protocol.acl.model, .v2, .migrate, .check): the document's validation, the
decision procedure (a table of precedence, Deny against Allow, prefixes, types, addresses,
Default policies, Super and disabled users), what Remoting and gRPC requests need, and the
import of plain_acl.yml, compared with the ACL 1.0 engine over generated files and requests."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.acl import (
    AclConfigError,
    AclModel,
    AclRules,
    Kind,
    Perm,
    Refusal,
    authorize_namesrv,
    authorize_request,
    model_from_obj,
    model_to_obj,
    parse_ip,
    rules_from_doc,
    rules_from_obj,
    sign,
    v2,
)
from protocol.acl import decide as v1
from protocol.acl import grpc as v1_grpc
from protocol.acl.migrate import import_plain_acl
from protocol.acl.model import Action, ResourceType, Target, User, UserType
from protocol.acl.rules import group_of_retry_topic
from protocol.bodies.ack import BatchAck, BatchAckMessageRequestBody
from protocol.bodies.heartbeat import ConsumerData, ConsumeType, HeartbeatData, SubscriptionData
from protocol.bodies.subscription import SubscriptionGroupConfig
from protocol.codes import RequestCode
from protocol.command import RemotingCommand, request

SECRET = "alice-secret"
LOCAL = "127.0.0.1"


# ------------------------------------------------------------------ the decision table
def allow(resource: object, actions: object = "Pub", **more: Any) -> dict[str, Any]:
    return {"resource": resource, "actions": actions, "decision": "Allow", **more}


def deny(resource: object, actions: object = "Pub", **more: Any) -> dict[str, Any]:
    return {"resource": resource, "actions": actions, "decision": "Deny", **more}


def model_of(
    custom: list[dict[str, Any]],
    default: list[dict[str, Any]] | None = None,
    *,
    user_type: str = "Normal",
    status: str = "enable",
) -> AclModel:
    policies: list[dict[str, Any]] = [{"policyType": "Custom", "entries": custom}]
    if default is not None:
        policies.append({"policyType": "Default", "entries": default})
    return model_from_obj(
        {
            "users": [
                {"username": "alice", "password": SECRET, "userType": user_type,
                 "userStatus": status}
            ],
            "acls": [{"subject": "User:alice", "policies": policies}],
        }
    )  # fmt: skip


def allowed(model: AclModel, ask: str, peer: str | None = LOCAL) -> bool:
    """Whether alice may do ``ask`` ("Topic:orders Pub|Get", "Cluster Update") from ``peer``.
    A retry topic is its group, as every request's resources are (decide.needs_of)."""
    resource, _, words = ask.partition(" ")
    kind, _, name = resource.partition(":")
    if kind == "Topic" and (group := group_of_retry_topic(name)) is not None:
        kind, name = "Group", group
    target = Target(ResourceType(kind), name)
    actions = frozenset(Action(w) for w in words.split("|"))
    user = v2.user_named(model, "alice")
    if not isinstance(user, User):
        return False
    ip = None if peer is None else parse_ip(peer)
    return v2.authorize_needs(model, user, [v2.Need(target, actions)], ip) is None


ORDERS = "Topic:orders"
TABLE: list[tuple[str, AclModel, str, str | None, bool]] = [
    # (what, model, request, peer, allowed)
    ("a literal Allow", model_of([allow(ORDERS)]), "Topic:orders Pub", LOCAL, True),
    ("nothing matches: deny", model_of([]), "Topic:orders Pub", LOCAL, False),
    ("another topic", model_of([allow(ORDERS)]), "Topic:order Pub", LOCAL, False),
    ("a literal Deny", model_of([deny(ORDERS)]), "Topic:orders Pub", LOCAL, False),
    ("Deny beats Allow at equal rank", model_of([allow(ORDERS), deny(ORDERS)]),
     "Topic:orders Pub", LOCAL, False),
    ("...whatever their order", model_of([deny(ORDERS), allow(ORDERS)]),
     "Topic:orders Pub", LOCAL, False),
    ("literal beats prefix (Deny)", model_of([allow("Topic:order*"), deny(ORDERS)]),
     "Topic:orders Pub", LOCAL, False),
    ("literal beats prefix (Allow)", model_of([deny("Topic:order*"), allow(ORDERS)]),
     "Topic:orders Pub", LOCAL, True),
    ("literal beats Topic:*", model_of([deny("Topic:*"), allow(ORDERS)]),
     "Topic:orders Pub", LOCAL, True),
    ("prefix beats Topic:*", model_of([allow("Topic:*"), deny("Topic:ord*")]),
     "Topic:orders Pub", LOCAL, False),
    ("prefix beats Topic:* (Allow)", model_of([deny("Topic:*"), allow("Topic:ord*")]),
     "Topic:orders Pub", LOCAL, True),
    ("the longer prefix wins (Deny)", model_of([allow("Topic:ord*"), deny("Topic:order*")]),
     "Topic:orders Pub", LOCAL, False),
    ("the longer prefix wins (Allow)", model_of([deny("Topic:ord*"), allow("Topic:order*")]),
     "Topic:orders Pub", LOCAL, True),
    ("a prefix that does not match", model_of([allow("Topic:order-*")]),
     "Topic:orders Pub", LOCAL, False),
    ("equal prefixes: Deny", model_of([allow("Topic:ord*"), deny("Topic:ord*")]),
     "Topic:orders Pub", LOCAL, False),
    ("a type beats *", model_of([deny("*"), allow("Topic:*")]), "Topic:orders Pub", LOCAL, True),
    ("a type beats * (Deny)", model_of([allow("*"), deny("Topic:*")]),
     "Topic:orders Pub", LOCAL, False),
    ("* alone", model_of([allow("*", "All")]), "Group:cg Sub", LOCAL, True),
    ("* against a literal Deny", model_of([allow("*", "All"), deny(ORDERS, "All")]),
     "Topic:orders Sub", LOCAL, False),
    ("another type does not match", model_of([allow("Group:*", "Sub")]),
     "Topic:orders Sub", LOCAL, False),
    ("another action does not match", model_of([allow(ORDERS, "Pub")]),
     "Topic:orders Sub", LOCAL, False),
    ("All covers every action", model_of([allow(ORDERS, "All")]),
     "Topic:orders Delete", LOCAL, True),
    ("one of the needed actions", model_of([allow(ORDERS, "Get")]),
     "Topic:orders Sub|Get", LOCAL, True),
    ("a Deny of another action is not consulted", model_of([deny(ORDERS, "Sub"),
                                                             allow("Topic:*")]),
     "Topic:orders Pub", LOCAL, True),
    ("CIDR: inside", model_of([allow(ORDERS, sourceIps=["10.0.0.0/8"])]),
     "Topic:orders Pub", "10.1.2.3", True),
    ("CIDR: outside", model_of([allow(ORDERS, sourceIps=["10.0.0.0/8"])]),
     "Topic:orders Pub", "11.0.0.1", False),
    ("IPv6 CIDR: inside", model_of([allow(ORDERS, sourceIps=["2001:db8::/32"])]),
     "Topic:orders Pub", "2001:db8:1::7", True),
    ("IPv6 CIDR: an IPv4 peer", model_of([allow(ORDERS, sourceIps=["2001:db8::/32"])]),
     "Topic:orders Pub", "10.0.0.1", False),
    ("an IPv4-mapped IPv6 peer is its IPv4", model_of([allow(ORDERS, sourceIps=["10.0.0.0/8"])]),
     "Topic:orders Pub", "::ffff:10.0.0.1", True),
    ("one address", model_of([allow(ORDERS, sourceIps=["127.0.0.1", "::1"])]),
     "Topic:orders Pub", "::1", True),
    ("one address: another", model_of([allow(ORDERS, sourceIps=["127.0.0.1"])]),
     "Topic:orders Pub", "127.0.0.2", False),
    ("an unknown peer and source IPs", model_of([allow(ORDERS, sourceIps=["0.0.0.0/0"])]),
     "Topic:orders Pub", None, False),
    ("an unknown peer and no source IPs", model_of([allow(ORDERS, sourceIps=[])]),
     "Topic:orders Pub", None, True),
    ("a Deny for one subnet", model_of([allow(ORDERS), deny(ORDERS, sourceIps=["10.9.0.0/16"])]),
     "Topic:orders Pub", "10.9.1.1", False),
    ("...not for the others", model_of([allow(ORDERS), deny(ORDERS, sourceIps=["10.9.0.0/16"])]),
     "Topic:orders Pub", "10.8.1.1", True),
    ("Default when no Custom entry matches", model_of([], [allow("Topic:*")]),
     "Topic:orders Pub", LOCAL, True),
    ("a Custom Deny hides the Default Allow", model_of([deny(ORDERS)], [allow(ORDERS)]),
     "Topic:orders Pub", LOCAL, False),
    ("Custom matches only another action", model_of([allow(ORDERS, "Pub")],
                                                    [allow("Topic:*", "Sub")]),
     "Topic:orders Sub", LOCAL, True),
    ("a matching Custom entry, however vague, wins", model_of([allow("*", "All")],
                                                              [deny(ORDERS, "All")]),
     "Topic:orders Sub", LOCAL, True),
    ("a Super user needs no entry", model_of([], user_type="Super"),
     "Cluster Update", LOCAL, True),
    ("...nor minds a Deny", model_of([deny("*", "All")], user_type="super"),
     "Topic:orders Pub", LOCAL, True),
    ("a disabled user", model_of([allow("*", "All")], status="disable"),
     "Topic:orders Pub", LOCAL, False),
    ("a retry topic is its group", model_of([allow("Group:cg", "Sub")]),
     "Topic:%RETRY%cg Sub", LOCAL, True),
    ("...a pop retry topic too", model_of([allow("Group:cg", "Sub"), deny("Topic:*", "All")]),
     "Topic:%RETRY%cg+orders Sub", LOCAL, True),
    ("...and not its topic", model_of([allow("Topic:*", "All")]),
     "Topic:%RETRY%cg Sub", LOCAL, False),
    ("Cluster:*", model_of([deny("*", "All"), allow("Cluster:*", "Update")]),
     "Cluster Update", LOCAL, True),
    ("group prefixes", model_of([allow("Group:team-*", "Sub")]), "Group:team-a Sub", LOCAL, True),
    ("group prefixes: another", model_of([allow("Group:team-*", "Sub")]),
     "Group:teamb Sub", LOCAL, False),
    ("words ignore case; actions as one text", model_of([
        {"resource": "topic:orders", "actions": "pub, SUB", "decision": "ALLOW"}]),
     "Topic:orders Sub", LOCAL, True),
    ("several resources in one entry", model_of([allow(["Topic:a", "Topic:b"])]),
     "Topic:b Pub", LOCAL, True),
]  # fmt: skip


@pytest.mark.parametrize(
    ("model", "ask", "peer", "expected"),
    [case[1:] for case in TABLE],
    ids=[case[0] for case in TABLE],
)
def test_decisions(model: AclModel, ask: str, peer: str | None, expected: bool) -> None:
    assert allowed(model, ask, peer) is expected


def test_refusals_say_why() -> None:
    def remark(model: AclModel, target: Target, *actions: Action) -> str:
        user = v2.user_named(model, "alice")
        assert isinstance(user, User)
        need = v2.Need(target, frozenset(actions))
        refusal = v2.authorize_needs(model, user, [need], parse_ip("10.0.0.1"))
        assert refusal is not None and refusal.access_key == "alice"
        return refusal.remark

    assert remark(model_of([]), Target(ResourceType.TOPIC, "orders"), Action.SUB, Action.GET) == (
        "user 'alice' has no Sub or Get permission on Topic 'orders' from 10.0.0.1: "
        "no matched policies"
    )
    assert remark(model_of([deny("Topic:ord*")]), Target(ResourceType.TOPIC, "orders"),
                  Action.PUB).endswith("denied by Topic:ord*")  # fmt: skip
    disabled = model_of([], status="DISABLE")
    assert v2.user_named(disabled, "alice") == Refusal("user 'alice' is disabled", "alice")
    assert "'bob' is not in the ACL file" in str(v2.user_named(disabled, "bob"))


# ------------------------------------------------------------------ the document
def test_round_trip_and_defaults() -> None:
    model = model_of(
        [allow(["Topic:orders", "Topic:order-*", "*"], "Pub,Sub", sourceIps=["10.0.0.0/8"])],
        [deny("Cluster:*", "All")],
    )
    assert model_from_obj(model_to_obj(model)) == model
    minimal = model_from_obj({"users": [{"username": "bob", "password": 12345678}]})
    bob = minimal.users["bob"]
    assert (bob.password, bob.user_type.value, bob.status.value) == ("12345678", "Normal", "enable")
    assert "12345678" not in repr(bob)
    assert model_to_obj(minimal)["acls"] == []
    assert model_from_obj({"users": None, "acls": None}) == AclModel()


def doc_with(entry: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "users": [{"username": "alice", "password": SECRET}],
        "acls": [{"subject": "User:alice", "policies": [{"entries": [entry or allow(ORDERS)]}]}],
    }
    return {**doc, **top}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "mapping"),
        (doc_with(version=1), r"the ACL file: unknown key\(s\) version"),
        ({"users": [{"username": "alice", "pasword": "x"}]}, r"users\[0\]: unknown key"),
        ({"users": [{"username": "alice"}]}, "password must be non-empty text"),
        ({"users": [{"username": "", "password": "x"}]}, "username must be non-empty"),
        ({"users": [{"username": "a", "password": "x", "userType": "Admin"}]}, "Super, Normal"),
        ({"users": [{"username": "a", "password": "x", "userStatus": "off"}]}, "enable, disable"),
        ({"users": [{"username": "a", "password": "x"}] * 2}, "repeated"),
        ({"users": {}}, "users must be a list"),
        (doc_with(acls=[{"subject": "alice", "policies": []}]), "User:<username>"),
        (doc_with(acls=[{"subject": "User:bob", "policies": []}]), "no user 'bob'"),
        (doc_with(acls=[{"subject": "User:alice"}] * 2), "repeated"),
        (
            doc_with(acls=[{"subject": "User:alice", "policies": [{}, {"policyType": "custom"}]}]),
            "a second Custom policy",
        ),
        (
            doc_with(acls=[{"subject": "User:alice", "policies": [{"policyType": "Other"}]}]),
            "Custom, Default",
        ),
        (doc_with(acls=[{"subject": "User:alice", "policies": [{"entry": []}]}]), "unknown key"),
        (doc_with({"resource": ORDERS, "actions": "Pub"}), "decision is missing"),
        (doc_with({"actions": "Pub", "decision": "Allow"}), "resource is missing"),
        (doc_with(allow(ORDERS, "Publish")), "not one of All, Pub, Sub"),
        (doc_with(allow(ORDERS, "Any")), "not one of"),
        (doc_with(allow(ORDERS, [])), "at least one action"),
        (doc_with(allow([])), "at least one resource"),
        (doc_with(allow(ORDERS) | {"decision": "Maybe"}), "Allow, Deny"),
        (doc_with(allow(ORDERS) | {"scope": "x"}), r"entries\[0\]: unknown key"),
        (doc_with(allow("orders")), "not Type:name"),
        (doc_with(allow("Queue:orders")), "Any, Cluster, Topic, Group"),
        (doc_with(allow("Namespace:ns")), "Any, Cluster, Topic, Group"),
        (doc_with(allow("Any:x")), "write \\* for every resource"),
        (doc_with(allow("Topic:")), "a name, or a prefix"),
        (doc_with(allow("Topic:a*b")), "a name, or a prefix"),
        (doc_with(allow("Topic:a**")), "a name, or a prefix"),
        (doc_with(allow("Cluster:DefaultCluster")), "write Cluster:\\*"),
        (doc_with(allow([5])), "must be text"),
        (doc_with(allow(ORDERS, sourceIps=["10.0.0.1/8"])), "host bits set"),
        (doc_with(allow(ORDERS, sourceIps=["10.0.0.*"])), "not an address or a CIDR"),
        (doc_with(allow(ORDERS, sourceIps="10.0.0.0/8")), "must be a list"),
    ],
)
def test_invalid_documents_name_the_problem(doc: object, message: str) -> None:
    with pytest.raises(AclConfigError, match=message) as info:
        model_from_obj(doc)
    assert SECRET not in str(info.value)


def test_the_format_is_told_by_the_top_level_keys() -> None:
    assert isinstance(rules_from_doc(doc_with()), AclModel)
    assert isinstance(rules_from_doc({"accounts": []}), AclRules)
    assert rules_from_doc(None) == AclRules()
    with pytest.raises(AclConfigError, match=r"mixes plain_acl\.yml keys"):
        rules_from_doc({"accounts": [], "users": []})
    with pytest.raises(AclConfigError, match="unknown key"):
        rules_from_doc({"user": []})


# ------------------------------------------------------------------ requests
MODEL = model_from_obj(
    {
        "users": [
            {"username": "producer", "password": "producer-secret"},
            {"username": "consumer", "password": "consumer-secret"},
            {"username": "ops", "password": "ops-secret"},
            {"username": "root", "password": "root-secret", "userType": "Super"},
            {"username": "gone", "password": "gone-secret", "userStatus": "disable"},
        ],
        "acls": [
            {"subject": "User:producer",
             "policies": [{"entries": [allow("Topic:order*", "Pub")]}]},
            {"subject": "User:consumer",
             "policies": [{"entries": [allow(["Topic:orders", "Group:cg"], "Sub"),
                                       allow("Group:audit", "Get"),
                                       allow("Group:ops", "Update")]}]},
            {"subject": "User:ops",
             "policies": [{"entries": [allow("Topic:team-*", "Create,Delete"),
                                       allow("Group:team-*", "Create,Delete,Update"),
                                       allow("Topic:team-*", "Update"),
                                       allow("Cluster:*", "Update")]}]},
            {"subject": "User:gone", "policies": [{"entries": [allow("*", "All")]}]},
        ],
    }
)  # fmt: skip
KEYS = {
    "producer": "producer-secret",
    "consumer": "consumer-secret",
    "ops": "ops-secret",
    "root": "root-secret",
    "gone": "gone-secret",
}


def signed(code: int, ext: dict[str, str], body: bytes = b"", *, who: str) -> RemotingCommand:
    return sign(request(code, 1, ext, body), who, KEYS[who])


def verdict(cmd: RemotingCommand, peer: str = LOCAL) -> str | None:
    refusal = authorize_request(MODEL, cmd, parse_ip(peer))
    return None if refusal is None else refusal.remark


def test_authentication() -> None:
    unsigned = request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": "orders"})
    assert "no AccessKey" in (verdict(unsigned) or "")
    assert verdict(sign(unsigned, "stranger", "x")) == "user 'stranger' is not in the ACL file"
    assert verdict(sign(unsigned, "producer", "nope")) == (
        "signature check failed for user 'producer'"
    )
    assert verdict(signed(105, {"topic": "orders"}, who="gone")) == "user 'gone' is disabled"
    # A request naming no resource needs only the signature.
    assert verdict(signed(105, {"topic": "secret"}, who="producer")) is None
    assert verdict(signed(RequestCode.GET_MAX_OFFSET, {"topic": "x"}, who="consumer")) is None


def test_producing_and_consuming() -> None:
    def send(topic: str, who: str = "producer") -> str | None:
        return verdict(signed(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": topic}, who=who))

    assert send("orders") is None and send("order-events") is None
    assert send("other") == (
        "user 'producer' has no Pub permission on Topic 'other' from 127.0.0.1: no matched policies"
    )
    assert send("RMQ_SYS_TRACE_TOPIC") is None  # traces pass once signed
    assert send("%RETRY%cg", "consumer") is None  # a send-back: Sub on the group
    assert "Group '%RETRY%x'" not in (send("%RETRY%x", "consumer") or "Group 'x'")

    def consume(code: int, topic: str = "orders", group: str = "cg") -> str | None:
        return verdict(signed(code, {"topic": topic, "consumerGroup": group}, who="consumer"))

    for code in (RequestCode.PULL_MESSAGE, RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE):
        assert consume(code) is None
        assert "Topic 'other'" in (consume(code, topic="other") or "")
        assert "Group 'g2'" in (consume(code, group="g2") or "")
    # Offsets: querying also with Get, committing also with Update (RocketMQ's alternatives).
    assert consume(RequestCode.QUERY_CONSUMER_OFFSET, group="audit") is None
    assert consume(RequestCode.UPDATE_CONSUMER_OFFSET, group="audit") is not None
    assert consume(RequestCode.UPDATE_CONSUMER_OFFSET, group="ops") is None
    assert "Sub or Update" in (consume(RequestCode.UPDATE_CONSUMER_OFFSET, group="g2") or "")
    members = signed(RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "audit"},
                     who="consumer")  # fmt: skip
    assert verdict(members) is None
    beat = HeartbeatData(
        client_id="c1",
        consumer_data_set=(
            ConsumerData("cg", ConsumeType.CONSUME_PASSIVELY, subscription_data_set=(
                SubscriptionData(topic="orders", sub_string="*"),
                SubscriptionData(topic="%RETRY%cg", sub_string="*"),
            )),
        ),
    )  # fmt: skip
    assert verdict(signed(RequestCode.HEART_BEAT, {}, beat.to_json(), who="consumer")) is None
    unreadable = signed(RequestCode.HEART_BEAT, {}, b"{not json", who="root")
    assert "unreadable" in (verdict(unreadable) or "")
    ack = BatchAck(consumer_group="cg", topic="other", start_offset=0, queue_id=0,
                   revive_queue_id=0, pop_time=0, invisible_time=1)  # fmt: skip
    acks = BatchAckMessageRequestBody(broker_name="b", acks=(ack,))
    refused = verdict(signed(RequestCode.BATCH_ACK_MESSAGE, {}, acks.to_json(), who="consumer"))
    assert "Topic 'other'" in (refused or "")


def test_admin_requests() -> None:
    assert v2.ADMIN_TARGETS.keys() == v1.ADMIN_CODES  # no admin code goes unchecked

    def admin(code: int, ext: dict[str, str], body: bytes = b"", who: str = "ops") -> str | None:
        return verdict(signed(code, ext, body, who=who))

    create, delete = RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.DELETE_TOPIC_IN_BROKER
    assert admin(create, {"topic": "team-a"}) is None
    assert "no Create permission on Topic 'orders'" in (admin(create, {"topic": "orders"}) or "")
    assert admin(create, {}) is not None  # an absent name is checked as ""
    assert admin(delete, {"topic": "team-a"}) is None
    group_config = SubscriptionGroupConfig(group_name="team-g").to_json()
    assert admin(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, group_config) is None
    other_config = SubscriptionGroupConfig(group_name="cg").to_json()
    assert admin(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, other_config)
    assert admin(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"garbage")
    assert admin(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {}, b"garbage", "root") is None
    assert admin(RequestCode.DELETE_SUBSCRIPTIONGROUP, {"groupName": "team-g"}) is None
    reset = RequestCode.INVOKE_BROKER_TO_RESET_OFFSET
    assert admin(reset, {"group": "team-g", "topic": "team-t"}) is None
    assert "Topic 'orders'" in (admin(reset, {"group": "team-g", "topic": "orders"}) or "")
    # A retry topic named by an admin request is its group.
    assert admin(create, {"topic": "%RETRY%team-g"}) is None
    for code in (RequestCode.UPDATE_BROKER_CONFIG, RequestCode.TRIGGER_DELETE_FILES,
                 RequestCode.WIPE_WRITE_PERM_OF_BROKER):  # fmt: skip
        assert admin(code, {}) is None and admin(code, {}, who="root") is None
        assert "no Update permission on Cluster ''" in (admin(code, {}, who="producer") or "")
    assert admin(RequestCode.UPDATE_AND_CREATE_TOPIC_LIST, {}) is not None  # Create, not Update


def test_name_server() -> None:
    def ask(cmd: RemotingCommand) -> str | None:
        refusal = authorize_namesrv(MODEL, cmd, parse_ip("10.0.0.9"))
        return None if refusal is None else refusal.remark

    assert ask(request(RequestCode.GET_ROUTEINFO_BY_TOPIC, 1, {"topic": "t"})) is None
    register = RequestCode.REGISTER_BROKER
    assert "no AccessKey" in (ask(request(register, 1, {"brokerName": "b"})) or "")
    assert ask(signed(register, {"brokerName": "b"}, who="producer")) is None
    assert "disabled" in (ask(signed(register, {}, who="gone")) or "")
    delete = RequestCode.DELETE_TOPIC_IN_NAMESRV
    assert "Cluster" in (ask(signed(delete, {"topic": "t"}, who="producer")) or "")
    assert ask(signed(delete, {"topic": "t"}, who="ops")) is None


def grpc_metadata(who: str, secret: str | None = None) -> dict[str, str]:
    date = "20260101T000000Z"
    key = (secret or KEYS[who]).encode()
    digest = hmac.new(key, date.encode(), hashlib.sha1).hexdigest()
    auth = f"MQv2-HMAC-SHA1 Credential={who}, SignedHeaders=x-mq-date-time, Signature={digest}"
    return {"x-mq-date-time": date, "authorization": auth}


def test_grpc_calls() -> None:
    def call(who: str | None, *needs: tuple[Kind, str, Perm], secret: str | None = None) -> Any:
        md = {} if who is None else grpc_metadata(who, secret)
        return v2.authorize_call(MODEL, md, parse_ip(LOCAL), [v2.need_of(*n) for n in needs])

    orders_any = (Kind.TOPIC, "orders", Perm.ANY)
    assert call("producer", orders_any) is None  # a route query: Pub, Sub or Get
    assert call("consumer", orders_any) is None
    refused = call("producer", (Kind.TOPIC, "other", Perm.PUB))
    assert refused is not None and refused[1] is False
    for who, secret in ((None, None), ("producer", "bad"), ("gone", None), ("nobody", "x")):
        refused = call(who, orders_any, secret=secret)
        assert refused is not None and refused[1] is True, who


# ------------------------------------------------------------------ import of plain_acl.yml
def test_import_of_rocketmq_sample() -> None:
    plain = rules_from_obj(
        {
            "globalWhiteRemoteAddresses": [],
            "accounts": [
                {"accessKey": "RocketMQ", "secretKey": 12345678, "whiteRemoteAddress": None,
                 "admin": False, "defaultTopicPerm": "DENY", "defaultGroupPerm": "SUB",
                 "topicPerms": ["topicA=DENY", "topicB=PUB|SUB", "topicC=SUB"],
                 "groupPerms": ["groupA=DENY", "groupB=PUB|SUB", "groupC=SUB"]},
                {"accessKey": "rocketmq2", "secretKey": "12345678", "admin": True},
            ],
        }
    )  # fmt: skip
    imported = import_plain_acl(plain)
    assert imported.notes == ()
    model = imported.model
    assert model.users["rocketmq2"].user_type is UserType.SUPER
    assert model.users["RocketMQ"].password == "12345678"
    doc = model_to_obj(model)
    assert model_from_obj(doc) == model
    acls = doc["acls"]
    assert isinstance(acls, list) and len(acls) == 1
    assert acls[0] == {
        "subject": "User:RocketMQ",
        "policies": [
            {"policyType": "Custom", "entries": [
                {"resource": ["Topic:topicA"], "actions": ["Pub", "Sub"], "decision": "Deny"},
                {"resource": ["Topic:topicB"], "actions": ["Pub", "Sub"], "decision": "Allow"},
                {"resource": ["Topic:topicC"], "actions": ["Sub"], "decision": "Allow"},
                {"resource": ["Group:groupA"], "actions": ["Pub", "Sub"], "decision": "Deny"},
                {"resource": ["Group:groupB"], "actions": ["Pub", "Sub"], "decision": "Allow"},
                {"resource": ["Group:groupC"], "actions": ["Sub"], "decision": "Allow"},
            ]},
            {"policyType": "Default", "entries": [
                {"resource": ["Group:*"], "actions": ["Sub"], "decision": "Allow"},
            ]},
        ],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"globalWhiteRemoteAddresses": ["10.0.0.*"]}, "globalWhiteRemoteAddresses"),
        ({"accounts": [{"accessKey": "RocketMQ", "secretKey": SECRET,
                        "whiteRemoteAddress": "192.168.1.*"}]}, "whiteRemoteAddress"),
        ({"accounts": [{"accessKey": "RocketMQ", "secretKey": SECRET,
                        "topicPerms": ["order*=PUB"]}]}, "prefix pattern"),
    ],
)  # fmt: skip
def test_what_the_import_refuses(doc: object, message: str) -> None:
    with pytest.raises(AclConfigError, match=message):
        import_plain_acl(rules_from_obj(doc))
    # Empty whitelists are no whitelists.
    empty = {"globalWhiteRemoteAddresses": [""], "accounts": []}
    assert import_plain_acl(rules_from_obj(empty)).model == AclModel()


TOPICS = ["orders", "audit", "RMQ_SYS_TRACE_TOPIC", "t1"]
GROUPS = ["cg", "g2"]
AKS = ["account1", "account2", "account3"]
PERMS = st.sampled_from(["DENY", "PUB", "SUB", "PUB|SUB"])


@st.composite
def accounts(draw: st.DrawFn) -> dict[str, Any]:
    chosen = draw(st.lists(st.sampled_from(AKS), min_size=1, max_size=3, unique=True))
    out = []
    for ak in chosen:
        account: dict[str, Any] = {"accessKey": ak, "secretKey": ak + "-secret",
                                   "admin": draw(st.booleans())}  # fmt: skip
        for key in ("defaultTopicPerm", "defaultGroupPerm"):
            if draw(st.booleans()):
                account[key] = draw(PERMS)
        for key, names in (("topicPerms", TOPICS), ("groupPerms", GROUPS)):
            perms = draw(st.dictionaries(st.sampled_from(names), PERMS, max_size=len(names)))
            account[key] = [f"{n}={p}" for n, p in perms.items()]
        out.append(account)
    return {"accounts": out}


def _topic(draw: st.DrawFn) -> str:
    return draw(st.sampled_from([*TOPICS, "other", "%RETRY%cg", "%RETRY%g2+orders"]))


@st.composite
def remoting_requests(draw: st.DrawFn) -> RemotingCommand:
    topic, group = _topic(draw), draw(st.sampled_from([*GROUPS, "g3"]))
    code = draw(st.sampled_from(sorted({*v1.RESOURCES, *v1.ADMIN_CODES, 34, 105, 1000})))
    ext = {"topic": topic, "b": topic, "consumerGroup": group, "group": group,
           "groupName": group}  # fmt: skip
    body = b""
    if code == RequestCode.HEART_BEAT:
        subs = tuple(SubscriptionData(topic=t, sub_string="*") for t in (topic, _topic(draw)))
        consumer = ConsumerData(group, ConsumeType.CONSUME_PASSIVELY, subscription_data_set=subs)
        body = HeartbeatData(client_id="c", consumer_data_set=(consumer,)).to_json()
    elif code == RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP:
        body = draw(st.sampled_from([SubscriptionGroupConfig(group_name=group).to_json(), b"?"]))
    cmd = request(code, 1, ext, body)
    who = draw(st.sampled_from([*AKS, None]))
    if who is None:
        return cmd
    secret = who + draw(st.sampled_from(["-secret", "-secret", "-wrong"]))
    return sign(cmd, who, secret)


def _residual(plain: AclRules, who: str, needs: list[tuple[Kind, str, Perm]]) -> bool:
    """The one difference the import reports: an admin listing rights, with a default of
    PUB, asking for any right on an unlisted topic (or a retry topic of an unlisted group)."""
    account = plain.accounts.get(who)
    if account is None or not account.admin or not (account.topic_perms or account.group_perms):
        return False
    for kind, name, perm in needs:
        if kind is not Kind.TOPIC or perm is not Perm.ANY:
            continue
        group = group_of_retry_topic(name)
        if group is None:
            unlisted, default = name not in account.topic_perms, account.default_topic_perm
        else:
            unlisted, default = group not in account.group_perms, account.default_group_perm
        if unlisted and default == Perm.PUB:
            return True
    return False


@settings(max_examples=400, deadline=None)
@given(doc=accounts(), cmds=st.lists(remoting_requests(), min_size=1, max_size=8))
def test_the_import_decides_remoting_requests_as_plain_acl_does(
    doc: dict[str, Any], cmds: list[RemotingCommand]
) -> None:
    plain = rules_from_obj(doc)
    model = import_plain_acl(plain).model
    peer = parse_ip(LOCAL)
    for cmd in cmds:
        for decide in (authorize_request, authorize_namesrv):
            before, after = decide(plain, cmd, peer), decide(model, cmd, peer)
            assert (before is None) == (after is None), (cmd.code, cmd.ext_fields, before, after)


NEEDS = st.tuples(
    st.sampled_from([Kind.TOPIC, Kind.GROUP]),
    st.sampled_from([*TOPICS, *GROUPS, "other", "%RETRY%cg", "%RETRY%g2+orders"]),
    st.sampled_from([Perm.PUB, Perm.SUB, Perm.ANY]),
).filter(lambda need: not (need[0] is Kind.GROUP and need[2] is Perm.ANY))


@settings(max_examples=400, deadline=None)
@given(
    doc=accounts(),
    who=st.sampled_from(AKS),
    needs=st.lists(NEEDS, max_size=3),
    secret=st.sampled_from(["-secret", "-wrong"]),
)
def test_the_import_decides_grpc_calls_as_plain_acl_does(
    doc: dict[str, Any], who: str, needs: list[tuple[Kind, str, Perm]], secret: str
) -> None:
    plain = rules_from_obj(doc)
    imported = import_plain_acl(plain)
    md = grpc_metadata(who, who + secret)
    peer = parse_ip(LOCAL)
    before = v1_grpc.authorize_call(plain, md, peer, needs)
    after = v2.authorize_call(imported.model, md, peer, [v2.need_of(*n) for n in needs])
    if before is None and _residual(plain, who, needs):
        assert after is not None and any(n.startswith(who + ":") for n in imported.notes)
        return
    assert (before is None) == (after is None), (needs, before, after)
    if before is not None and after is not None:
        assert before[1] == after[1]  # UNAUTHORIZED or FORBIDDEN alike
