"""Install the third-party RocketMQ clients the interop tests drive, one throwaway
environment each, under ``.interop/`` in the repository root (gitignored).

``python -m scripts.interop_setup [CLIENT ...]`` (no names: all of them) installs what is
missing and prints one JSON line per client. The interop fixtures call :func:`ensure`
directly. An environment is reused while its stamp matches what would be installed, so
repeated ``make test`` runs install nothing.

Clients (see :data:`CLIENTS`):

``ali-ons``
    ``ali-ons@3.12.0`` with ``urllib@2`` (its ``httpclient``) from npm, in ``node_modules``.
``cpp-1.x``
    ``rocketmq==0.4.4`` from PyPI: a ctypes wrapper whose manylinux wheel bundles
    ``librocketmq.so`` (client-cpp 1.x) and ``libz``; pure Python otherwise, so any Python 3
    runs it. Its own venv (both wrappers are the ``rocketmq`` package).
``cpp-2.1``
    ``rocketmq-python-cvs==2.1.0.3`` from PyPI: an sdist carrying a prebuilt
    ``librocketmq.so`` (client-cpp 2.1, needs the system ``libz.so.1``). Its own venv.
``py-grpc``
    ``rocketmq-python-client==5.1.2`` from PyPI: the official RocketMQ 5 gRPC client (pure
    Python on ``grpcio`` and ``protobuf``). Its own venv: it is also a ``rocketmq`` package.
    Importing it starts its logging under ``~``, so run it with ``HOME`` set to a scratch
    directory (the smoke test below does).
``node-grpc``
    ``rocketmq-client-nodejs@1.0.8`` from npm: the official RocketMQ 5 gRPC client for Node
    (TypeScript compiled to JavaScript, on ``@grpc/grpc-js``), in ``node_modules``.

Outcomes, as exceptions from :func:`ensure` and exit codes of the command:
:class:`RegistryUnreachable` (75) when the installer failed with a network error,
:class:`ClientUnusable` (76) when the install worked but the client cannot run on this
machine (its native library does not load), :class:`InstallFailed` (1) for anything else;
each carries the installer's output.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

#: The repository root (this file is ``scripts/interop_setup.py``).
ROOT = Path(__file__).resolve().parent.parent
#: Where the environments live (gitignored).
DEFAULT_CACHE = ROOT / ".interop"
#: Bumped when the layout of an environment changes, so old ones are rebuilt.
LAYOUT_VERSION = 1
#: Longest one installer command may run.
INSTALL_TIMEOUT_S = 300.0

EXIT_UNREACHABLE = 75  # EX_TEMPFAIL
EXIT_UNUSABLE = 76

#: Installer output that means the registry could not be reached (pip, npm, DNS, proxy).
_NETWORK_ERRORS = re.compile(
    r"NewConnectionError|Max retries exceeded|ConnectTimeoutError|ReadTimeoutError|"
    r"ProxyError|Temporary failure in name resolution|Name or service not known|"
    r"Network is unreachable|No route to host|Connection refused|Connection reset|"
    r"connection broken by|Could not fetch URL|SSLError|"
    r"ENOTFOUND|EAI_AGAIN|ECONNREFUSED|ECONNRESET|ETIMEDOUT|ENETUNREACH|EHOSTUNREACH|"
    r"ERR_SOCKET_TIMEOUT|FETCH_ERROR|socket hang up|network request to \S+ failed",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class ClientSpec:
    """One client: how it is installed and how its installation is checked."""

    name: str
    kind: str  # "npm" or "pip"
    packages: tuple[str, ...]
    #: Python code run in the venv after installing (pip clients): it must exit 0.
    smoke: str = ""


CLIENTS: dict[str, ClientSpec] = {
    spec.name: spec
    for spec in (
        ClientSpec("ali-ons", "npm", ("ali-ons@3.12.0", "urllib@2")),
        ClientSpec("cpp-1.x", "pip", ("rocketmq==0.4.4",), smoke="import rocketmq.client"),
        ClientSpec(
            "cpp-2.1", "pip", ("rocketmq-python-cvs==2.1.0.3",), smoke="import rocketmq.client"
        ),
        ClientSpec(
            "py-grpc",
            "pip",
            ("rocketmq-python-client==5.1.2",),
            smoke="import rocketmq.grpc_protocol.definition_pb2",
        ),
        ClientSpec("node-grpc", "npm", ("rocketmq-client-nodejs@1.0.8",)),
    )
}


class SetupError(Exception):
    """A client could not be made ready; ``output`` is what the installer printed."""

    exit_code = 1

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output

    def report(self) -> str:
        """The message with the installer's output under it."""
        return f"{self}\n--- installer output ---\n{self.output}" if self.output else str(self)


class InstallFailed(SetupError):
    """The installer failed for a reason other than the network."""


class RegistryUnreachable(SetupError):
    """The installer could not reach its package registry."""

    exit_code = EXIT_UNREACHABLE


class ClientUnusable(SetupError):
    """Installed, but the client cannot run on this machine (e.g. its native library)."""

    exit_code = EXIT_UNUSABLE


@dataclass(frozen=True, slots=True)
class ClientEnv:
    """A ready environment."""

    name: str
    path: Path
    #: The Python of the client's venv (pip clients).
    python: Path | None
    #: Its ``node_modules`` (npm clients): put it in ``NODE_PATH``.
    node_modules: Path | None
    #: Whether it was already installed.
    cached: bool


def is_network_error(output: str) -> bool:
    """Whether an installer's output shows that it could not reach the registry."""
    return _NETWORK_ERRORS.search(output) is not None


def _stamp_text(spec: ClientSpec) -> str:
    stamp: dict[str, object] = {"layout": LAYOUT_VERSION, "packages": list(spec.packages)}
    if spec.kind == "pip":
        # A venv is tied to the interpreter that made it.
        stamp["python"] = [sys.version, sys.base_prefix]
    return json.dumps(stamp, sort_keys=True)


def _env(spec: ClientSpec, path: Path, *, cached: bool) -> ClientEnv:
    if spec.kind == "pip":
        return ClientEnv(spec.name, path, path / "venv" / "bin" / "python", None, cached)
    return ClientEnv(spec.name, path, None, path / "node_modules", cached)


def _run(argv: Sequence[str], cwd: Path, what: str, env: Mapping[str, str] | None = None) -> str:
    """Run one installer command (bounded); classify a failure by its output."""
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=INSTALL_TIMEOUT_S,
            check=False,
        )
    except FileNotFoundError as exc:
        raise ClientUnusable(f"{what}: {argv[0]} is not installed ({exc})") from None
    except subprocess.TimeoutExpired as exc:
        out = exc.output if isinstance(exc.output, str) else ""
        raise RegistryUnreachable(
            f"{what}: no answer within {INSTALL_TIMEOUT_S:.0f} s (registry unreachable?)", out
        ) from None
    if proc.returncode != 0:
        message = f"{what}: `{' '.join(argv)}` exited with {proc.returncode}"
        if is_network_error(proc.stdout):
            raise RegistryUnreachable(f"{message} (network error)", proc.stdout)
        raise InstallFailed(message, proc.stdout)
    return proc.stdout


def _install(spec: ClientSpec, path: Path) -> None:
    what = f"installing {spec.name} ({' '.join(spec.packages)})"
    if spec.kind == "npm":
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            raise ClientUnusable(f"{what}: node and npm are needed on PATH")
        # Our own package.json, so npm installs here and never walks up to a parent project.
        (path / "package.json").write_text(
            json.dumps({"name": f"trimq-interop-{spec.name}", "private": True}) + "\n"
        )
        _run([npm, "install", "--no-audit", "--no-fund", "--no-update-notifier",
              "--loglevel=error", "--fetch-retries=1", "--fetch-timeout=30000",
              *spec.packages], path, what)  # fmt: skip
        return
    venv = path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], path, what)
    python = str(venv / "bin" / "python")
    _run([python, "-m", "pip", "install", "--no-input", "--disable-pip-version-check",
          "--retries", "1", "--timeout", "30", *spec.packages], path, what)  # fmt: skip
    if spec.smoke:
        # A scratch HOME: some clients log under ~ as soon as they are imported.
        home = path / "smoke-home"
        home.mkdir(exist_ok=True)
        try:
            _run([python, "-c", spec.smoke], path, what, {**os.environ, "HOME": str(home)})
        except SetupError as exc:
            raise ClientUnusable(
                f"{spec.name} installed but does not load here ({spec.smoke!r} failed)",
                exc.output,
            ) from None


@contextmanager
def _locked(cache: Path) -> Iterator[None]:
    """One installer at a time per cache directory (parallel test runs)."""
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def ensure(name: str, cache: Path = DEFAULT_CACHE) -> ClientEnv:
    """Make client ``name`` ready under ``cache`` (reusing a stamped install) and return it.

    Raises :class:`RegistryUnreachable`, :class:`ClientUnusable` or :class:`InstallFailed`.
    """
    spec = CLIENTS[name]
    path = cache / name
    stamp = path / ".stamp"
    wanted = _stamp_text(spec)
    with _locked(cache):
        if stamp.is_file() and stamp.read_text() == wanted:
            return _env(spec, path, cached=True)
        # A missing or different stamp: start from nothing (a half-done install has none).
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        _install(spec, path)
        stamp.write_text(wanted)
    return _env(spec, path, cached=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ensure the named clients (all by default); exit codes as documented."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("clients", nargs="*", metavar="CLIENT",
                        help=f"any of {', '.join(CLIENTS)} (default: all)")  # fmt: skip
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE, help="default: .interop/")
    args = parser.parse_args(argv)
    names: list[str] = args.clients or list(CLIENTS)
    unknown = sorted(set(names) - set(CLIENTS))
    if unknown:
        parser.error(f"unknown client(s) {', '.join(unknown)}; known: {', '.join(CLIENTS)}")
    codes: set[int] = set()
    for name in names:
        try:
            env = ensure(name, args.cache)
        except SetupError as exc:
            print(exc.report(), file=sys.stderr)
            codes.add(exc.exit_code)
            continue
        print(json.dumps({"client": name, "path": str(env.path), "cached": env.cached}))
    # A real failure outranks an unusable client, which outranks an unreachable registry.
    for code in (1, EXIT_UNUSABLE, EXIT_UNREACHABLE):
        if code in codes:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
