"""Access to the frames real RocketMQ clients sent and accepted, byte for byte.

``tests/fixtures/captures`` is a copy of ``../shared/reference/captures``: three Remoting
clients (ali-ons in JavaScript, client-cpp 1.x and 2.1) talking to a scripted stub. File
names say what each frame is: ``…-code<N>.hex`` is a request with code N and
``…-resp<N>-<C>.hex`` the response (code C) the client accepted for its request N.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from protocol.command import RemotingCommand
from protocol.frame import FrameDecoder

CAPTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
_NAME = re.compile(r"-(?:code(?P<req>\d+)|resp(?P<for>\d+)-(?P<resp>\d+))\.hex$")


@dataclass(frozen=True)
class Capture:
    """One captured frame and what its file name says it is."""

    path: Path
    raw: bytes
    is_response: bool
    code: int  # request code, or the response code for responses
    request_code: int  # for responses: the code of the request answered

    @property
    def client(self) -> str:
        return self.path.parent.name if self.path.parent != CAPTURES else self.path.stem

    def decode(self) -> RemotingCommand:
        decoder = FrameDecoder()
        decoder.feed(self.raw)
        cmd = decoder.next_command()
        assert cmd is not None and decoder.buffered == 0 and decoder.next_command() is None
        return cmd


def _load(path: Path) -> Capture:
    raw = bytes.fromhex("".join(path.read_text().split()))
    if path.name.endswith("-first-request.hex"):
        return Capture(path, raw, False, 105, 105)
    m = _NAME.search(path.name)
    assert m is not None, path.name
    if m["req"] is not None:
        return Capture(path, raw, False, int(m["req"]), int(m["req"]))
    return Capture(path, raw, True, int(m["resp"]), int(m["for"]))


def all_captures() -> list[Capture]:
    """Every captured frame, sorted by path."""
    return [_load(p) for p in sorted(CAPTURES.rglob("*.hex"))]


def capture(name: str) -> Capture:
    """One capture by file name."""
    (path,) = CAPTURES.rglob(name)
    return _load(path)
