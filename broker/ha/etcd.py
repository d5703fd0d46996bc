"""A small trio client of etcd's v3 JSON gateway (docs/ha.md): leases, range, txn.

The encoding is sans-IO in :mod:`protocol.etcd`; this module moves its bytes. Each call is
one HTTP/1.1 request on a fresh loopback/LAN TCP connection (``Connection: close``): calls
are few (a lease renewal every TTL/3, a poll of the master key a few times a second), and a
connection that was cut by a timeout can never hand a late reply to the next call.

Every call is bounded: one attempt gets ``attempt_timeout_s`` (a cancel scope), the whole
call ``call_timeout_s``. An endpoint that cannot be reached, times out, or answers
"unavailable" (no leader, no quorum) is left for the next one in the list, round robin,
until the call's time is up; a definite answer (lease not found, a compare that failed) is
returned or raised at once. A txn that timed out may still have been applied: callers make
their txns recognisable (the election reads back the key and its lease).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import trio

from broker.logs import get_logger
from protocol.etcd import (
    Compare,
    EtcdError,
    KeyValue,
    LeaseGranted,
    Operation,
    RangeResult,
    Request,
    ResponseParser,
    TxnResult,
    decode_json_body,
    decode_lease_grant,
    decode_lease_keepalive,
    decode_range,
    decode_txn,
    encode_http,
    lease_grant,
    lease_keepalive,
    lease_revoke,
    parse_endpoints,
    range_request,
    txn,
)

__all__ = ["EtcdClient", "EtcdError", "EtcdUnavailable", "KeyValue", "parse_endpoints"]

_log = get_logger("ha.etcd")


class EtcdUnavailable(EtcdError):
    """No endpoint answered within the call's time."""


@dataclass(frozen=True, slots=True)
class EtcdTimeouts:
    """Bounds of one call (see the module docstring)."""

    attempt_s: float = 1.0
    call_s: float = 3.0


class EtcdClient:
    """Calls to a list of etcd members with failover between them."""

    def __init__(self, endpoints: Sequence[str], timeouts: EtcdTimeouts | None = None) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self.endpoints = list(endpoints)
        self.timeouts = timeouts or EtcdTimeouts()
        #: The endpoint tried first (the last one that answered).
        self._current = 0
        #: Attempts that failed over to another endpoint (tests and logs read it).
        self.failovers = 0

    # ------------------------------------------------------------------ the calls
    async def lease_grant(self, ttl_s: int, *, timeout_s: float | None = None) -> LeaseGranted:
        """A new lease of ``ttl_s`` seconds."""
        return decode_lease_grant(await self._call(lease_grant(ttl_s), timeout_s))

    async def lease_keepalive(self, lease_id: int, *, timeout_s: float | None = None) -> int:
        """Renew ``lease_id``; its TTL after the renewal, 0 when it no longer exists."""
        return decode_lease_keepalive(await self._call(lease_keepalive(lease_id), timeout_s))

    async def lease_revoke(self, lease_id: int, *, timeout_s: float | None = None) -> None:
        """End ``lease_id`` now (its keys are deleted); a lease already gone is no error."""
        try:
            await self._call(lease_revoke(lease_id), timeout_s)
        except EtcdError as exc:
            if exc.grpc_code != 5:  # NOT_FOUND: expired already
                raise

    async def get(self, key: bytes, *, timeout_s: float | None = None) -> KeyValue | None:
        """``key``, or None when it does not exist."""
        result = await self.range(key, timeout_s=timeout_s)
        return result.kvs[0] if result.kvs else None

    async def range(
        self, key: bytes, *, prefix: bool = False, timeout_s: float | None = None
    ) -> RangeResult:
        """``key``, or every key under the prefix ``key``."""
        return decode_range(await self._call(range_request(key, prefix=prefix), timeout_s))

    async def txn(
        self,
        compare: list[Compare],
        success: list[Operation],
        failure: list[Operation] | None = None,
        *,
        timeout_s: float | None = None,
    ) -> TxnResult:
        """One atomic compare-and-set (see :func:`protocol.etcd.txn`)."""
        return decode_txn(await self._call(txn(compare, success, failure), timeout_s))

    # ------------------------------------------------------------------ transport
    async def _call(self, request: Request, timeout_s: float | None) -> dict[str, Any]:
        """``request``'s reply from the first endpoint that answers it (round robin)."""
        bound = self.timeouts.call_s if timeout_s is None else timeout_s
        last: EtcdError | None = None
        with trio.move_on_after(bound):
            # Bounded by the cancel scope; each endpoint is tried in turn, and a full round
            # of failures waits a little before the next (a member restarting, an election).
            for attempt in range(1_000_000):
                endpoint = self.endpoints[self._current]
                try:
                    with trio.fail_after(min(self.timeouts.attempt_s, bound)):
                        return await self._once(endpoint, request)
                except EtcdError as exc:
                    if not exc.retriable_elsewhere:
                        raise
                    last = exc
                except trio.TooSlowError:
                    last = EtcdError(f"{endpoint}: no reply within {self.timeouts.attempt_s} s")
                except (OSError, trio.BrokenResourceError) as exc:
                    last = EtcdError(f"{endpoint}: {exc}")
                self._current = (self._current + 1) % len(self.endpoints)
                self.failovers += 1
                if (attempt + 1) % len(self.endpoints) == 0:
                    await trio.sleep(0.05)
        raise EtcdUnavailable(f"etcd did not answer {request.path} within {bound} s: {last}")

    async def _once(self, endpoint: str, request: Request) -> dict[str, Any]:
        host, _, port = endpoint.rpartition(":")
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(encode_http(request, endpoint))
            parser = ResponseParser()
            while not parser.done:  # bounded by the attempt's cancel scope
                data = await stream.receive_some(65536)
                if not data:
                    parser.eof()
                    break
                parser.feed(data)
        return decode_json_body(parser.status, parser.body)
