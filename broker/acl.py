"""ACLs for the servers: the ACL file (``plain_acl.yml`` of ACL 1.0 or the ACL 2.0 model, told
apart by its top-level keys), read and kept current, and the guard every request passes before
its processor runs; ``python -m broker.acl import plain_acl.yml`` prints a 1.0 file as a 2.0
one (:func:`main`).

Theory of operation: :class:`AclGuard` holds the rules of the last good version of the file
and a decision function from :mod:`protocol.acl` that takes either format (the broker's
:func:`~protocol.acl.authorize_request`, the name server's
:func:`~protocol.acl.authorize_namesrv`). The server calls it with each request and the
peer's address; it answers None (run the request) or the ``NO_PERMISSION`` reply. Reloading
is lazy: at most once per ``check_interval_s`` a request makes the guard look at the file's
modification time, size and inode, and a change is read at once, in the request's turn (a
small file, rarely). A file that cannot be read or is not valid keeps the previous rules and
logs an error, once per change; a new version may switch formats. No task is needed, so
nothing outlives the server.

Refusals (Remoting and gRPC) are counted and logged at most once a second with how many were
not logged: a client retrying with a wrong secret must not flood the log.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog
import yaml

from protocol.acl import AclConfigError, AclRules, AnyRules, Refusal, parse_ip, rules_from_doc
from protocol.acl.check import is_v2
from protocol.acl.migrate import import_plain_acl
from protocol.acl.model import model_to_obj
from protocol.acl.rules import IPAddress, rules_from_obj
from protocol.codes import ResponseCode
from protocol.command import RemotingCommand

# Not broker.logs.get_logger: this module sits at the bottom of the broker's layers (the
# configuration checks the file with it), beside broker.logs, which it may not import.
_log: structlog.typing.FilteringBoundLogger = structlog.get_logger(component="acl")
#: The broker's or name server's decision: None = the request runs.
Decide = Callable[[AnyRules, RemotingCommand, IPAddress | None], Refusal | None]
#: Largest ACL file read (a file of thousands of accounts is far smaller).
MAX_FILE_SIZE = 4 * 1024 * 1024


class AclFileError(ValueError):
    """The ACL file cannot be read or is not a valid ACL document."""


def _load_doc(path: Path) -> object:
    """The YAML document in the file at ``path``.

    Raises:
        AclFileError: unreadable, too large, or not YAML.
    """
    try:
        with path.open("rb") as file:
            data = file.read(MAX_FILE_SIZE + 1)
    except OSError as exc:
        raise AclFileError(f"ACL file {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_SIZE:
        raise AclFileError(f"ACL file {path}: larger than {MAX_FILE_SIZE} bytes")
    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise AclFileError(f"ACL file {path}: not YAML: {exc}") from None


def load_rules(path: Path) -> AnyRules:
    """Read and validate the ACL file at ``path``, of either format.

    Raises:
        AclFileError: unreadable, too large, not YAML, or not a valid ACL document.
    """
    doc = _load_doc(path)
    try:
        return rules_from_doc(doc)
    except AclConfigError as exc:
        raise AclFileError(f"ACL file {path}: {exc}") from None


def _summary(rules: AnyRules) -> dict[str, object]:
    """What the log says of the rules in force."""
    if isinstance(rules, AclRules):
        return {"format": "plain_acl.yml", "accounts": len(rules.accounts),
                "global_white": len(rules.global_white)}  # fmt: skip
    return {"format": "2.0", "users": len(rules.users), "acls": len(rules.acls)}


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


def peer_ip(peer: str) -> IPAddress | None:
    """The IP address of a ``host:port`` peer name (None when it is not one)."""
    host, sep, _ = peer.rpartition(":")
    return parse_ip(host) if sep else None


class AclGuard:
    """The rules of one ACL file and the check every request passes (module docstring).

    Args:
        path: the ``plain_acl.yml`` file.
        decide: the server's decision function.
        check_interval_s: the file is looked at no more often than this.
        clock: seconds, for the interval (monotonic).

    Raises:
        AclFileError: the file is not valid at start-up (later, a bad file is only logged).
    """

    def __init__(
        self,
        path: Path,
        decide: Decide,
        *,
        check_interval_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.decide = decide
        self.check_interval_s = check_interval_s
        self._clock = clock
        self._stamp = _stamp(path)
        self.rules = load_rules(path)
        self._checked = clock()
        #: Successful reloads since the start.
        self.reloads = 0
        #: Requests refused since the start.
        self.refused = 0
        self._logged_at = -float("inf")
        self._unlogged = 0
        _log.info("ACL on", file=str(path), **_summary(self.rules))

    def __call__(self, peer: str, cmd: RemotingCommand) -> RemotingCommand | None:
        """None if ``cmd`` from ``peer`` (``host:port``) may run, else its refusal."""
        if self._clock() - self._checked >= self.check_interval_s:
            self.check_file()
        refusal = self.decide(self.rules, cmd, peer_ip(peer))
        if refusal is None:
            return None
        self._refused(peer, cmd, refusal)
        return cmd.response(ResponseCode.NO_PERMISSION, refusal.remark)

    def refusal(
        self, peer: str, decide: Callable[[AnyRules, IPAddress | None], Refusal | None]
    ) -> Refusal | None:
        """Run another front end's decision (gRPC) over the current rules: None if the call
        may run, else its refusal (counted and logged like a Remoting one)."""
        if self._clock() - self._checked >= self.check_interval_s:
            self.check_file()
        refusal = decide(self.rules, peer_ip(peer))
        if refusal is not None:
            self._refused(peer, None, refusal)
        return refusal

    def check_file(self) -> bool:
        """Reload the file if it changed; True if new rules are in force."""
        self._checked = self._clock()
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            rules = load_rules(self.path)
        except AclFileError as exc:
            _log.error("ACL file not reloaded: the previous rules stay", error=str(exc))
            return False
        self.rules = rules
        self.reloads += 1
        _log.info("ACL file reloaded", file=str(self.path), **_summary(rules))
        return True

    def _refused(self, peer: str, cmd: RemotingCommand | None, refusal: Refusal) -> None:
        """Count a refusal and write its audit line, unless one was written within the last
        second (then only count what was not logged)."""
        self.refused += 1
        now = self._clock()
        if now - self._logged_at < 1.0:
            self._unlogged += 1
            return
        code = None if cmd is None else cmd.code
        _log.info("request refused", peer=peer, code=code, access_key=refusal.access_key[:64],
                  reason=refusal.remark, not_logged_before=self._unlogged)  # fmt: skip
        self._logged_at, self._unlogged = now, 0


# ------------------------------------------------------------------ python -m broker.acl
def import_file(path: Path) -> tuple[str, tuple[str, ...]]:
    """The ACL 2.0 YAML text of the ``plain_acl.yml`` at ``path``, and the notes on what it
    decides differently (:mod:`protocol.acl.migrate`).

    Raises:
        AclFileError: the file cannot be read, is not a valid plain_acl.yml, or uses what
            ACL 2.0 cannot express.
    """
    doc = _load_doc(path)
    try:
        if is_v2(doc):
            raise AclConfigError("already an ACL 2.0 file (users, acls)")
        imported = import_plain_acl(rules_from_obj(doc))
    except AclConfigError as exc:
        raise AclFileError(f"ACL file {path}: {exc}") from None
    head = f"# ACL 2.0 rules imported from {path.name} (python -m broker.acl import)\n"
    body = yaml.safe_dump(
        model_to_obj(imported.model), sort_keys=False, allow_unicode=True, default_flow_style=None
    )
    return head + body, imported.notes


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m broker.acl import PLAIN_ACL_YML``: the ACL 2.0 file on standard output,
    notes and errors on standard error; exit status 1 on error."""
    parser = argparse.ArgumentParser(prog="python -m broker.acl", description="ACL file tools")
    commands = parser.add_subparsers(dest="command", required=True)
    imports = commands.add_parser(
        "import", help="print a plain_acl.yml (ACL 1.0) as an equivalent ACL 2.0 file"
    )
    imports.add_argument("file", type=Path, help="the plain_acl.yml to read")
    args = parser.parse_args(argv)
    try:
        text, notes = import_file(args.file)
    except AclFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
