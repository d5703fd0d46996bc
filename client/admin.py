"""``trimq-admin``: the mqadmin-like CLI. Not built yet: says so and exits 2."""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The admin CLI lands with the client issue."""
    print("trimq-admin: the admin CLI is not implemented yet.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
