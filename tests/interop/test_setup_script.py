"""``scripts/interop_setup.py``: how installer failures are told apart (no network used)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from scripts.interop_setup import (
    InstallFailed,
    RegistryUnreachable,
    _run,
    is_network_error,
)

PIP_OFFLINE = (
    "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
    "after connection broken by 'NewConnectionError('<pip._vendor.urllib3.connection."
    "HTTPSConnection object>: Failed to establish a new connection: [Errno -3] Temporary "
    "failure in name resolution')': /simple/rocketmq/\n"
    "ERROR: No matching distribution found for rocketmq==0.4.4\n"
)
NPM_OFFLINE = (
    "npm error code EAI_AGAIN\n"
    "npm error request to https://…/ali-ons failed, reason: getaddrinfo EAI_AGAIN\n"
)
PIP_BAD_VERSION = (
    "ERROR: Could not find a version that satisfies the requirement rocketmq==9.9 "
    "(from versions: 0.4.4)\nERROR: No matching distribution found for rocketmq==9.9\n"
)
NPM_BAD_VERSION = (
    "npm error code ETARGET\nnpm error notarget No matching version found for ali-ons@99.\n"
)


@pytest.mark.parametrize(
    ("output", "network"),
    [(PIP_OFFLINE, True), (NPM_OFFLINE, True), (PIP_BAD_VERSION, False), (NPM_BAD_VERSION, False)],
)
def test_network_errors_are_recognised(output: str, network: bool) -> None:
    assert is_network_error(output) is network


def test_a_failed_command_carries_its_output(tmp_path: Path) -> None:
    with pytest.raises(InstallFailed) as failed:
        _run([sys.executable, "-c", "print('no such package'); raise SystemExit(3)"], tmp_path, "x")
    assert "no such package" in failed.value.output
    assert "exited with 3" in failed.value.report()
    with pytest.raises(RegistryUnreachable):
        _run([sys.executable, "-c", "print('ECONNREFUSED'); raise SystemExit(1)"], tmp_path, "x")
    assert _run([sys.executable, "-c", "print('ok')"], tmp_path, "x") == "ok\n"
