"""A small synthetic event set with known answers, shared by the analytics tests.

Every number the tests expect follows from the construction below: nearest-rank
percentiles of 1..1000 are 500/900/990/999, throughput buckets are placed on known seconds
and minutes, and one bad line (or more) of every rejection reason is mixed in.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

#: A whole minute (epoch ms), so second and minute buckets start at known offsets.
T0_MS = 1_700_000_040_000.0


def event(kind: str, mode: str, latency_ms: float, ts_ms: float, **kw: Any) -> dict[str, Any]:
    """One valid event line's object, every field present (as the broker writes them)."""
    obj: dict[str, Any] = {
        "v": 1, "ts_ms": ts_ms, "kind": kind, "broker": "broker-a", "topic": "T",
        "group": "g", "queue": 0, "latency_ms": latency_ms, "wake_mode": mode, "found": None,
        "retry_topic": None, "origin_topic": None, "reconsume_times": None,
    }  # fmt: skip
    obj.update(kw)
    return obj


def good_events() -> list[dict[str, Any]]:
    """1000 targeted redeliveries (1..1000 ms, 100 per second over seconds 0-9), 10 in wake
    mode none (13001..13010 ms, second 61), wake-ups, stores and revives at second 120."""
    out = [
        event("redeliver", "targeted", float(k + 1), T0_MS + k * 10, reconsume_times=1)
        for k in range(1000)
    ]
    out += [event("redeliver", "none", 13001.0 + k, T0_MS + 61_000 + k) for k in range(10)]
    at = T0_MS + 120_000
    out += [event("wakeup", "topic", 0.5, at, found=True) for _ in range(4)]
    out += [event("wakeup", "topic", 0.5, at, group="other", found=False) for _ in range(8)]
    out += [event("wakeup", "targeted", 0.5, at, found=True) for _ in range(5)]
    out += [event("store", "targeted", ms, at + 500, group=None) for ms in (0.0, 0.25, 2.0)]
    out += [event("revive", "targeted", ms, at, retry_topic="%RETRY%g+T") for ms in (1.0, 2.0)]
    random.Random(9).shuffle(out)  # order must not matter
    return out


def _line(**changes: Any) -> str:
    obj = event("ack", "targeted", 1.0, T0_MS)
    obj.update(changes)
    return json.dumps(obj)


def _without(name: str) -> str:
    obj = event("ack", "targeted", 1.0, T0_MS)
    del obj[name]
    return json.dumps(obj)


#: Bad lines by the reason the job must give; a blank line is skipped, not counted.
BAD_LINES: dict[str, list[str]] = {
    # garbage, a torn last line, two records run together, a record with trailing text
    "not_json": ["garbage", '{"v":1,"ts_ms":17000', _line() + _line(), _line() + " x"],
    "wrong_type": [
        _line(latency_ms="5"),
        _line(topic=5),
        _line(found=1),
        _line(v=1.0),
        _line(ts_ms="NaN"),
    ],
    "missing_field": [_without("latency_ms"), _line(kind=None)],
    "wrong_version": [_line(v=2)],
    "unknown_kind": [_line(kind="bogus")],
}
BAD_COUNTS = {reason: len(lines) for reason, lines in BAD_LINES.items()}


def all_lines() -> list[str]:
    """Good events as compact JSON (as the broker writes them), bad lines, a blank line."""
    good = [json.dumps(e, separators=(",", ":")) for e in good_events()]
    bad = [line for lines in BAD_LINES.values() for line in lines]
    return [*good[:600], *bad, "", *good[600:]]


def write_tree(root: Path) -> None:
    """Two brokers' metrics dirs (one nested a level deeper), plus files the job must skip."""
    lines = all_lines()
    first = root / "broker-a" / "metrics"
    second = root / "broker-b" / "metrics" / "old"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    (first / "events-broker-a-101-2023111422.jsonl").write_text("\n".join(lines[:700]) + "\n")
    (second / "events-broker-b-202-2023111422-1.jsonl").write_text("\n".join(lines[700:]))
    (second / "notes.txt").write_text("not an event file\n")
    (first / "other.jsonl").write_text("garbage that no glob should match\n")
