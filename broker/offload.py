"""Where the broker runs blocking file work (fsync, snapshot and event-file writes).

In production that is a worker thread, so the trio thread keeps serving. Tests on trio's mock
clock (``autojump_clock``) inject :func:`run_inline` instead: the clock jumps whenever every
task is blocked, and a task waiting for a worker thread counts as blocked, so a thread doing a
few milliseconds of fsync would let virtual time race ahead to the next deadline — a test's
own timeout included.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import trio

T = TypeVar("T")


class Offload(Protocol):
    """Run ``fn()`` (blocking) and return its result; with ``abandon_on_cancel``, a
    cancellation may leave it running (a hung disk must not hang a shutdown)."""

    def __call__(
        self, fn: Callable[[], T], /, *, abandon_on_cancel: bool = False
    ) -> Awaitable[T]: ...


async def run_in_thread(fn: Callable[[], T], /, *, abandon_on_cancel: bool = False) -> T:
    """The production :class:`Offload`: a trio worker thread."""
    return await trio.to_thread.run_sync(fn, abandon_on_cancel=abandon_on_cancel)


async def run_inline(fn: Callable[[], T], /, *, abandon_on_cancel: bool = False) -> T:
    """The test :class:`Offload`: on the trio thread (a checkpoint first, as a thread hop
    would be one)."""
    await trio.lowlevel.checkpoint()
    return fn()
