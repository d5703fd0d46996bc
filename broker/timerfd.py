"""A Linux timerfd: a wake-up at a precise time that trio can wait on like a socket.

Why: trio's timeouts reach the kernel as ``epoll_wait``'s timeout, which is whole
milliseconds rounded up, so a deadline fired 1.0-1.3 ms late at the median here (measured in
docs/benchmarks.md), which is most of a pop revive's "retry visible past its deadline". A
timerfd is armed in nanoseconds and becomes readable within the kernel's timer slack.

Python 3.11 has no ``os.timerfd_*`` (3.13 does), so the two calls go through ``ctypes`` to the
C library; :meth:`TimerFd.open` returns None where that is not possible (not Linux, no such
symbols), and the caller keeps trio's timeouts.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable

import trio

_CLOCK_MONOTONIC = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerFd:
    """One-shot relative timer (:meth:`arm`) whose expiry :meth:`wait` waits for."""

    def __init__(self, fd: int, settime: Callable[..., int]) -> None:
        self.fd = fd
        self._settime = settime

    @classmethod
    def open(cls) -> TimerFd | None:
        """A new timer, or None where timerfds cannot be had."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create, settime = libc.timerfd_create, libc.timerfd_settime
        except (OSError, AttributeError):
            return None
        fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        return cls(fd, settime)

    def arm(self, wait_s: float) -> None:
        """Expire once, ``wait_s`` from now (at least a nanosecond: zero would disarm)."""
        ns = max(1, int(wait_s * 1e9))
        self._set(ns // 1_000_000_000, ns % 1_000_000_000)

    def disarm(self) -> None:
        """Expire never (until armed again)."""
        self._set(0, 0)

    def _set(self, sec: int, nsec: int) -> None:
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, nsec))
        if self._settime(self.fd, 0, ctypes.byref(spec), None) < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    async def wait(self) -> None:
        """Wait until the timer expires (an expiry since the last wait counts)."""
        while True:  # bounded: each round waits for the descriptor to be readable
            try:
                os.read(self.fd, 8)  # the expiry count: reading it clears readability
                return
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.fd)

    def close(self) -> None:
        """Close the descriptor (tell trio first: a task may be waiting on it)."""
        if self.fd >= 0:
            trio.lowlevel.notify_closing(self.fd)
            os.close(self.fd)
            self.fd = -1
