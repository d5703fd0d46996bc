"""broker.store.offsets: the consumer offset table and its consumerOffset.json."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.store.api import StoreCorruptError
from broker.store.offsets import ConsumerOffsets

# Pretty-printed the way Java's ConfigManager.persist writes it: fastjson, tabs, inner map keys
# unquoted, plus top-level keys we do not use.
JAVA_FILE = b"""{
\t"dataVersion":{
\t\t"counter":42,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000000
\t},
\t"offsetTable":{
\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:249,2:250,3:250
\t\t},
\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0
\t\t},
\t\t"rmq_sys_REVIVE_LOG_DefaultCluster@CID_RMQ_SYS_REVIVE_GROUP":{0:-1,1:12
\t\t}
\t},
\t"pullOffsetTable":{}
}"""


def _dirty(offsets: ConsumerOffsets) -> bool:
    # A call, not the property: mypy would narrow `offsets.dirty` across mutating calls.
    return offsets.dirty


names = st.text(alphabet="abcXYZ019%-_|+", min_size=1, max_size=12)


def test_missing_file_is_an_empty_clean_table(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "consumerOffset.json")
    assert offsets.query("g", "t", 0) is None
    assert offsets.table("g", "t") == {}
    assert not _dirty(offsets)
    assert not offsets.persist()
    assert not (tmp_path / "consumerOffset.json").exists()


def test_commit_query_persist_reload(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    offsets = ConsumerOffsets(path)
    offsets.commit("g1", "t", 0, 10)
    offsets.commit("g1", "t", 1, 11)
    offsets.commit("g2", "t", 0, 5)
    offsets.commit("g1", "%RETRY%g1", 0, 3)
    assert _dirty(offsets)
    assert offsets.query("g1", "t", 1) == 11
    assert offsets.query("g1", "t", 2) is None
    assert offsets.table("g1", "t") == {0: 10, 1: 11}
    assert offsets.groups_of("t") == {"g1", "g2"}
    assert offsets.topics_of("g1") == {"t", "%RETRY%g1"}
    assert offsets.persist()
    assert not _dirty(offsets)
    assert not offsets.persist()

    reloaded = ConsumerOffsets(path)
    assert not _dirty(reloaded)
    assert reloaded.snapshot() == offsets.snapshot()
    assert reloaded.table("g1", "t") == {0: 10, 1: 11}
    assert json.loads(path.read_bytes()) == {
        "offsetTable": {
            "%RETRY%g1@g1": {"0": 3},
            "t@g1": {"0": 10, "1": 11},
            "t@g2": {"0": 5},
        }
    }


def test_table_is_a_copy(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    offsets.commit("g", "t", 0, 1)
    offsets.table("g", "t")[0] = 99
    assert offsets.query("g", "t", 0) == 1


def test_offsets_may_move_back_and_same_value_is_not_a_change(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    offsets.commit("g", "t", 0, 100)
    offsets.persist()
    offsets.commit("g", "t", 0, 100)
    assert not _dirty(offsets)
    offsets.commit("g", "t", 0, 40)  # a consumer reset its position
    assert _dirty(offsets)
    assert offsets.query("g", "t", 0) == 40


def test_negative_commits_are_ignored(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    offsets.commit("g", "t", 0, -1)
    assert not _dirty(offsets)
    assert offsets.groups_of("t") == set()
    offsets.commit("g", "t", 0, 7)
    offsets.commit("g", "t", 0, -1)
    assert offsets.query("g", "t", 0) == 7


def test_group_with_separator_is_refused(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    with pytest.raises(ValueError, match="@"):
        offsets.commit("a@b", "t", 0, 1)


def test_topic_with_separator_still_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    offsets = ConsumerOffsets(path)
    offsets.commit("g", "odd@topic", 0, 1)
    offsets.persist()
    assert ConsumerOffsets(path).table("g", "odd@topic") == {0: 1}


def test_loads_java_written_file_with_unquoted_keys(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(JAVA_FILE)
    offsets = ConsumerOffsets(path)
    group = "please_rename_unique_group_name_4"
    assert offsets.table(group, "TopicTest") == {0: 250, 1: 249, 2: 250, 3: 250}
    assert offsets.table(group, f"%RETRY%{group}") == {0: 0}
    # An older broker's stored -1 means "no position", as a -1 commit does.
    assert offsets.table("CID_RMQ_SYS_REVIVE_GROUP", "rmq_sys_REVIVE_LOG_DefaultCluster") == {1: 12}
    assert offsets.groups_of("TopicTest") == {group}
    assert not _dirty(offsets)


def test_remove_group_and_topic(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    for group in ("g1", "g2"):
        for topic in ("t1", "t2"):
            offsets.commit(group, topic, 0, 1)
    offsets.persist()
    offsets.remove_group("g1")
    assert _dirty(offsets)
    assert offsets.topics_of("g1") == set()
    assert offsets.groups_of("t1") == {"g2"}
    offsets.remove_topic("t2")
    assert offsets.topics_of("g2") == {"t1"}
    offsets.persist()
    offsets.remove_group("unknown")
    offsets.remove_topic("unknown")
    assert not _dirty(offsets)
    assert ConsumerOffsets(offsets.path).snapshot() == b'{"offsetTable":{"t1@g2":{"0":1}}}'


def test_clamp(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "o.json")
    offsets.commit("ahead", "t", 0, 100)
    offsets.commit("inside", "t", 0, 50)
    offsets.commit("behind", "t", 0, 3)
    offsets.commit("ahead", "t", 1, 100)  # another queue: untouched
    offsets.commit("ahead", "other", 0, 100)  # another topic: untouched
    offsets.persist()
    offsets.clamp("t", 0, min_offset=10, max_offset=90)
    assert _dirty(offsets)
    assert offsets.query("ahead", "t", 0) == 90
    assert offsets.query("inside", "t", 0) == 50
    assert offsets.query("behind", "t", 0) == 10
    assert offsets.query("ahead", "t", 1) == 100
    assert offsets.query("ahead", "other", 0) == 100
    offsets.persist()
    offsets.clamp("t", 0, min_offset=10, max_offset=90)
    offsets.clamp("t", 7, min_offset=0, max_offset=0)  # no group has this queue
    assert not _dirty(offsets)
    with pytest.raises(ValueError, match="min offset"):
        offsets.clamp("t", 0, min_offset=5, max_offset=4)


def test_two_step_persist_keeps_later_changes_dirty(tmp_path: Path) -> None:
    path = tmp_path / "o.json"
    offsets = ConsumerOffsets(path)
    offsets.commit("g", "t", 0, 1)
    seen, data = offsets.changes, offsets.snapshot()
    offsets.commit("g", "t", 0, 2)  # arrives while the worker thread writes `data`
    offsets.write_snapshot(data)
    offsets.mark_persisted(seen)
    assert _dirty(offsets)
    assert ConsumerOffsets(path).query("g", "t", 0) == 1
    assert offsets.persist()
    assert ConsumerOffsets(path).query("g", "t", 0) == 2


def test_failed_persist_stays_dirty(tmp_path: Path) -> None:
    offsets = ConsumerOffsets(tmp_path / "missing-dir" / "o.json")
    offsets.commit("g", "t", 0, 1)
    with pytest.raises(OSError):  # noqa: PT011
        offsets.persist()
    assert _dirty(offsets)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"", "not JSON"),
        (b'{"offsetTable":{"t@g":{0:1}', "not JSON"),
        (b"\xff", "UTF-8"),
        (b"[]", "top level"),
        (b'{"offsetTable":[]}', "offsetTable"),
        (b'{"offsetTable":{"nogroup":{"0":1}}}', "nogroup"),
        (b'{"offsetTable":{"t@":{"0":1}}}', "t@"),
        (b'{"offsetTable":{"@g":{"0":1}}}', "@g"),
        (b'{"offsetTable":{"t@g":[1]}}', "not an object"),
        (b'{"offsetTable":{"t@g":{"x":1}}}', "bad entry"),
        (b'{"offsetTable":{"t@g":{" 1":1}}}', "bad entry"),
        (b'{"offsetTable":{"t@g":{"0":"1"}}}', "bad entry"),
        (b'{"offsetTable":{"t@g":{"0":1.5}}}', "bad entry"),
        (b'{"offsetTable":{"t@g":{"0":true}}}', "bad entry"),
    ],
)
def test_corrupt_file_is_a_store_corrupt_error_naming_it(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(content)
    with pytest.raises(StoreCorruptError, match=why) as info:
        ConsumerOffsets(path)
    assert str(path) in str(info.value)


def test_unreadable_file_is_a_store_corrupt_error(tmp_path: Path) -> None:
    (tmp_path / "consumerOffset.json").mkdir()
    with pytest.raises(StoreCorruptError, match="cannot read"):
        ConsumerOffsets(tmp_path / "consumerOffset.json")


def test_missing_offset_table_key_is_empty(tmp_path: Path) -> None:
    path = tmp_path / "consumerOffset.json"
    path.write_bytes(b'{"dataVersion":{"counter":1}}')
    assert ConsumerOffsets(path).snapshot() == b'{"offsetTable":{}}'


@given(
    st.lists(
        st.tuples(
            names.filter(lambda n: "+" not in n),  # group
            names,  # topic (V2 pop retry topics carry '+')
            st.integers(min_value=0, max_value=1023),
            st.integers(min_value=-1, max_value=2**63 - 1),
        ),
        max_size=30,
    )
)
def test_round_trip_through_persist_and_load(
    commits: list[tuple[str, str, int, int]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "consumerOffset.json"
        offsets = ConsumerOffsets(path)
        expected: dict[tuple[str, str, int], int] = {}
        for group, topic, qid, offset in commits:
            offsets.commit(group, topic, qid, offset)
            if offset >= 0:
                expected[group, topic, qid] = offset
        offsets.persist()
        reloaded = ConsumerOffsets(path)
        for (group, topic, qid), offset in expected.items():
            assert reloaded.query(group, topic, qid) == offset
        for group, topic, _, _ in commits:
            assert reloaded.table(group, topic) == offsets.table(group, topic)
            assert reloaded.groups_of(topic) == offsets.groups_of(topic)
            assert reloaded.topics_of(group) == offsets.topics_of(group)
        assert reloaded.snapshot() == offsets.snapshot()


def test_advance_from_takes_only_offsets_ahead_and_never_moves_one_back(tmp_path: Path) -> None:
    master = ConsumerOffsets(tmp_path / "master.json")
    master.commit("g", "T", 0, 10)
    master.commit("g", "T", 1, 2)
    master.commit("h", "U", 3, 7)
    replica = ConsumerOffsets(tmp_path / "replica.json")
    replica.commit("g", "T", 1, 5)  # ahead of the master's (a snapshot from before)
    assert replica.advance_from(master.snapshot()) == 2
    assert replica.table("g", "T") == {0: 10, 1: 5}
    assert replica.query("h", "U", 3) == 7
    assert replica.dirty
    assert replica.advance_from(master.snapshot()) == 0
    with pytest.raises(ValueError, match="no-separator"):
        replica.advance_from(b'{"offsetTable":{"no-separator":{}}}')
    assert replica.table("g", "T") == {0: 10, 1: 5}
