"""What a command produces: a JSON document and the human text, printed by ``main``.

Tables follow mqadmin's look: a header row of ``#Name`` columns, values left-aligned and
padded to the widest cell (mqadmin uses fixed ``%-32s`` widths, which break on long names).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass

_GAP = "  "


@dataclass(frozen=True, slots=True)
class Result:
    """A command's outcome: ``doc`` for ``--json``, ``text`` for a terminal."""

    doc: object
    text: str

    def render(self, *, as_json: bool) -> str:
        """The text to print (one JSON document with ``as_json``)."""
        if as_json:
            return json.dumps(self.doc, indent=2, sort_keys=False, ensure_ascii=False)
        return self.text


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns; ``headers`` get a ``#`` prefix as mqadmin prints them."""
    cells = [[f"#{h}" for h in headers], *[[str(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        _GAP.join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in cells
    ]
    return "\n".join(lines)


def key_values(pairs: Sequence[tuple[str, object]]) -> str:
    """mqadmin's ``%-20s %s`` key/value lines."""
    return "\n".join(f"{key + ':':<20} {value}" for key, value in pairs)


def format_ms(ms: int) -> str:
    """An epoch-ms time as mqadmin prints it (``UtilAll.timeMillisToHumanString2``), local
    time; 0 or less is ``-`` (never set)."""
    if ms <= 0:
        return "-"
    seconds, millis = divmod(ms, 1000)
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds)) + f",{millis:03d}"
