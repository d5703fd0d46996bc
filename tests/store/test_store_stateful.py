"""The store against a list model, through puts, reads, flushes, checkpoints, clean reopens
and simulated ``kill -9`` crashes (at any point, also in the middle of a checkpoint).

The model is the list of messages in log order plus how many of them are durable (put before
a completed flush or checkpoint). A crash may lose only a suffix of the non-durable ones:
what survives is intact, in order, densely numbered, and nothing that was never put appears.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from broker.store.api import FlushMode, GetStatus, MessageToStore, PutStatus
from broker.store.store import MessageStore
from protocol.properties import TAGS, java_string_hash
from tests.store.support import bodies, crash, read_queue, store_config

TOPICS = ("TopicA", "TopicB", "%RETRY%G")
QUEUE_IDS = (0, 1, 2)
TAG_NAMES = ("red", "green", "blue")

QueueKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Sent:
    key: QueueKey
    body: bytes
    tag: str | None


Message = tuple[str, int, int, str | None]  # topic, queue id, body length, tag

messages = st.tuples(
    st.sampled_from(TOPICS),
    st.sampled_from(QUEUE_IDS),
    st.integers(0, 1200),  # body length: a few records per 4 KiB segment, or many
    st.none() | st.sampled_from(TAG_NAMES),
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory(prefix="trimq-stateful-")
        self.store: MessageStore | None = None
        self.mode = FlushMode.ASYNC
        self.log: list[Sent] = []  # every message put and not lost, in log order
        self.durable = 0  # self.log[:durable] survive any crash
        self.created: set[QueueKey] = set()  # queues that exist (even if emptied by a crash)
        self.counter = 0

    @initialize(
        mode=st.sampled_from(FlushMode),
        segment_size=st.sampled_from([4096, 8192, 16384]),
    )
    def open_store(self, mode: FlushMode, segment_size: int) -> None:
        self.mode = mode
        config = store_config(
            Path(self.tmp.name), mode, segment_size=segment_size, cq_entries_per_file=8
        )
        self.store = MessageStore.open(config)

    def teardown(self) -> None:
        try:
            if self.store is not None:
                self.store.close()
        finally:
            self.tmp.cleanup()

    # ------------------------------------------------------------------ model views
    @property
    def s(self) -> MessageStore:
        assert self.store is not None
        return self.store

    def visible(self, key: QueueKey) -> list[Sent]:
        """What reads of ``key`` must serve: SYNC mode dispatches only durable records."""
        upto = len(self.log) if self.mode is FlushMode.ASYNC else self.durable
        return [m for m in self.log[:upto] if m.key == key]

    # ------------------------------------------------------------------ rules
    @rule(batch=st.lists(messages, min_size=1, max_size=12))
    def put(self, batch: list[Message]) -> None:
        for topic, queue_id, length, tag in batch:
            self.counter += 1
            body = (b"%d|" % self.counter + bytes(range(256)) * 5)[:length]
            key = (topic, queue_id)
            result = self.s.put_nowait(
                MessageToStore(topic, queue_id, body, {TAGS: tag} if tag else {})
            )
            assert result.status is PutStatus.PUT_OK, result.remark
            assert result.queue_offset == sum(1 for m in self.log if m.key == key)
            self.log.append(Sent(key, body, tag))
            self.created.add(key)

    @rule(
        topic=st.sampled_from(TOPICS),
        queue_id=st.sampled_from(QUEUE_IDS),
        offset=st.integers(-2, 40),
        max_count=st.integers(1, 10),
        tag_filter=st.none() | st.sets(st.sampled_from(TAG_NAMES), min_size=1),
    )
    def get(
        self,
        topic: str,
        queue_id: int,
        offset: int,
        max_count: int,
        tag_filter: set[str] | None,
    ) -> None:
        key = (topic, queue_id)
        codes = None if tag_filter is None else frozenset(map(java_string_hash, tag_filter))
        got = self.s.get(topic, queue_id, offset, max_count, tags_codes=codes)
        if key not in self.created:
            assert got.status is GetStatus.NO_MATCHED_LOGIC_QUEUE
            return
        view = self.visible(key)
        high = len(view)
        assert (got.min_offset, got.max_offset) == (0, high)
        if high == 0:
            assert (got.status, got.next_offset) == (GetStatus.NO_MESSAGE_IN_QUEUE, 0)
        elif offset < 0:
            assert (got.status, got.next_offset) == (GetStatus.OFFSET_TOO_SMALL, 0)
        elif offset == high:
            assert (got.status, got.next_offset) == (GetStatus.OFFSET_OVERFLOW_ONE, high)
        elif offset > high:
            assert (got.status, got.next_offset) == (GetStatus.OFFSET_OVERFLOW_BADLY, high)
        else:
            taken = [
                i for i in range(offset, high) if tag_filter is None or view[i].tag in tag_filter
            ][:max_count]
            if not taken:
                assert got.status is GetStatus.NO_MATCHED_MESSAGE
                assert got.next_offset == high
                return
            assert got.status is GetStatus.FOUND
            assert got.offsets == tuple(taken)
            assert bodies(got) == [view[i].body for i in taken]
            assert got.next_offset == (taken[-1] + 1 if len(taken) == max_count else high)

    def flush(self) -> None:
        self.s.flush()
        self.durable = len(self.log)

    @rule(checkpoint=st.booleans())
    def make_durable(self, checkpoint: bool) -> None:
        if checkpoint:
            self.s.checkpoint()
            self.durable = len(self.log)
        else:
            self.flush()

    @rule()
    def clean_reopen(self) -> None:
        self.s.close()
        self.store = MessageStore.open(self.s.config)
        assert self.s.statistics().recovered_records == 0
        self.durable = len(self.log)
        self.check_everything()

    @rule(
        before=st.sampled_from(["nothing", "flush", "checkpoint_begin", "checkpoint_sync"]),
        tail=st.lists(messages, max_size=6),
    )
    def crash_reopen(self, before: str, tail: list[Message]) -> None:
        """``kill -9`` after ``tail`` was put: with nothing else, right after a flush, or
        in the middle of a checkpoint (the puts racing it) — after it wrote the log and the
        queues out, or even after it fsynced them and saved the checkpoint file."""
        ticket = None
        if before == "flush":
            self.flush()
        elif before.startswith("checkpoint"):
            ticket = self.s.checkpoint_begin()
            durable_at_begin = len(self.log)
        self.put(tail)
        if before == "checkpoint_sync":
            assert ticket is not None
            self.s.checkpoint_sync(ticket)
            self.durable = durable_at_begin
        self._crash_and_recover()

    def _crash_and_recover(self) -> None:
        config = self.s.config
        crash(self.s)
        self.store = MessageStore.open(config)
        served = {key: read_queue(self.s, *key) for key in sorted(self.created)}
        assert set(self.s.topics()) <= set(TOPICS)
        survivors = sum(map(len, served.values()))
        # Recovery keeps a prefix of the log: everything durable, maybe a little more.
        assert self.durable <= survivors <= len(self.log)
        kept = self.log[:survivors]
        for key, got in served.items():
            assert got == [m.body for m in kept if m.key == key], key
        self.log = kept
        self.durable = survivors  # recovery fsyncs what it kept

    # ------------------------------------------------------------------ invariants
    def check_everything(self) -> None:
        for key in sorted(self.created):
            assert read_queue(self.s, *key) == [m.body for m in self.visible(key)]

    @invariant()
    def queue_bounds_match_the_model(self) -> None:
        if self.store is None:
            return
        for topic in TOPICS:
            for queue_id in QUEUE_IDS:
                key = (topic, queue_id)
                high = len(self.visible(key)) if key in self.created else 0
                assert self.s.max_offset(topic, queue_id) == high
                assert self.s.min_offset(topic, queue_id) == 0


StoreMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=40)
TestStoreMachine = StoreMachine.TestCase
