"""TLS on the Remoting port (``--tls-mode``): permissive serves TLS and plaintext on one port,
enforcing closes plaintext, disabled serves plaintext only; a silent client holds nothing past
the first-byte deadline, and silent connections never delay a TLS client. Our clients (async
and the admin CLI) connect with TLS.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme

import broker.tls as tls_module
from broker.registration import Registrar
from client.config import ClientConfig
from client.message import Message
from client.producer import Producer
from client.simple_consumer import SimpleConsumer
from protocol.codes import RequestCode, ResponseCode
from tests.broker.client import BrokerClient, attach_client, open_broker, open_client
from tests.broker.grpc.client import client_ssl_context, connect_tls
from tests.client.harness import broker_thread, run
from tests.namesrv.support import open_namesrv, wait_until

pytestmark = pytest.mark.integration

TIMEOUT = 20


@dataclasses.dataclass
class Certs:
    ca: trustme.CA
    cert: Path
    key: Path


@pytest.fixture
def certs(tmp_path: Path) -> Certs:
    ca = trustme.CA()
    issued = ca.issue_cert("localhost", "127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    return Certs(ca, cert, key)


async def route_ok(client: BrokerClient) -> None:
    reply = await client.call(RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"})
    assert reply.code == ResponseCode.SUCCESS, reply.remark


async def tls_client_to(port: int, certs: Certs) -> trio.SSLStream[trio.SocketStream]:
    return await connect_tls(port, client_ssl_context(certs.ca.cert_pem.bytes(), alpn=()))


async def closed_without_answer(port: int, first: bytes) -> bool:
    """Whether the broker closes a connection that sent ``first`` without a reply."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    try:
        await stream.send_all(first)
        return await stream.receive_some(100) == b""
    except trio.BrokenResourceError:
        return True
    finally:
        await trio.aclose_forcefully(stream)


async def test_permissive_serves_tls_and_plaintext_on_one_port(
    tmp_path: Path, certs: Certs
) -> None:
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", tls_cert=certs.cert, tls_key=certs.key) as b:
            async with open_client(b.port) as plain:
                await route_ok(plain)
            async with attach_client(await tls_client_to(b.port, certs)) as secure:
                await route_ok(secure)
            assert b.statistics().remoting.tls == 1


async def test_enforcing_closes_plaintext_and_serves_tls(tmp_path: Path, certs: Certs) -> None:
    settings = {"tls_cert": certs.cert, "tls_key": certs.key, "tls_mode": "enforcing"}
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", **settings) as b:
            frame = b'\x00\x00\x00\x10\x00\x00\x00\x0c{"code":105}'  # any plaintext frame
            assert await closed_without_answer(b.port, frame)
            async with attach_client(await tls_client_to(b.port, certs)) as secure:
                await route_ok(secure)


async def test_disabled_serves_plaintext_only(tmp_path: Path, certs: Certs) -> None:
    settings = {"tls_cert": certs.cert, "tls_key": certs.key, "tls_mode": "disabled"}
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", **settings) as b:
            # A ClientHello is read as the start of a (huge) Remoting frame: no handshake.
            with trio.move_on_after(1.0) as waited:
                with contextlib.suppress(trio.BrokenResourceError, OSError):
                    await tls_client_to(b.port, certs)
                    pytest.fail("a TLS handshake succeeded with TLS disabled")
            assert waited.cancelled_caught or b.statistics().remoting.tls == 0
            async with open_client(b.port) as plain:
                await route_ok(plain)


async def test_silent_connections_are_dropped_and_never_delay_a_tls_client(
    tmp_path: Path, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tls_module, "FIRST_BYTE_TIMEOUT_S", 2.0)
    with trio.fail_after(TIMEOUT):
        async with open_broker(tmp_path / "data", tls_cert=certs.cert, tls_key=certs.key) as b:
            silent = [await trio.open_tcp_stream("127.0.0.1", b.port) for _ in range(50)]
            start = trio.current_time()
            async with attach_client(await tls_client_to(b.port, certs)) as secure:
                await route_ok(secure)
            # Served while the 50 wait for their first byte (each has its own deadline).
            assert trio.current_time() - start < 2.0
            for stream in silent:
                assert await stream.receive_some(100) == b""  # closed at the deadline
                await stream.aclose()


async def _produce_consume(config: ClientConfig) -> None:
    async with (
        SimpleConsumer(config, group="tls_group", subscription={"TlsTopic": "*"}) as consumer,
        Producer(config) as producer,
    ):
        await producer.send(Message("TlsTopic", b"over tls"))
        got = []
        for _ in range(10):  # bounded: each receive long-polls up to 2 s
            got += await consumer.receive(32, 30, await_duration=2)
            if got:
                break
        assert [m.body for m in got] == [b"over tls"]
        for m in got:
            await consumer.ack(m)


@pytest.mark.parametrize("mode", ["permissive", "enforcing"])
def test_our_clients_over_tls(tmp_path: Path, certs: Certs, mode: str) -> None:
    settings = {"tls_cert": certs.cert, "tls_key": certs.key, "tls_mode": mode}
    with broker_thread(tmp_path / "broker", **settings) as b:
        context = client_ssl_context(certs.ca.cert_pem.bytes(), alpn=())
        context.check_hostname = False  # the broker advertises 127.0.0.1
        config = ClientConfig(namesrv_addr=b.address, request_timeout=5.0, tls=context)
        run("trio", _produce_consume, config)


async def test_brokers_register_over_tls_with_an_enforcing_name_server(
    tmp_path: Path, certs: Certs
) -> None:
    ca_file = tmp_path / "ca.pem"
    certs.ca.cert_pem.write_to_path(str(ca_file))
    tls: dict[str, Any] = {"tls_mode": "enforcing", "tls_cert": certs.cert, "tls_key": certs.key}
    with trio.fail_after(TIMEOUT):
        async with open_namesrv(**tls) as namesrv:
            addr = f"127.0.0.1:{namesrv.port}"
            settings = {"namesrv_addr": addr, "register_interval_s": 0.2, "broker_name": "v"}
            async with (
                open_broker(tmp_path / "v", namesrv_tls=True, namesrv_tls_ca=ca_file, **settings)
                as verified,
                open_broker(tmp_path / "u", **{**settings, "broker_name": "u"}, namesrv_tls=True)
                as unverified,
                open_broker(tmp_path / "p", **{**settings, "broker_name": "p"}) as plaintext,
            ):  # fmt: skip
                registrars: list[Registrar] = []
                for handle in (verified, unverified, plaintext):
                    assert handle.registrar is not None
                    registrars.append(handle.registrar)
                await wait_until(
                    lambda: _true(all(r.registered[addr] >= 2 for r in registrars[:2])), 10
                )
                # The plaintext one was refused all along (enforcing closes plaintext).
                assert registrars[2].registered[addr] == 0 and addr in registrars[2].failing
                # The name server's routes came over TLS too.
                async with attach_client(await tls_client_to(namesrv.port, certs)) as client:
                    reply = await client.call(
                        RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "TBW102"}
                    )
                    assert reply.code == ResponseCode.SUCCESS, reply.remark
                    assert (
                        b'"v"' in reply.body and b'"u"' in reply.body and b'"p"' not in reply.body
                    )


async def _true(value: bool) -> bool:
    return value


async def test_a_name_server_certificate_that_does_not_verify_is_refused(
    tmp_path: Path, certs: Certs
) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    tls: dict[str, Any] = {"tls_mode": "enforcing", "tls_cert": certs.cert, "tls_key": certs.key}
    with trio.fail_after(TIMEOUT):
        async with open_namesrv(**tls) as namesrv:
            addr = f"127.0.0.1:{namesrv.port}"
            async with open_broker(
                tmp_path, namesrv_addr=addr, namesrv_tls=True, namesrv_tls_ca=other_ca
            ) as broker:
                registrar = broker.registrar
                assert registrar is not None
                await wait_until(lambda: _true(addr in registrar.failing), 10)
                assert registrar.registered[addr] == 0
