"""``python -m broker.namesrv`` / ``trimq-namesrv``: the name server (docs/design.md §10).

Settings come from defaults < ``--config`` TOML < ``TRIMQ_NAMESRV_<SETTING>`` environment <
flags. It prints one "namesrv started" log line with the bound address (``--port 0``: any
free port); SIGTERM and SIGINT stop it and it exits 0.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import trio

from broker.config import ConfigError
from broker.logs import configure
from broker.namesrv.app import NamesrvHandle, serve_namesrv
from broker.namesrv.config import NamesrvConfig, load

__all__ = ["main"]


async def run(config: NamesrvConfig) -> None:
    """Serve until SIGTERM/SIGINT."""
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            handle: NamesrvHandle = await nursery.start(serve_namesrv, config)
            async for _ in signals:
                handle.stop()
                break


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trimq-namesrv``."""
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"trimq-namesrv: {exc}", file=sys.stderr)
        return 2
    configure()
    try:
        trio.run(run, config)
    except Exception as exc:
        # Start-up failures (port in use, unreadable KV file) arrive wrapped by the nursery.
        errors = exc.exceptions if isinstance(exc, ExceptionGroup) else (exc,)
        if not all(isinstance(e, (OSError, ValueError)) for e in errors):
            raise
        for error in errors:
            print(f"trimq-namesrv: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
