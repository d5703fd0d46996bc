"""Prometheus ``/metrics`` of the latency events (docs/design.md §8), off the request path.

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

import bisect
import itertools
import math
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from broker.logs import get_logger
from broker.metrics import FIELD_NAMES, MetricsStatistics, MetricsWriter

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
_LE = [*map(floatToGoString, BUCKETS_S), "+Inf"]

_KIND, _TOPIC, _GROUP, _LATENCY, _MODE, _FOUND = (
    FIELD_NAMES.index(name)
    for name in ("kind", "topic", "group", "latency_ms", "wake_mode", "found")
)


class _WriterStatistics(Collector):
    """The event writer's own counters, read at scrape time."""

    def __init__(self, statistics: Callable[[], MetricsStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[CounterMetricFamily]:
        stats = self._statistics()
        yield CounterMetricFamily(
            "trimq_metrics_events_written", "Latency events written to the event files.",
            value=stats.written,
        )  # fmt: skip
        yield CounterMetricFamily(
            "trimq_metrics_events_dropped",
            "Latency events dropped (buffer full or write error); absent from these metrics too.",
            value=stats.dropped,
        )


#: A front end's refusal counters by reason (``ServerState.refusal_counts`` and the gRPC
#: server's) and its open connections, read at scrape time from the exporter's thread.
RefusalSource = tuple[Callable[[], Mapping[str, int]], Callable[[], int]]


class _ServerCounters(Collector):
    """Refusals by port and reason, and open connections by port: what an operator looks at
    when clients are turned away (limits, TLS, ACL, load shedding)."""

    def __init__(self, sources: Mapping[str, RefusalSource]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        refusals = CounterMetricFamily(
            "trimq_refusals",
            "Connections and requests turned away, by port and reason.",
            labels=("port", "reason"),
        )
        connections = GaugeMetricFamily(
            "trimq_connections", "Connections open now, by port.", labels=("port",)
        )
        for port, (counts, open_now) in self._sources.items():
            for reason, count in counts().items():
                refusals.add_metric((port, reason), count)
            connections.add_metric((port,), open_now())
        yield refusals
        yield connections


class _Series:
    """One label set's counts; ``buckets[i]`` counts values in (BUCKETS_S[i-1], BUCKETS_S[i]]
    (not cumulative: that is done at scrape time), the last one those above every bound."""

    __slots__ = ("buckets", "count", "sum_s", "wasted")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BUCKETS_S) + 1)
        self.count = 0
        self.sum_s = 0.0
        self.wasted = 0


class EventExporter(Collector):
    """Counters and a histogram of latency events, in a registry of their own.

    A collector of its own rather than prometheus-client's ``Counter``/``Histogram``: those
    take a lock and walk every bucket per observation (measured 2.3 µs an event, against the
    writer's own ~4 µs to encode and write it, all under the GIL the trio thread needs); here
    an event is a dict lookup, a bisect and three additions (0.5 µs), and the cumulative
    buckets are built when scraped (1.5 ms for 100 series). :meth:`observe` runs in the
    metrics writer's flush thread, :meth:`collect` in the HTTP server's; a lock keeps a
    scrape from seeing half a batch.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        writer_statistics: Callable[[], MetricsStatistics] | None = None,
        max_series: int = MAX_SERIES,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.max_series = max_series
        self._series: dict[tuple[str, str, str, str], _Series] = {}
        self._pairs: set[tuple[str, str]] = set()
        self._lock = threading.Lock()
        self.registry.register(self)
        if writer_statistics is not None:
            self.registry.register(_WriterStatistics(writer_statistics))

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
        with self._lock:
            for row in rows:
                topic, group = self._where(row[_TOPIC], row[_GROUP])
                key = (str(row[_KIND]), str(row[_MODE]), topic, group)
                series = self._series.get(key)
                if series is None:
                    series = self._series[key] = _Series()
                seconds = row[_LATENCY] / 1000.0
                if not math.isfinite(seconds):  # the writer drops such rows too
                    continue
                series.buckets[bisect.bisect_left(BUCKETS_S, seconds)] += 1
                series.count += 1
                series.sum_s += seconds
                if row[_FOUND] is False and row[_KIND] == "wakeup":
                    series.wasted += 1

    def collect(self) -> Iterator[Metric]:
        """The families at scrape time (prometheus-client's ``Collector`` interface)."""
        events = CounterMetricFamily(
            "trimq_events", "Latency events recorded, by kind.", labels=LABELS
        )
        latency = HistogramMetricFamily(
            "trimq_event_latency_seconds",
            "The span each event kind measures (docs/design.md §8), in seconds.",
            labels=LABELS,
        )
        wasted = CounterMetricFamily(
            "trimq_wasted_wakeups",
            "Parked pops woken that found nothing (wakeup events with found=false).",
            labels=("wake_mode", "topic", "group"),
        )
        with self._lock:
            for key, s in self._series.items():
                events.add_metric(key, s.count)
                cumulative = list(itertools.accumulate(s.buckets))
                buckets = [(_LE[i], float(n)) for i, n in enumerate(cumulative)]
                latency.add_metric(key, buckets, s.sum_s)
                if key[0] == "wakeup" and s.wasted:
                    wasted.add_metric(key[1:], s.wasted)
        yield events
        yield latency
        yield wasted


@asynccontextmanager
async def open_prometheus(
    host: str,
    port: int | None,
    writer: MetricsWriter,
    servers: Mapping[str, RefusalSource] | None = None,
) -> AsyncIterator[int | None]:
    """Serve ``/metrics`` on ``host:port`` (0 = any free port) while the block runs; yield
    the bound port, or None (and serve nothing) when ``port`` is None. ``servers``: the
    front ends' refusal counters and connection counts, by port name."""
    if port is None:
        yield None
        return
    exporter = EventExporter(writer_statistics=writer.statistics)
    if servers:
        exporter.registry.register(_ServerCounters(servers))
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
