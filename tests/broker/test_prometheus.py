"""Prometheus ``/metrics`` (broker/prometheus.py): counters from the writer's rows, the
setting, and a real broker's HTTP endpoint after a pop and an ack over TCP."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from broker.config import BrokerConfig, ConfigError, from_sources, load
from broker.metrics import EventKind, MetricsStatistics, MetricsWriter
from broker.prometheus import OTHER, EventExporter
from protocol.codes import RequestCode, ResponseCode
from tests.broker.client import open_broker, open_client
from tests.broker.pop_client import ack, pop
from tests.broker.test_pop import create_topic
from tests.broker.test_timers import send


def writer_with(exporter: EventExporter, tmp_path: Path) -> MetricsWriter:
    writer = MetricsWriter(tmp_path, broker="b", wake_mode="topic", clock_ms=lambda: 1e12)
    writer.observers.append(exporter.observe)
    return writer


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_rows_become_counters_histograms_and_wasted_wakeups(tmp_path: Path) -> None:
    exporter = EventExporter(writer_statistics=lambda: MetricsStatistics(7, 2, 0, 0, 0))
    writer = writer_with(exporter, tmp_path)
    for latency_ms, found in ((0.3, True), (1.5, False), (40.0, False)):
        writer.emit(EventKind.WAKEUP, topic="T", group="g", latency_ms=latency_ms, found=found)
    writer.emit(EventKind.ACK, topic="T", group="g", latency_ms=2000.0, queue=1)
    writer.emit(EventKind.ACK, topic="T", group="g", latency_ms=90_000.0, queue=1)
    assert sample(exporter.registry, "trimq_events_total", kind="wakeup") is None  # not flushed
    writer.flush_nowait()
    reg = exporter.registry
    wake = {"kind": "wakeup", "wake_mode": "topic", "topic": "T", "group": "g"}
    assert sample(reg, "trimq_events_total", **wake) == 3
    assert sample(reg, "trimq_event_latency_seconds_count", **wake) == 3
    assert sample(reg, "trimq_event_latency_seconds_sum", **wake) == pytest.approx(0.0418)
    assert sample(reg, "trimq_event_latency_seconds_bucket", **wake, le="0.0005") == 1
    assert sample(reg, "trimq_event_latency_seconds_bucket", **wake, le="0.002") == 2
    assert sample(reg, "trimq_event_latency_seconds_bucket", **wake, le="0.05") == 3
    assert sample(reg, "trimq_wasted_wakeups_total", wake_mode="topic", topic="T", group="g") == 2
    acked = {**wake, "kind": "ack"}  # 2 s sits in the le="2.0" bucket (bounds are inclusive)
    assert sample(reg, "trimq_event_latency_seconds_sum", **acked) == pytest.approx(92.0)
    assert sample(reg, "trimq_event_latency_seconds_bucket", **acked, le="2.0") == 1
    assert sample(reg, "trimq_event_latency_seconds_bucket", **acked, le="60.0") == 1
    assert sample(reg, "trimq_event_latency_seconds_bucket", **acked, le="+Inf") == 2
    assert sample(reg, "trimq_metrics_events_written_total") == 7
    assert sample(reg, "trimq_metrics_events_dropped_total") == 2


def test_label_pairs_are_capped(tmp_path: Path) -> None:
    exporter = EventExporter(max_series=2)
    writer = writer_with(exporter, tmp_path)
    for group in ("g1", "g2", "g3", "g4"):
        writer.emit(EventKind.ACK, topic="T", group=group, latency_ms=1.0)
    writer.emit(EventKind.STORE, topic="T", latency_ms=1.0)  # group None -> ""
    writer.flush_nowait()
    reg = exporter.registry
    base = {"kind": "ack", "wake_mode": "topic"}
    assert sample(reg, "trimq_events_total", **base, topic="T", group="g2") == 1
    assert sample(reg, "trimq_events_total", **base, topic="T", group="g3") is None
    assert sample(reg, "trimq_events_total", **base, topic=OTHER, group=OTHER) == 2
    store = {"kind": "store", "wake_mode": "topic"}
    assert sample(reg, "trimq_events_total", **store, topic=OTHER, group=OTHER) == 1


def test_a_failing_observer_does_not_stop_the_event_files(tmp_path: Path) -> None:
    writer = MetricsWriter(tmp_path, broker="b", wake_mode="none")

    def broken(rows: object) -> None:
        raise RuntimeError("bug")

    writer.observers.append(broken)
    with capture_logs() as logs:
        for _ in range(3):
            writer.emit(EventKind.ACK, topic="T", latency_ms=1.0)
            assert writer.flush_nowait() == 1
    # Logged the 1st and 2nd time, not the 3rd (then the 4th, 8th ...): no flood per flush.
    assert [e["errors"] for e in logs if e["event"] == "metrics observer failed"] == [1, 2]
    stats = writer.statistics()
    assert (stats.observer_errors, stats.written) == (3, 3)


def test_prometheus_port_setting(tmp_path: Path) -> None:
    assert BrokerConfig().prometheus_port is None
    assert load(["--prometheus-port", "0"], env={}).prometheus_port == 0
    assert from_sources(env={"TRIMQ_PROMETHEUS_PORT": "9100"}).prometheus_port == 9100
    toml = tmp_path / "broker.toml"
    toml.write_text("prometheus_port = 5557\n")
    assert from_sources(toml_path=toml, env={}).prometheus_port == 5557
    with pytest.raises(ConfigError, match="prometheus_port"):
        from_sources(env={"TRIMQ_PROMETHEUS_PORT": "70000"})


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """GET /metrics (blocking: run it in a thread) as {(sample name, labels): value}."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def labels(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


async def test_broker_serves_metrics_of_a_pop_and_an_ack(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(tmp_path, prometheus_port=0) as broker:
            port = broker.prometheus_port
            assert port is not None and port > 0
            async with open_client(broker.port) as consumer, open_client(broker.port) as producer:
                await create_topic(consumer, "T")
                async with trio.open_nursery() as nursery:

                    async def later() -> None:
                        # Send once the pop is parked (so a wake-up happens), however slow
                        # the machine: the condition itself, not a guess at its timing.
                        for _ in range(2_000):  # bounded: 20 s at most
                            if broker.statistics().core.pop.hub.parked == 1:
                                break
                            await trio.sleep(0.01)
                        await send(producer, "T", b"m")

                    nursery.start_soon(later)
                    reply, (got,) = await pop(consumer, "g", "T", poll_ms=5_000)
                assert reply.code == ResponseCode.SUCCESS
                assert (await ack(consumer, "g", got)).code == ResponseCode.SUCCESS
            where = {"wake_mode": "targeted", "topic": "T", "group": "g"}
            ack_count = ("trimq_events_total", labels(kind="ack", **where))
            found: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
            for _ in range(100):  # the writer flushes every 0.2 s: at most ~10 s
                found = await trio.to_thread.run_sync(scrape, port)
                if found.get(ack_count):
                    break
                await trio.sleep(0.1)
            assert found[ack_count] == 1
            assert found[("trimq_events_total", labels(kind="wakeup", **where))] == 1
            assert found[("trimq_events_total", labels(kind="pop_wait", **where))] == 1
            waited = found[("trimq_event_latency_seconds_sum", labels(kind="pop_wait", **where))]
            assert 0 < waited < 20  # the park lasted until the send
            pop_wait = labels(kind="pop_wait", le="+Inf", **where)
            assert found[("trimq_event_latency_seconds_bucket", pop_wait)] == 1
            assert found[("trimq_event_latency_seconds_count", labels(kind="ack", **where))] == 1
            assert ("trimq_wasted_wakeups_total", labels(**where)) not in found
            assert found[("trimq_metrics_events_written_total", labels())] >= 3
        # Stopped with the broker: the port no longer answers.
        with pytest.raises(urllib.error.URLError, match="refused"):
            await trio.to_thread.run_sync(scrape, port)


async def test_refusals_by_port_and_reason_and_open_connections(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with open_broker(tmp_path, prometheus_port=0, max_connections_per_ip=1) as broker:
            port = broker.prometheus_port
            assert port is not None
            async with open_client(broker.port) as client:
                # Counted as open once it has spoken (its first byte tells TLS or not).
                route = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
                assert route.code == ResponseCode.SUCCESS
                async with open_client(broker.port) as turned_away:
                    await turned_away.closed.wait()  # closed at once: one per address
                found = await trio.to_thread.run_sync(scrape, port)
                refusals = "trimq_refusals_total"
                assert found[(refusals, labels(port="remoting", reason="per_ip_limit"))] == 1
                assert found[(refusals, labels(port="remoting", reason="acl"))] == 0
                assert found[(refusals, labels(port="grpc", reason="per_ip_limit"))] == 0
                assert found[("trimq_connections", labels(port="remoting"))] == 1
                assert found[("trimq_connections", labels(port="grpc"))] == 0
