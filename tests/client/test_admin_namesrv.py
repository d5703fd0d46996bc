"""``trimq-admin`` against a name server with two brokers (not a lone broker)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from client.admin import main
from tests.client.harness import cluster

pytestmark = pytest.mark.integration
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")


def cli_json(capsys: pytest.CaptureFixture[str], namesrv: str, *args: str) -> Any:
    code, doc, err = cli_run(capsys, namesrv, *args)
    assert code == 0, err
    return doc


def cli_run(capsys: pytest.CaptureFixture[str], namesrv: str, *args: str) -> tuple[int, Any, str]:
    """Exit status, the JSON printed (None on failure) and stderr of one ``--json`` call."""
    code = main(["-n", namesrv, "--timeout", "5", "--json", *args])
    out, err = capsys.readouterr()
    if code != 0:
        return code, None, err
    # The brokers' and name server's own log lines (same process, other threads) share stdout.
    ours = [line for line in out.splitlines() if not LOG_LINE.match(line)]
    return code, json.loads("\n".join(ours)), err


def test_admin_over_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """clusterList shows both brokers; updateTopic -c creates the topic on both; topicRoute,
    topicList and topicStatus see it on both; deleteTopic removes it."""
    with cluster(tmp_path) as (namesrv, _brokers):
        ns = namesrv.address
        listing = json.dumps(cli_json(capsys, ns, "clusterList"))
        assert "broker-a" in listing and "broker-b" in listing
        cli_json(
            capsys, ns, "updateTopic", "-c", "DefaultCluster", "-t", "NT", "-r", "2", "-w", "2"
        )
        both = {"broker-a", "broker-b"}
        route: Any = None
        for _ in range(200):  # bounded: registration follows topic changes at once
            # Until the name server has heard of NT from a broker, topicRoute fails (no
            # route) or lists one broker only.
            _, route, _ = cli_run(capsys, ns, "topicRoute", "-t", "NT")
            if both <= set(json.dumps(route).split('"')):
                break
            time.sleep(0.05)
        assert both <= set(json.dumps(route).split('"')), route
        assert "NT" in json.dumps(cli_json(capsys, ns, "topicList"))
        status = json.dumps(cli_json(capsys, ns, "topicStatus", "-t", "NT"))
        assert "broker-a" in status and "broker-b" in status
        cli_json(capsys, ns, "deleteTopic", "-t", "NT", "-c", "DefaultCluster")
