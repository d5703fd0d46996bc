"""The ``etcd_cluster`` fixture: 3 etcd members on loopback (``scripts/etcd_local.py``),
in the test's temp dir, stopped by pid afterwards. Without ``etcd`` on the PATH the tests
that use it are skipped with that reason (``make test`` installs Debian's etcd-server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.etcd_local import ETCD, EtcdCluster

__all__ = ["EtcdCluster", "etcd_cluster", "requires_etcd"]

requires_etcd = pytest.mark.skipif(
    ETCD is None, reason="etcd is not installed (make test installs Debian's etcd-server)"
)


@pytest.fixture
def etcd_cluster(tmp_path: Path) -> Iterator[EtcdCluster]:
    """Three etcd members on loopback, stopped by pid after the test."""
    if ETCD is None:
        pytest.skip("etcd is not installed (make test installs Debian's etcd-server)")
    cluster = EtcdCluster.start(tmp_path / "etcd")
    try:
        yield cluster
    finally:
        cluster.stop()
