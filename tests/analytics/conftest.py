"""One local Spark session for every analytics test (a session costs seconds to start).

``local[2]`` with two shuffle partitions and no UI: the data are tiny, so Spark's defaults
(200 partitions, a web UI) would only add time. Skipped, not failed, without a JRE.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """The shared session, stopped after the last test."""
    if shutil.which("java") is None and "JAVA_HOME" not in os.environ:
        pytest.skip("no Java runtime: Spark needs one (Java 17+)")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("trimq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
