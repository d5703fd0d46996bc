"""Direct socket reads and writes (broker/sockio.py) and the Remoting writes built on them."""

from __future__ import annotations

import socket

import pytest
import trio
import trio.lowlevel
import trio.testing

from broker.remoting.connection import _send_frames
from broker.sockio import SocketReader, raw_socket, send_now


def _pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    for s in (a, b):  # small buffers: a big write cannot be taken at once
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    return trio.SocketStream(a), trio.SocketStream(b)


async def test_only_a_plain_socket_stream_has_a_raw_socket() -> None:
    left, right = _pair()
    async with left, right:
        assert raw_socket(left) is left.socket
    memory, _ = trio.testing.memory_stream_pair()
    assert raw_socket(memory) is None


async def test_frames_larger_than_the_socket_takes_arrive_whole_and_in_order() -> None:
    left, right = _pair()
    sock = raw_socket(left)
    frames = [bytes([i]) * (1000 + 37 * i) for i in range(200)] + [b"z" * 600_000]
    expected = b"".join(frames)
    received = bytearray()

    async def read_all() -> None:
        with trio.fail_after(30):
            while len(received) < len(expected):  # bounded by the deadline
                chunk = await right.receive_some(65536)
                assert chunk
                received.extend(chunk)
                await trio.lowlevel.checkpoint()  # a slow reader: the writer meets a full socket

    async with left, right, trio.open_nursery() as nursery:
        nursery.start_soon(read_all)
        with trio.fail_after(30):
            await _send_frames(left, frames, sock)
    assert bytes(received) == expected


async def test_a_read_that_found_data_still_lets_others_run() -> None:
    left, right = _pair()
    sock = raw_socket(right)
    assert sock is not None
    async with left, right:
        await left.send_all(b"a" * 100)
        reader = SocketReader(sock, 10)
        with trio.testing.assert_checkpoints():  # a cancel point and a schedule point
            assert await reader.receive_some() == b"a" * 10  # data ready: no wait


async def test_end_of_stream_closed_and_broken_sockets() -> None:
    left, right = _pair()
    sock = raw_socket(right)
    assert sock is not None
    reader = SocketReader(sock, 100)
    await left.send_all(b"last")
    await left.aclose()
    assert await reader.receive_some() == b"last"  # less than asked: drained, waits first
    assert await reader.receive_some() == b""
    with pytest.raises(trio.BrokenResourceError):  # the peer is gone: EPIPE
        send_now(sock, b"x")
    await right.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await reader.receive_some()
    with pytest.raises(trio.ClosedResourceError):
        send_now(sock, b"x")


async def test_after_a_short_read_the_next_one_waits_for_data() -> None:
    left, right = _pair()
    sock = raw_socket(right)
    assert sock is not None
    reader = SocketReader(sock, 100)
    async with left, right, trio.open_nursery() as nursery:
        await left.send_all(b"0123456789")
        assert await reader.receive_some() == b"0123456789"  # short: the socket is empty

        async def later() -> None:
            await trio.testing.wait_all_tasks_blocked()  # the reader is parked
            await left.send_all(b"abcde")

        nursery.start_soon(later)
        with trio.fail_after(5):
            assert await reader.receive_some() == b"abcde"
