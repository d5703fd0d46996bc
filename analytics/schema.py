"""The latency-event schema (docs/design.md §8) as Spark sees it.

The broker's writer defines the schema once, as ``broker.metrics.FIELDS``. ``analytics`` may
not import ``broker`` (docs/design.md §2: the job runs where no broker code is installed), so this
module mirrors that tuple verbatim and derives the Spark ``StructType`` from it;
``tests/analytics/test_schema.py`` pins the two copies field by field (name, order, type,
nullability), so a change to one without the other fails CI.
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DataType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

SCHEMA_VERSION = 1
#: A copy of ``broker.metrics.FIELDS``: (name, type) in line order; ``|null`` = nullable.
FIELDS: tuple[tuple[str, str], ...] = (
    ("v", "int"),
    ("ts_ms", "float"),
    ("kind", "str"),
    ("broker", "str"),
    ("topic", "str"),
    ("group", "str|null"),
    ("queue", "int|null"),
    ("latency_ms", "float"),
    ("wake_mode", "str"),
    ("found", "bool|null"),
    ("retry_topic", "str|null"),
    ("origin_topic", "str|null"),
    ("reconsume_times", "int|null"),
)
#: The values of ``broker.metrics.EventKind``, in its order.
KINDS: tuple[str, ...] = (
    "store", "pull_wait", "pop_wait", "wakeup", "revive", "redeliver", "ack", "e2e", "dlq",
)  # fmt: skip
#: The broker's wake-up policies (``broker.config.WAKE_MODES``); plots draw them in this order.
WAKE_MODES: tuple[str, ...] = ("targeted", "topic", "none")

# JSON integers can exceed 32 bits (epoch values, counters), so "int" is a LongType.
_SPARK_TYPES: dict[str, DataType] = {
    "int": LongType(),
    "float": DoubleType(),
    "str": StringType(),
    "bool": BooleanType(),
}


def spark_field(name: str, spec: str) -> StructField:
    """The ``StructField`` of one ``FIELDS`` entry (``"int|null"`` -> nullable LongType)."""
    base, _, null = spec.partition("|")
    if base not in _SPARK_TYPES or null not in ("", "null"):
        raise ValueError(f"field {name!r}: unknown type {spec!r}")
    return StructField(name, _SPARK_TYPES[base], nullable=null == "null")


#: One event line, as a Spark schema: the reader's side of the one definition.
EVENT_SCHEMA = StructType([spark_field(name, spec) for name, spec in FIELDS])
#: Fields that must be present and non-null in a valid line.
REQUIRED: tuple[str, ...] = tuple(f.name for f in EVENT_SCHEMA.fields if not f.nullable)
#: Fields whose JSON value must be a string (or null): Spark's JSON reader turns any token
#: into text for a StringType field, so a number there is only caught by looking at the line.
STRING_FIELDS: tuple[str, ...] = tuple(
    f.name for f in EVENT_SCHEMA.fields if isinstance(f.dataType, StringType)
)
