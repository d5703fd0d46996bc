"""The reader's schema (analytics/schema.py) is the writer's (broker/metrics.py), field by field."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType

from analytics import schema
from broker import config, metrics

SPARK_TYPE = {"int": LongType(), "float": DoubleType(), "str": StringType(), "bool": BooleanType()}


def test_fields_are_a_verbatim_copy_of_the_writers() -> None:
    assert schema.FIELDS == metrics.FIELDS
    assert schema.SCHEMA_VERSION == metrics.SCHEMA_VERSION
    assert tuple(k.value for k in metrics.EventKind) == schema.KINDS
    assert schema.WAKE_MODES == config.WAKE_MODES


@pytest.mark.parametrize("index", range(len(metrics.FIELDS)))
def test_struct_field_matches_name_order_type_and_nullability(index: int) -> None:
    name, spec = metrics.FIELDS[index]
    field = schema.EVENT_SCHEMA.fields[index]
    assert field.name == name
    assert field.dataType == SPARK_TYPE[spec.split("|")[0]]
    assert field.nullable == spec.endswith("|null")


def test_no_extra_fields_and_derived_lists() -> None:
    assert len(schema.EVENT_SCHEMA.fields) == len(metrics.FIELDS)
    assert schema.REQUIRED == ("v", "ts_ms", "kind", "broker", "topic", "latency_ms", "wake_mode")
    assert "group" in schema.STRING_FIELDS and "queue" not in schema.STRING_FIELDS
    with pytest.raises(ValueError, match="unknown type"):
        schema.spark_field("x", "decimal")
