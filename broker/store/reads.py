"""The read side of the store: consume-queue reads, records by offset, by time and by key.

Functions over a :class:`CommitLog` and a :class:`ConsumeQueue`; :class:`MessageStore` keeps
the state and delegates here. Reads never decode what they return: a pull or pop response
body is the stored bytes, back to back.
"""

from __future__ import annotations

from broker.store.api import GetResult, GetStatus, RecordFilter
from broker.store.commitlog import CommitLog
from broker.store.consumequeue import ConsumeQueue
from broker.store.record import check_record
from protocol.errors import RecordError
from protocol.message import decode_record, peek_record
from protocol.properties import KEYS, UNIQ_KEY, split_keys

#: Consume-queue entries one read may skip over for a tag filter (RocketMQ: 16 000 bytes).
MAX_FILTER_SCAN = 800


def position_status(offset: int, low: int, high: int) -> GetStatus | None:
    """The status of a read at ``offset`` of a queue holding ``[low, high)``, or None when
    there is something to read."""
    if high == 0:
        return GetStatus.NO_MESSAGE_IN_QUEUE
    if offset < low:
        return GetStatus.OFFSET_TOO_SMALL
    if offset == high:
        return GetStatus.OFFSET_OVERFLOW_ONE
    if offset > high:
        return GetStatus.OFFSET_OVERFLOW_BADLY
    return None


def read_queue(
    log: CommitLog,
    cq: ConsumeQueue,
    low: int,
    offset: int,
    max_count: int,
    max_bytes: int,
    tags_codes: frozenset[int] | None,
    record_filter: RecordFilter | None = None,
    high: int | None = None,
) -> GetResult:
    """Up to ``max_count`` records (and ``max_bytes``, but at least one) from ``offset`` of a
    queue whose first live entry is ``low``; with ``tags_codes``, only those tag hashes; with
    ``record_filter``, only the records it passes (a property filter: it reads each one);
    entries from ``high`` on are not served (default: the queue's end; a replica's confirmed
    offset may stop it earlier)."""
    high = cq.max_offset if high is None else high
    status = position_status(offset, low, high)
    held_past = high < cq.max_offset and max(low, high) <= offset <= cq.max_offset
    if held_past and status is not None and status is not GetStatus.OFFSET_TOO_SMALL:
        # Past what may be served, not past what is held (a replica's unconfirmed tail,
        # read on the master already): "caught up", never a reset backwards.
        status = GetStatus.OFFSET_OVERFLOW_ONE
    if status is not None:
        # An empty queue: its first message will be at ``high`` (0), as RocketMQ answers;
        # echoing ``offset`` would make a consumer ahead of a crash skip new messages.
        restart = {
            GetStatus.OFFSET_TOO_SMALL: low,
            GetStatus.OFFSET_OVERFLOW_BADLY: high,
            GetStatus.NO_MESSAGE_IN_QUEUE: high,
        }
        return GetResult(status, restart.get(status, offset), low, high)
    filtered = tags_codes is not None or record_filter is not None
    if not filtered:
        entries = cq.entries(offset, min(max_count, high - offset))
        span = _read_span(log, entries, max_count, max_bytes)
        if span is not None:
            body, count = span
            phys = tuple([where for where, _, _ in entries[:count]])
            return GetResult(
                GetStatus.FOUND, offset + count, low, high, body,
                tuple(range(offset, offset + count)), phys,
            )  # fmt: skip
    records: list[bytes] = []
    offsets: list[int] = []
    phys_list: list[int] = []
    total = 0
    nxt = offset
    budget = MAX_FILTER_SCAN if filtered else max_count
    for entry_offset, (where, size, tags_code) in enumerate(
        cq.entries(offset, min(max(budget, max_count), high - offset)), start=offset
    ):
        if len(records) >= max_count or (records and total + size > max_bytes):
            break
        nxt = entry_offset + 1
        if tags_codes is not None and tags_code not in tags_codes:
            continue
        data = log.read(where, size)
        if data is None:  # retention removed the record under a lagging queue entry
            continue
        if record_filter is not None and not record_filter(data):
            continue
        records.append(data)
        offsets.append(entry_offset)
        phys_list.append(where)
        total += size
    found = GetStatus.FOUND if records else GetStatus.NO_MATCHED_MESSAGE
    return GetResult(
        found, nxt, low, high, b"".join(records), tuple(offsets), tuple(phys_list)
    )  # fmt: skip


def _read_span(
    log: CommitLog, entries: list[tuple[int, int, int]], max_count: int, max_bytes: int
) -> tuple[bytes, int] | None:
    """An unfiltered read's records in one read when they lie back to back in the log (one
    queue written alone, or a burst of it), with how many there are: what the record by
    record loop of :func:`read_queue` gives then, without a read and a copy per record.
    None when they do not, or the span is not in one place (across a segment, or the
    in-memory tail's start), or a record is gone: then that loop reads them one by one."""
    if not entries:
        return None
    first = entries[0][0]
    end = first
    count = 0
    for where, size, _ in entries:
        if count >= max_count or (count and end - first + size > max_bytes):
            break
        if where != end:
            return None
        end += size
        count += 1
    try:
        body = log.read_some(first, end - first)
    except ValueError:  # outside the log: retention removed the first record
        return None
    return (body, count) if len(body) == end - first else None


def record_at(log: CommitLog, commit_log_offset: int) -> bytes | None:
    """The record at a commit-log offset, or None when no valid record starts there."""
    head = log.read(commit_log_offset, 4)
    if head is None:
        return None
    size = int.from_bytes(head, "big", signed=True)
    data = log.read(commit_log_offset, size) if size > 0 else None
    if data is None:
        return None
    check = check_record(data, 0, commit_log_offset)
    if check.blank or check.size != size:  # a blank marker is no record
        return None
    return data


def store_timestamp_at(log: CommitLog, commit_log_offset: int, size: int) -> int:
    """Store time of the record at an offset (0 when unreadable)."""
    data = log.read(commit_log_offset, size)
    if data is None:
        return 0
    try:
        return peek_record(data).store_timestamp
    except RecordError:
        return 0


def records_with_key(
    log: CommitLog,
    candidates: list[int],
    topic: str,
    key: str,
    max_num: int,
    begin_ms: int,
    end_ms: int,
) -> list[bytes]:
    """The records among ``candidates`` (offsets, newest first) that really are ``topic``'s,
    carry ``key`` and were stored in ``[begin_ms, end_ms]``: the index holds hashes only."""
    out: list[bytes] = []
    for offset in candidates:
        data = record_at(log, offset)
        if data is None:
            continue
        try:
            msg, _ = decode_record(data)
        except RecordError:
            continue
        keys = msg.properties.get(UNIQ_KEY), *split_keys(msg.properties.get(KEYS))
        if msg.topic == topic and key in keys and begin_ms <= msg.store_timestamp <= end_ms:
            out.append(data)
            if len(out) >= max_num:
                break
    return out
