"""``python -m broker`` / ``trimq-broker``: the broker daemon (docs/design.md §10 command line).

Settings come from defaults < ``--config`` TOML < ``TRIMQ_<SETTING>`` environment < flags.
SIGTERM and SIGINT stop it gracefully (parked polls answered, store flushed and closed) and
it exits 0.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import trio

from broker.app import BrokerHandle, ListenError, serve_broker
from broker.config import BrokerConfig, ConfigError, build_parser, load
from broker.gc_tuning import collect_periodically, collect_young_periodically, tune_gc
from broker.gil_tuning import tune_switch_interval
from broker.ha.role import RoleConflict
from broker.logs import configure

__all__ = ["build_parser", "main"]


async def run(config: BrokerConfig) -> None:
    """Serve until SIGTERM/SIGINT, then stop gracefully."""
    tune_switch_interval(config.gil_switch_ms)  # before the worker threads start
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            handle: BrokerHandle = await nursery.start(serve_broker, config)
            if config.gc_full_collect_s > 0:
                tune_gc()  # after start-up, so what it built is frozen
                nursery.start_soon(collect_periodically, config.gc_full_collect_s)
                nursery.start_soon(collect_young_periodically)
            async for _ in signals:
                await handle.stop()
                nursery.cancel_scope.cancel()  # the collector's task
                break


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``trimq-broker``."""
    try:
        config = load(argv)
    except ConfigError as exc:
        print(f"trimq-broker: {exc}", file=sys.stderr)
        return 2
    configure()
    refused: list[BaseException] = []
    try:
        trio.run(run, config)
    except* (ListenError, RoleConflict) as group:
        refused += group.exceptions
    for error in refused:
        print(f"trimq-broker: {error}", file=sys.stderr)
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())
