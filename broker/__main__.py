"""``python -m broker`` / ``trimq-broker``: the broker daemon's command line (DESIGN.md §10).

The command line is a contract, so it is parsed in full already; the server itself lands
with the broker issue. Until then this says so plainly and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The broker's flags, exactly as DESIGN.md §10 lists them."""
    p = argparse.ArgumentParser(prog="trimq-broker", description="trimq broker daemon")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=10911, help="port (0 = any free port)")
    p.add_argument("--data-dir", default="./data", help="commit log, queues, offsets")
    p.add_argument("--broker-name", default="broker-a")
    p.add_argument("--cluster", default="DefaultCluster")
    p.add_argument("--advertise", default=None, help="HOST:PORT put into routes")
    p.add_argument("--namesrv-addr", default=None, help='"h1:9876;h2:9876"')
    p.add_argument("--wake-mode", choices=("targeted", "topic", "none"), default="targeted")
    p.add_argument("--retry-naming", choices=("v2", "v1"), default="v2")
    p.add_argument("--flush", choices=("async", "sync"), default="async")
    p.add_argument("--metrics-dir", default=None)
    p.add_argument("--config", default=None, help="broker.toml")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line; the server is not built yet, so report that and exit 2."""
    build_parser().parse_args(argv)
    print(
        "trimq-broker: the broker server is not implemented yet (it lands with the broker "
        "issue); only the protocol package exists so far.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
