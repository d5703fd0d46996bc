"""The layer rules of docs/design.md §2 are enforced, and the enforcement itself works."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted((ROOT / "protocol").rglob("*.py")), ids=str)
def test_protocol_is_sans_io(path: Path) -> None:
    """No sockets, no event loops, no threads in protocol/ (import-linter cannot see stdlib)."""
    forbidden = {"socket", "ssl", "selectors", "asyncio", "threading", "trio", "anyio"}
    assert not imported_modules(path) & forbidden


def run_lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": str(LINT_IMPORTS.parent)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_contracts_hold_on_this_tree() -> None:
    result = run_lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_import_linter_fails_when_protocol_imports_trio(tmp_path: Path) -> None:
    for pkg in ("protocol", "broker", "client", "analytics"):
        shutil.copytree(ROOT / pkg, tmp_path / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "protocol" / "leak.py").write_text("import trio\n")
    result = run_lint_imports(tmp_path)
    assert result.returncode != 0
    assert "protocol is sans-IO" in result.stdout
    assert "BROKEN" in result.stdout
