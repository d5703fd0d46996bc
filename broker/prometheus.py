"""Prometheus ``/metrics`` of the latency events (DESIGN.md §8), off the request path.

Theory of operation: request handlers only append rows to the :class:`MetricsWriter` buffer,
as before. The writer's background flush — a worker thread — hands each batch it writes to
:meth:`EventExporter.observe`, which updates counters and histograms in a registry of its own
(never prometheus-client's global one, so brokers and tests in one process stay apart).
:func:`open_prometheus` serves that registry over HTTP on the configured host and port for
as long as the broker runs. Scrapes therefore lag the requests by at most one flush interval
(0.2 s), and the hot path pays nothing for them.

Names follow https://prometheus.io/docs/practices/naming: the ``trimq_`` prefix, seconds
(the events' milliseconds are converted), ``_total`` counters. Labels are ``kind``,
``wake_mode``, ``topic`` and ``group``: topics and consumer groups are operator-created names,
few per broker (RocketMQ's own exporter labels by ``topic`` and ``consumer_group`` too), and
retry traffic is labelled by its origin topic, so retry topics add no series. Queue ids,
message ids and clients are never labels. As a guard against a client creating groups
without bound, at most :data:`MAX_SERIES` (topic, group) pairs get their own series; the
rest share ``topic="_other", group="_other"``.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from broker.logs import get_logger
from broker.metrics import FIELD_NAMES, MetricsStats, MetricsWriter

_log = get_logger("prometheus")

#: Distinct (topic, group) label pairs before the rest fold into ``_other``.
MAX_SERIES = 1_000
OTHER = "_other"
#: Latency buckets, seconds: sub-millisecond wake-ups and stores up to the 15 s long-poll
#: timeout that a retry waits out in wake mode ``none`` (the seed's 14955 ms), and beyond.
BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5,
    1.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 60.0,
)  # fmt: skip
#: How long stopping the HTTP server may take (its serve loop polls every 0.5 s).
STOP_TIMEOUT_S = 3.0
LABELS = ("kind", "wake_mode", "topic", "group")

_KIND, _TOPIC, _GROUP, _LATENCY, _MODE, _FOUND = (
    FIELD_NAMES.index(name)
    for name in ("kind", "topic", "group", "latency_ms", "wake_mode", "found")
)


class _WriterStats(Collector):
    """The event writer's own counters, read at scrape time."""

    def __init__(self, stats: Callable[[], MetricsStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._stats()
        yield CounterMetricFamily(
            "trimq_metrics_events_written", "Latency events written to the event files.",
            value=stats.written,
        )  # fmt: skip
        yield CounterMetricFamily(
            "trimq_metrics_events_dropped",
            "Latency events dropped (buffer full or write error); absent from these metrics too.",
            value=stats.dropped,
        )


class EventExporter:
    """Counters and histograms of latency events, in a registry of their own.

    :meth:`observe` runs in the metrics writer's flush thread (one at a time: the writer
    holds its lock), never on the trio thread.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        writer_stats: Callable[[], MetricsStats] | None = None,
        max_series: int = MAX_SERIES,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_series = max_series
        self.events = Counter(
            "trimq_events", "Latency events recorded, by kind.", LABELS, registry=self.registry
        )
        self.latency = Histogram(
            "trimq_event_latency_seconds",
            "The span each event kind measures (DESIGN.md §8), in seconds.",
            LABELS,
            buckets=BUCKETS_S,
            registry=self.registry,
        )
        self.wasted = Counter(
            "trimq_wasted_wakeups",
            "Parked pops woken that found nothing (wakeup events with found=false).",
            ("wake_mode", "topic", "group"),
            registry=self.registry,
        )
        if writer_stats is not None:
            self.registry.register(_WriterStats(writer_stats))
        self._pairs: set[tuple[str, str]] = set()
        # Label lookups cost more than the increments: children are cached per label tuple.
        self._children: dict[tuple[str, ...], tuple[Any, Any]] = {}

    def _where(self, topic: str, group: str | None) -> tuple[str, str]:
        pair = (topic, group or "")
        if pair in self._pairs:
            return pair
        if len(self._pairs) < self.max_series:
            self._pairs.add(pair)
            return pair
        return (OTHER, OTHER)

    def observe(self, rows: Sequence[tuple[Any, ...]]) -> None:
        """Count a batch of event rows (``broker.metrics.FIELDS`` order)."""
        for row in rows:
            topic, group = self._where(row[_TOPIC], row[_GROUP])
            key = (str(row[_KIND]), str(row[_MODE]), topic, group)
            children = self._children.get(key)
            if children is None:
                children = (self.events.labels(*key), self.latency.labels(*key))
                self._children[key] = children
            children[0].inc()
            children[1].observe(row[_LATENCY] / 1000.0)
            if row[_KIND] == "wakeup" and row[_FOUND] is False:
                self.wasted.labels(key[1], topic, group).inc()


@asynccontextmanager
async def open_prometheus(
    host: str, port: int | None, writer: MetricsWriter
) -> AsyncIterator[int | None]:
    """Serve ``/metrics`` on ``host:port`` (0 = any free port) while the block runs; yield
    the bound port, or None (and serve nothing) when ``port`` is None."""
    if port is None:
        yield None
        return
    exporter = EventExporter(writer_stats=lambda: writer.stats)
    server, thread = start_http_server(port, addr=host, registry=exporter.registry)
    bound = int(server.server_address[1])
    writer.observers.append(exporter.observe)
    _log.info("prometheus exporter started", host=host, port=bound, path="/metrics")
    try:
        yield bound
    finally:
        writer.observers.remove(exporter.observe)
        await _stop(server.shutdown, thread)
        server.server_close()


async def _stop(shutdown: Callable[[], None], thread: threading.Thread) -> None:
    """Stop the serve loop from a worker thread (``shutdown`` blocks until the loop sees
    it), shielded and bounded: the broker is usually being cancelled when this runs."""
    with trio.CancelScope(shield=True), trio.move_on_after(STOP_TIMEOUT_S):
        await trio.to_thread.run_sync(shutdown, abandon_on_cancel=True)
        await trio.to_thread.run_sync(thread.join, STOP_TIMEOUT_S, abandon_on_cancel=True)
