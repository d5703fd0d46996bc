"""etcd's JSON gateway, sans-IO (protocol/etcd.py): requests as HTTP bytes, replies as
etcd 3.4.23 sent them (captured on loopback), framings split at every byte."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.ha.etcd import parse_endpoints
from protocol.etcd import (
    Compare,
    Delete,
    EtcdError,
    Get,
    Put,
    ResponseParser,
    Target,
    b64,
    decode_json_body,
    decode_lease_grant,
    decode_lease_keepalive,
    decode_range,
    decode_txn,
    encode_http,
    lease_grant,
    lease_keepalive,
    prefix_end,
    range_request,
    txn,
    unb64,
)

# Replies of etcd 3.4.23's gateway, as curl showed them (headers trimmed to what matters).
GRANT = (
    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 151\r\n\r\n"
    b'{"header":{"cluster_id":"15118495548433857066","member_id":"13668033151171901709",'
    b'"revision":"1","raft_term":"2"},"ID":"4111120217407555077","TTL":"3"}'
)
#: A keepalive of a lease that expired: no TTL in the result (chunked, as a stream).
KEEPALIVE_GONE_BODY = (
    b'{"result":{"header":{"cluster_id":"1","member_id":"2","revision":"1"},"ID":"123"}}\n'
)
TXN_LEASE_MISSING_BODY = (
    b'{"error":"etcdserver: requested lease not found","message":'
    b'"etcdserver: requested lease not found","code":5}'
)
TXN_FAILED = json.loads(
    '{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},'
    '"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"YQ==",'
    '"create_revision":"2","mod_revision":"2","version":"1","value":"Yg=="}],"count":"1"}}]}'
)
TXN_OK = json.loads(
    '{"header":{"cluster_id":"1","member_id":"2","revision":"2","raft_term":"2"},'
    '"succeeded":true,"responses":[{"response_put":{"header":{"revision":"2"}}}]}'
)


def _chunked(body: bytes, cuts: list[int]) -> bytes:
    out = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    start = 0
    for cut in [*cuts, len(body)]:
        piece = body[start:cut]
        if piece:
            out += f"{len(piece):x}\r\n".encode() + piece + b"\r\n"
        start = cut
    return out + b"0\r\n\r\n"


def test_request_bytes() -> None:
    data = encode_http(lease_grant(3), "127.0.0.1:2379")
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v3/lease/grant HTTP/1.1\r\nHost: 127.0.0.1:2379\r\n")
    assert b"Connection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert json.loads(body) == {"TTL": 3, "ID": 0}
    assert lease_keepalive(7).body == {"ID": "7"}  # int64 as a string, as the gateway wants


def test_txn_body() -> None:
    request = txn(
        [Compare(b"/m", Target.CREATE, 0), Compare(b"/i", Target.MOD, 12)],
        [Put(b"/m", b"v", lease=99), Delete(b"/c")],
        [Get(b"/m")],
    )
    assert request.path == "/kv/txn"
    assert request.body["compare"] == [
        {"key": b64(b"/m"), "target": "CREATE", "result": "EQUAL", "create_revision": "0"},
        {"key": b64(b"/i"), "target": "MOD", "result": "EQUAL", "mod_revision": "12"},
    ]
    assert request.body["success"] == [
        {"request_put": {"key": b64(b"/m"), "value": b64(b"v"), "lease": "99"}},
        {"request_delete_range": {"key": b64(b"/c")}},
    ]
    assert request.body["failure"] == [{"request_range": {"key": b64(b"/m")}}]
    value = Compare(b"/k", Target.VALUE, b"x").to_json()
    assert value["value"] == b64(b"x")
    assert "lease" not in Put(b"/k", b"v").to_json()["request_put"]  # no lease: none sent


def test_range_prefix() -> None:
    assert prefix_end(b"/a/") == b"/a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") == b"\x00"
    body = range_request(b"/a/", prefix=True).body
    assert unb64(body["range_end"]) == b"/a0"


def test_replies() -> None:
    parser = ResponseParser()
    parser.feed(GRANT)
    assert parser.done and parser.status == 200
    granted = decode_lease_grant(decode_json_body(parser.status, parser.body))
    assert (granted.lease_id, granted.ttl_s) == (4111120217407555077, 3)
    failed = decode_txn(TXN_FAILED)
    assert not failed.succeeded and failed.revision == 2
    (kv,) = failed.ranges[0].kvs
    assert (kv.key, kv.value, kv.create_revision, kv.mod_revision, kv.lease) == (
        b"a",
        b"b",
        2,
        2,
        0,
    )
    ok = decode_txn(TXN_OK)
    assert ok.succeeded and ok.revision == 2 and ok.ranges == ()
    empty = decode_range({"header": {"revision": "5"}})  # no "kvs": the key is absent
    assert empty.revision == 5 and empty.kvs == ()


def test_keepalive_of_a_gone_lease_is_ttl_0() -> None:
    parser = ResponseParser()
    parser.feed(_chunked(KEEPALIVE_GONE_BODY, [10]))
    assert parser.done
    assert decode_lease_keepalive(decode_json_body(200, parser.body)) == 0
    assert decode_lease_keepalive({"result": {"ID": "1", "TTL": "3"}}) == 3


def test_errors() -> None:
    with pytest.raises(EtcdError) as caught:
        decode_json_body(404, TXN_LEASE_MISSING_BODY)
    assert caught.value.grpc_code == 5 and caught.value.status == 404
    assert not caught.value.retriable_elsewhere  # a definite answer
    unavailable = decode_json_body
    with pytest.raises(EtcdError) as caught:
        unavailable(503, b'{"error":"etcdserver: no leader","code":14}')
    assert caught.value.retriable_elsewhere
    with pytest.raises(EtcdError):
        decode_json_body(200, b"[1]")
    with pytest.raises(EtcdError):
        decode_json_body(200, b"not json")
    with pytest.raises(EtcdError):
        decode_lease_grant({"header": {}})
    with pytest.raises(EtcdError):
        unb64("***")


def test_malformed_http() -> None:
    for bad in (b"SMTP ready\r\n\r\n", b"HTTP/1.1 abc OK\r\n\r\n", b"HTTP/1.1 200 OK\r\nX\r\n\r\n"):
        with pytest.raises(EtcdError):
            ResponseParser().feed(bad)
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
    with pytest.raises(EtcdError):
        parser.eof()  # cut short
    parser = ResponseParser()
    parser.feed(b"HTTP/1.1 200 OK\r\n\r\n{}")
    parser.eof()  # framed by the end of the connection
    assert parser.done and parser.body == b"{}"


@given(st.data())
def test_any_split_and_chunking(data: st.DataObject) -> None:
    body = json.dumps({"result": {"TTL": "3", "pad": "x" * data.draw(st.integers(0, 300))}})
    raw_body = body.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw_body)), max_size=5)))
    for reply in (_chunked(raw_body, cuts), GRANT):
        splits = sorted(data.draw(st.lists(st.integers(0, len(reply)), max_size=6)))
        parser = ResponseParser()
        start = 0
        for cut in [*splits, len(reply)]:
            parser.feed(reply[start:cut])
            start = cut
        assert parser.done
        if reply is not GRANT:
            assert parser.body == raw_body


def test_endpoints() -> None:
    assert parse_endpoints("http://127.0.0.1:2379, 10.0.0.2:2379/") == [
        "127.0.0.1:2379",
        "10.0.0.2:2379",
    ]
    for bad in ("", "http://host", "https://h:1", "h:0", "h:99999"):
        with pytest.raises(ValueError, match=r"etcd|HOST:PORT|TLS"):
            parse_endpoints(bad)
