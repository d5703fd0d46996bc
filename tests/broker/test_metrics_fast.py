"""The metrics writer's batch encoder (``MetricsWriter._encode_batch``) against its row-by-row
encoder (``MetricsWriter._encode``), and that against the encoder as it was before the batch
encoder (:func:`reference_encode`, a copy): the same files, byte for byte, and the same
counters."""

from __future__ import annotations

import enum
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker import metrics
from broker.metrics import EventKind, MetricsWriter

HOUR = 3_600_000
T0 = 1_704_103_200_000.0  # 2024-01-01 10:00 UTC


def reference_encode(row: tuple[Any, ...]) -> str:
    """``MetricsWriter._encode`` as of 4b05cd2 (the name cache left out: it only caches)."""
    values = []
    for value in row:
        if value is None:
            values.append("null")
        elif value is True or value is False:
            values.append("true" if value else "false")
        elif isinstance(value, str):
            values.append(json.dumps(value))
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError("not a finite number")
            values.append(repr(value))
        elif isinstance(value, int):
            values.append(str(value))
        else:
            raise TypeError(f"cannot encode {type(value).__name__}")
    return metrics._LINE.format(*values)


def reference_lines(batch: list[tuple[Any, ...]]) -> list[tuple[tuple[Any, ...], str]]:
    """The rows the reference encodes, with their lines (the others are dropped)."""
    out = []
    for row in batch:
        try:
            out.append((row, reference_encode(row)))
        except (TypeError, ValueError):
            continue
    return out


class Name(str):
    """A str subclass (taken row by row)."""


class Number(int):
    def __str__(self) -> str:
        return "number"


class Ratio(float):
    def __repr__(self) -> str:
        return "ratio"


class Mode(str, enum.Enum):  # noqa: UP042 (the old style: str() is not the value)
    A = "a"


names = st.text(max_size=12) | st.sampled_from(["T", "g", "%RETRY%g_T", "a\nb", '"', "\\"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    names,
    st.sampled_from(list(EventKind)),
)
odd = st.one_of(
    st.builds(Name, names),
    st.builds(Number, st.integers()),
    st.builds(Ratio, st.floats(allow_nan=False)),
    st.just(Mode.A),
    st.just([1, 2]),
    st.just({"a": 1}),
    st.just(10**5000),  # too long for str()
)


@st.composite
def rows(draw: st.DrawFn) -> tuple[Any, ...]:
    """Mostly well-formed events (as ``emit`` builds them), some with any value anywhere
    (but no shorter row and no ``ts_ms`` but a number: the row encoder cannot take those
    either)."""
    hour = draw(st.integers(min_value=0, max_value=2))
    ts = T0 + hour * HOUR + draw(st.floats(min_value=-5.0, max_value=5.0))
    row: list[Any] = [
        1,
        ts,
        draw(st.sampled_from(list(EventKind))),
        draw(names),
        draw(names),
        draw(st.none() | names),
        draw(st.none() | st.integers(-1, 1 << 40)),
        draw(st.floats(min_value=0, max_value=1e9)),
        draw(st.sampled_from(["targeted", "broadcast"])),
        draw(st.none() | st.booleans()),
        draw(st.none() | names),
        draw(st.none() | names),
        draw(st.none() | st.integers(0, 16)),
    ]
    if draw(st.integers(0, 20)) == 0:
        row[1] = draw(st.sampled_from([math.nan, math.inf, -math.inf, 7]))
    for _ in range(draw(st.integers(0, 2))):
        i = draw(st.sampled_from([0, *range(2, len(row))]))
        row[i] = draw(scalars | odd) if draw(st.booleans()) else draw(scalars)
    return tuple(row)


def write(directory: Path, batches: list[list[tuple[Any, ...]]], cap: int, fast: bool) -> Any:
    writer = MetricsWriter(directory, broker="b-1", wake_mode="targeted", max_file_bytes=cap)
    if not fast:
        writer._encode_batch = lambda batch: None  # type: ignore[method-assign]
    seen: list[int] = []
    writer.observers.append(lambda batch: seen.append(len(batch)))
    for batch in batches:
        writer._write(list(batch))
    files = {p.name: p.read_bytes() for p in sorted(directory.glob("events-*.jsonl"))}
    return files, writer.statistics(), seen


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.lists(rows(), max_size=150), max_size=3),
    st.sampled_from([64 * 1024 * 1024, 4000, 700, 1]),
)
def test_batch_encoder_writes_what_the_row_encoder_writes(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[Any, ...]]],
    cap: int,
) -> None:
    fast = write(tmp_path_factory.mktemp("fast"), batches, cap, fast=True)
    slow = write(tmp_path_factory.mktemp("slow"), batches, cap, fast=False)
    assert fast == slow
    files = fast[0]
    if cap >= 1024 * 1024:  # one file per hour: its lines in emit order
        by_hour: dict[str, str] = {}
        for batch in batches:
            for row, line in reference_lines(batch):
                stamp = time.strftime("%Y%m%d%H", time.gmtime(int(row[1] // HOUR) * 3600))
                name = f"events-b-1-{os.getpid()}-{stamp}.jsonl"
                by_hour[name] = by_hour.get(name, "") + line
        assert {name: text.decode() for name, text in files.items()} == by_hour
    else:
        lines = sorted(line for batch in batches for _, line in reference_lines(batch))
        assert lines == sorted(
            line for text in files.values() for line in text.decode().splitlines(keepends=True)
        )


@settings(max_examples=300, deadline=None)
@given(rows())
def test_row_encoder_is_the_reference(row: tuple[Any, ...]) -> None:
    writer = MetricsWriter(None, broker="b", wake_mode="targeted")
    try:
        expected = reference_encode(row)
    except (TypeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            writer._encode(row)
        return
    assert writer._encode(row) == expected
    assert writer._encode(row) == expected  # from the name cache


def test_batch_encoder_takes_emitted_events() -> None:
    writer = MetricsWriter(Path("/nonexistent"), broker="b", wake_mode="targeted")
    writer._buffer.append((1, T0, EventKind.ACK, "b", "T", "g", 3, 1.5, "targeted", None,
                           None, None, None))  # fmt: skip
    writer.emit(EventKind.POP_WAIT, topic="T%s", group="g", latency_ms=2, found=True)
    batch = writer._take()
    hours = writer._encode_batch(batch)
    assert hours is not None
    assert "".join(t for texts in hours.values() for t in texts) == "".join(
        map(reference_encode, batch)
    )


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, Name("x"), Number(3), Ratio(1.0), Mode.A, [1], 10**5000, True, 2.0],
    ids=[
        "nan",
        "inf",
        "str-subclass",
        "int-subclass",
        "float-subclass",
        "enum",
        "list",
        "long",
        "bool",
        "float",
    ],
)
@pytest.mark.parametrize("field", [0, 1, 6, 7, 9, 12])
def test_batch_encoder_leaves_odd_values_to_the_row_encoder(value: Any, field: int) -> None:
    row = [1, T0, EventKind.ACK, "b", "T", "g", 3, 1.5, "targeted", None, None, None, 2]
    spec = metrics.FIELDS[field][1]
    if (spec == "float" and type(value) is float and math.isfinite(value)) or (
        spec.startswith("bool") and value is True
    ):
        return  # the field's own type
    row[field] = value
    writer = MetricsWriter(Path("/nonexistent"), broker="b", wake_mode="targeted")
    assert writer._encode_batch([tuple(row)]) is None


def test_template_cache_keys_do_not_mix_equal_numbers() -> None:
    """1, 1.0 and True are one dict key: never two of them in one field of a batch."""
    writer = MetricsWriter(Path("/nonexistent"), broker="b", wake_mode="targeted")
    row = (1, T0, EventKind.ACK, "b", "T", "g", 1, 1.5, "targeted", True, None, None, 1)
    assert writer._encode_batch([row]) is not None
    for field, value in ((6, True), (9, 1), (12, 1.0)):
        other = (*row[:field], value, *row[field + 1 :])
        assert writer._encode_batch([row, other]) is None
        assert writer._encode(other) == reference_encode(other)


def test_template_cache_is_bounded() -> None:
    writer = MetricsWriter(Path("/nonexistent"), broker="b", wake_mode="targeted")
    rows = [(1, T0, EventKind.ACK, "b", f"T{i}", "g", 1, 1.5, "targeted", None, None, None, 1)
            for i in range(metrics._TEXT_CACHE + 5)]  # fmt: skip
    hours = writer._encode_batch(rows)
    assert hours is not None and len(writer._templates) <= metrics._TEXT_CACHE
    assert hours[int(T0 // HOUR)] == ["".join(map(reference_encode, rows))]
