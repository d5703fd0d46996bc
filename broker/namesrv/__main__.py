"""``python -m broker.namesrv`` / ``trimq-namesrv``. Not built yet: says so and exits 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``--host/--port``; the name server lands with the cluster issue."""
    p = argparse.ArgumentParser(prog="trimq-namesrv", description="trimq name server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=9876)
    p.parse_args(argv)
    print("trimq-namesrv: the name server is not implemented yet.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
