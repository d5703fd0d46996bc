"""Topic/group names: validation, retry/DLQ naming, and V1 retry name collisions (#9633)."""

from __future__ import annotations

import string
from collections.abc import Callable

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from protocol.errors import IllegalNameError, RetryNameCollisionError
from protocol.naming import (
    GROUP_MAX_LENGTH,
    LEGAL_CHARS,
    RETRY_OR_DLQ_TOPIC_MAX_LENGTH,
    TOPIC_MAX_LENGTH,
    V1Collision,
    V1RetryNames,
    dlq_topic,
    find_v1_collisions,
    group_of_classic_retry,
    is_dlq_topic,
    is_pop_retry_topic_v2,
    is_retry_topic,
    is_send_allowed,
    is_system_topic,
    is_valid_group,
    is_valid_topic,
    parse_pop_retry_topic,
    parse_pop_retry_topic_v2,
    pop_retry_owner,
    pop_retry_topic,
    pop_retry_topic_v1,
    pop_retry_topic_v2,
    producer_may_send,
    retry_topic,
    v1_candidates,
    validate_group,
    validate_topic,
)

ALPHABET = "".join(sorted(LEGAL_CHARS))
# Short names over a small alphabet rich in '_' so that V1 collisions actually happen.
GROUPS = st.text(alphabet=ALPHABET, min_size=1, max_size=GROUP_MAX_LENGTH)
TOPICS = st.text(alphabet=ALPHABET, min_size=1, max_size=TOPIC_MAX_LENGTH)
SMALL = st.text(alphabet="ab_", min_size=1, max_size=5)
SMALL_PAIRS = st.lists(st.tuples(SMALL, SMALL), max_size=12)

# The example of issue #9633.
PAIR_A = ("MyConsumerGroup", "Order_Topic")
PAIR_B = ("MyConsumerGroup_Order", "Topic")
SHARED = "%RETRY%MyConsumerGroup_Order_Topic"


# ------------------------------------------------------------------ validation
def test_charset_is_rocketmqs() -> None:
    assert set(string.ascii_letters + string.digits + "%-_|") == LEGAL_CHARS


@pytest.mark.parametrize("validate", [validate_topic, validate_group])
def test_empty_name(validate: Callable[[str], None]) -> None:
    with pytest.raises(IllegalNameError, match="empty"):
        validate("")


@pytest.mark.parametrize("ch", [" ", ".", "+", "/", "#", ":", "\n", "\x00", "é", "中", "😀", "*"])
@pytest.mark.parametrize("index", [0, 3, 7])
def test_each_illegal_character_is_reported_with_its_index(ch: str, index: int) -> None:
    name = "abcdefgh"[:index] + ch + "xyz"
    for validate in (validate_topic, validate_group):
        with pytest.raises(IllegalNameError) as info:
            validate(name)
        assert f"{ch!r} at index {index}" in info.value.message


def test_every_illegal_character_is_listed() -> None:
    with pytest.raises(IllegalNameError) as info:
        validate_topic("a b.c/d")
    message = info.value.message
    assert "illegal characters ' ' at index 1, '.' at index 3, '/' at index 5" in message
    with pytest.raises(IllegalNameError, match="and 2 more"):
        validate_group("a.b.c.d.e.f.g.")


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("t" * TOPIC_MAX_LENGTH, True),
        ("t" * (TOPIC_MAX_LENGTH + 1), False),
        ("%RETRY%" + "g" * (RETRY_OR_DLQ_TOPIC_MAX_LENGTH - 7), True),
        ("%RETRY%" + "g" * (RETRY_OR_DLQ_TOPIC_MAX_LENGTH - 6), False),
        ("%DLQ%" + "g" * (RETRY_OR_DLQ_TOPIC_MAX_LENGTH - 5), True),
        ("%DLQ%" + "g" * (RETRY_OR_DLQ_TOPIC_MAX_LENGTH - 4), False),
        ("%RETRY%" + "g" * 120 + "+" + "t" * 127, True),  # the longest V2 name: 255
        ("%RETRY%" + "g" * 121 + "+" + "t" * 127, False),
        ("%RETRY%" + "g" * 120 + "+" + "t" * 128, False),
    ],
)
def test_topic_length_boundaries(name: str, ok: bool) -> None:
    assert is_valid_topic(name) is ok
    if not ok:
        with pytest.raises(IllegalNameError, match=r"over the limit of (127|120|255)"):
            validate_topic(name)


def test_length_message_names_the_limit() -> None:
    with pytest.raises(IllegalNameError, match="is 128 characters long, over the limit of 127"):
        validate_topic("t" * 128)
    with pytest.raises(IllegalNameError, match=r"retry/DLQ topic .* 256 characters long.* 255"):
        validate_topic("%DLQ%" + "g" * 251)
    with pytest.raises(IllegalNameError, match="is 121 characters long, over the limit of 120"):
        validate_group("g" * 121)
    assert is_valid_group("g" * GROUP_MAX_LENGTH)


@pytest.mark.parametrize(
    ("name", "fragment"),
    [
        ("a+b", "'\\+' at index 1"),
        ("%DLQ%g+t", "'\\+' at index 6"),
        ("%RETRY%g+t+u", "'\\+' at index 8, '\\+' at index 10.*legal only once"),
        ("%RETRY%+t", "group part name is empty"),
        ("%RETRY%g+", "topic part name is empty"),
        ("%RETRY%g.h+t", "'\\.' at index 8"),
        ("%RETRY%" + "g" * 121 + "+t", "group part .* over the limit of 120"),
    ],
)
def test_plus_only_in_well_formed_v2_names(name: str, fragment: str) -> None:
    with pytest.raises(IllegalNameError, match=fragment):
        validate_topic(name)


def test_plus_never_in_groups() -> None:
    with pytest.raises(IllegalNameError, match="'\\+' at index 8") as info:
        validate_group("%RETRY%g+t")
    assert "legal only once" not in info.value.message


def test_system_and_send_allowed() -> None:
    for name in ("TBW102", "SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRACE_TOPIC", "rmq_sys_REVIVE_LOG_c"):
        assert is_system_topic(name)
    assert not is_system_topic("RMQ_SYS_something_else")  # only the lower-case prefix counts
    assert not is_system_topic("DefaultCluster")
    assert is_system_topic("DefaultCluster", extra={"DefaultCluster"})
    for name in ("SCHEDULE_TOPIC_XXXX", "RMQ_SYS_TRANS_HALF_TOPIC", "OFFSET_MOVED_EVENT"):
        assert not is_send_allowed(name)
    for name in ("TBW102", "BenchmarkTest", "RMQ_SYS_TRACE_TOPIC", "%RETRY%g", "orders"):
        assert is_send_allowed(name)


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("orders", True),
        ("BenchmarkTest", True),
        ("RMQ_SYS_TRACE_TOPIC", True),
        ("%RETRY%my_group", True),
        ("TBW102", False),
        ("SCHEDULE_TOPIC_XXXX", False),
        ("RMQ_SYS_TRANS_HALF_TOPIC", False),
        ("RMQ_SYS_ANYTHING", False),
        ("rmq_sys_TIMER_RECALL", False),
        ("%DLQ%my_group", False),
        ("%RETRY%", False),
        ("%RETRY%g+topic", False),  # a pop retry V2 name: the broker's
        ("%RETRY%bad group", False),
    ],
)
def test_what_producers_may_send_to(name: str, allowed: bool) -> None:
    assert producer_may_send(name) is allowed


# ------------------------------------------------------------------ naming
def test_names() -> None:
    assert retry_topic("g") == "%RETRY%g"
    assert dlq_topic("g") == "%DLQ%g"
    # KeyBuilderTest: buildPopRetryTopicV1/V2("test-topic", "test-group")
    assert pop_retry_topic_v1("test-group", "test-topic") == "%RETRY%test-group_test-topic"
    assert pop_retry_topic_v2("test-group", "test-topic") == "%RETRY%test-group+test-topic"
    assert pop_retry_topic("g", "t", v2=False) == "%RETRY%g_t"
    assert pop_retry_topic("g", "t", v2=True) == "%RETRY%g+t"
    assert is_retry_topic("%RETRY%g") and not is_retry_topic("%DLQ%g")
    assert is_dlq_topic("%DLQ%g") and not is_dlq_topic("g")
    assert is_pop_retry_topic_v2("%RETRY%g+t") and not is_pop_retry_topic_v2("%RETRY%g_t")
    with pytest.raises(IllegalNameError):
        pop_retry_topic_v2("g+h", "t")


def test_parse_v2_errors() -> None:
    assert parse_pop_retry_topic_v2("%RETRY%g+t") == ("g", "t")
    for bad in ("%RETRY%g_t", "g+t", "%RETRY%g+t+u", "%RETRY%+t", "%RETRY%g+"):
        with pytest.raises(IllegalNameError):
            parse_pop_retry_topic_v2(bad)


def test_parse_with_known_group() -> None:
    assert parse_pop_retry_topic(SHARED, "MyConsumerGroup") == "Order_Topic"
    assert parse_pop_retry_topic(SHARED, "MyConsumerGroup_Order") == "Topic"
    assert parse_pop_retry_topic("%RETRY%g+t_u", "g") == "t_u"
    for name, group in (("%RETRY%g", "g"), ("%RETRY%g_", "g"), ("%RETRY%h_t", "g"), ("t", "g")):
        with pytest.raises(IllegalNameError):
            parse_pop_retry_topic(name, group)


def test_group_of_classic_retry() -> None:
    assert group_of_classic_retry("%RETRY%my_group") == "my_group"
    for bad in ("%RETRY%", "%DLQ%g", "g", "%RETRY%g+t"):
        with pytest.raises(IllegalNameError):
            group_of_classic_retry(bad)


def test_pop_retry_owner_from_origin_topic() -> None:
    assert pop_retry_owner(SHARED, "Order_Topic") == PAIR_A
    assert pop_retry_owner(SHARED, "Topic") == PAIR_B
    assert pop_retry_owner("%RETRY%g+t", "t") == ("g", "t")
    for name, origin in (("%RETRY%g_t", "u"), ("%RETRY%_t", "t"), ("%RETRY%t", "t"), ("x_t", "t")):
        with pytest.raises(IllegalNameError):
            pop_retry_owner(name, origin)
    with pytest.raises(IllegalNameError):
        pop_retry_owner("%RETRY%g_t", "")


@given(GROUPS, TOPICS)
def test_v2_names_are_valid_and_parse_back(group: str, topic: str) -> None:
    name = pop_retry_topic_v2(group, topic)
    validate_topic(name)
    assert parse_pop_retry_topic_v2(name) == (group, topic)
    assert parse_pop_retry_topic(name, group) == topic
    assert pop_retry_owner(name, topic) == (group, topic)


@given(st.tuples(GROUPS, TOPICS), st.tuples(GROUPS, TOPICS))
def test_v2_names_never_collide(a: tuple[str, str], b: tuple[str, str]) -> None:
    assume(a != b)
    assert pop_retry_topic_v2(*a) != pop_retry_topic_v2(*b)


@given(st.tuples(SMALL, SMALL), st.tuples(SMALL, SMALL))
def test_v2_never_collide_even_where_v1_does(a: tuple[str, str], b: tuple[str, str]) -> None:
    assume(a != b)
    assert pop_retry_topic_v2(*a) != pop_retry_topic_v2(*b)


@given(GROUPS, TOPICS)
def test_v1_round_trip_with_known_group(group: str, topic: str) -> None:
    name = pop_retry_topic_v1(group, topic)
    assert parse_pop_retry_topic(name, group) == topic
    assert pop_retry_owner(name, topic) == (group, topic)
    assert (group, topic) in v1_candidates(name, {(group, topic)})


# ------------------------------------------------------------------ V1 collisions (#9633)
def test_issue_9633_collision_detected() -> None:
    assert pop_retry_topic_v1(*PAIR_A) == pop_retry_topic_v1(*PAIR_B) == SHARED
    found = find_v1_collisions([PAIR_A, PAIR_B, ("other", "Topic"), PAIR_A])
    assert found == [V1Collision(SHARED, frozenset({PAIR_A, PAIR_B}))]
    assert find_v1_collisions([PAIR_A, PAIR_A]) == []


def test_collision_with_a_classic_retry_topic() -> None:
    # Group "MyConsumerGroup_Order_Topic" consuming classically owns the same %RETRY% name.
    found = find_v1_collisions([PAIR_A], classic_groups=["MyConsumerGroup_Order_Topic", "x"])
    assert found == [V1Collision(SHARED, frozenset({PAIR_A}), "MyConsumerGroup_Order_Topic")]


@given(SMALL_PAIRS)
def test_find_v1_collisions_matches_brute_force(pairs: list[tuple[str, str]]) -> None:
    expected = {
        pop_retry_topic_v1(*p): frozenset(
            q for q in pairs if pop_retry_topic_v1(*q) == pop_retry_topic_v1(*p)
        )
        for p in pairs
    }
    found = {c.retry_topic: c.pairs for c in find_v1_collisions(pairs)}
    assert found == {name: owners for name, owners in expected.items() if len(owners) > 1}


@given(SMALL_PAIRS, SMALL, SMALL)
def test_v1_candidates_are_exactly_the_owners(
    pairs: list[tuple[str, str]], group: str, topic: str
) -> None:
    name = pop_retry_topic_v1(group, topic)
    expected = {p for p in pairs if pop_retry_topic_v1(*p) == name}
    assert set(v1_candidates(name, set(pairs))) == expected


def test_v1_candidates_of_issue_example() -> None:
    known = {PAIR_A, PAIR_B, ("MyConsumerGroup_Order_Topic", "x")}
    assert sorted(v1_candidates(SHARED, known)) == sorted([PAIR_A, PAIR_B])
    assert v1_candidates("not-a-retry-topic", known) == []


def test_v1_candidates_of_an_over_long_name_do_no_lookups() -> None:
    # Each "_" cost a slice and a hash of the whole name: 64 KiB of "_" took about a second.
    lookups: list[object] = []

    class Counting:
        def __contains__(self, item: object) -> bool:
            lookups.append(item)
            return False

    assert v1_candidates("%RETRY%" + "_" * 65_000, Counting()) == []
    assert lookups == []
    assert v1_candidates("%RETRY%" + "g" * 120 + "_" + "t" * 127, Counting()) == []
    assert len(lookups) == 1  # the longest legal V1 name (255 characters) is still searched


def test_registry_refuses_a_colliding_pair_naming_both() -> None:
    names = V1RetryNames()
    assert names.register(*PAIR_A) == SHARED
    assert names.register(*PAIR_A) == SHARED  # idempotent
    with pytest.raises(RetryNameCollisionError) as info:
        names.register(*PAIR_B)
    message = info.value.message
    assert all(part in message for part in (*PAIR_A, *PAIR_B, SHARED))
    assert names.owner(SHARED) == PAIR_A
    assert SHARED in names and len(names) == 1
    assert names.owner("%RETRY%nobody_x") is None


def test_registry_unregister_frees_the_name() -> None:
    names = V1RetryNames()
    names.register(*PAIR_A)
    names.unregister(*PAIR_B)  # not the owner: no effect
    assert names.owner(SHARED) == PAIR_A
    names.unregister(*PAIR_A)
    assert names.register(*PAIR_B) == SHARED
    assert names.owner(SHARED) == PAIR_B


def test_registry_classic_reservations() -> None:
    names = V1RetryNames()
    names.reserve_classic("MyConsumerGroup_Order_Topic")
    with pytest.raises(RetryNameCollisionError, match="classic retry topic of group"):
        names.register(*PAIR_A)
    other = V1RetryNames()
    other.register(*PAIR_B)
    with pytest.raises(RetryNameCollisionError, match="already the V1 retry topic"):
        other.reserve_classic("MyConsumerGroup_Order_Topic")


@given(SMALL_PAIRS)
def test_registry_owners_are_unique(pairs: list[tuple[str, str]]) -> None:
    names = V1RetryNames()
    accepted: list[tuple[str, str]] = []
    for group, topic in pairs:
        try:
            names.register(group, topic)
        except RetryNameCollisionError:
            continue
        accepted.append((group, topic))
    assert find_v1_collisions(accepted) == []
    for pair in accepted:
        assert names.owner(pop_retry_topic_v1(*pair)) == pair
