"""The commit log's newest bytes in memory, as a run of fixed-size chunks.

Why chunks and not one ``bytearray``: dropping the oldest bytes of a single buffer
(``del buf[:n]``) only moves CPython's start pointer, and the next append that needs the
buffer to grow then allocates a new one and copies the whole remaining tail into it, on the
put path: a 40-60 ms stall of the broker's thread about every 32 MiB appended at a 64 MiB
cache (docs/benchmarks.md, "The 40–50 ms e2e maximum"). Here the oldest bytes go as whole
chunks, and chunks are allocated at full size and never resized: an append copies only what
it adds. Dropped chunks are reused for new ones (a couple kept), so once the cache is full
appends allocate nothing and touch no fresh page.

Chunk ``k`` holds the log's bytes ``[k * chunk_size, (k + 1) * chunk_size)``; every chunk
but the last is full. Bytes below ``start`` in the first chunk are padding (the cache began
mid-chunk, at a recovered end) and never read.
"""

from __future__ import annotations

from collections.abc import Iterator

#: Largest chunk: small enough that a chunk's fresh pages are faulted in as it fills (no
#: burst of allocation), large enough that the list of chunks stays short.
MAX_CHUNK = 4 * 1024 * 1024


def chunk_size_for(cache_bytes: int) -> int:
    """A chunk size that trims a cache of ``cache_bytes`` in steps of about a sixteenth."""
    return max(4096, min(MAX_CHUNK, cache_bytes // 16))


class TailCache:
    """Bytes ``[start, end)`` of the log, appended at ``end``, dropped from ``start``."""

    def __init__(self, start: int, chunk_size: int) -> None:
        if chunk_size <= 0:
            raise ValueError("chunk_size must be positive")
        self.chunk_size = chunk_size
        #: dropped chunks kept for reuse: their pages are already faulted in
        self._spare: list[bytearray] = []
        self._chunks: list[bytearray] = []
        self.reset(start)

    def reset(self, start: int) -> None:
        """Forget every cached byte; the cache continues empty from ``start``."""
        self._retire(self._chunks)
        self.start = self.end = start
        self._first, self._fill = divmod(start, self.chunk_size)
        self._chunks = [self._new_chunk()]

    def _new_chunk(self) -> bytearray:
        return self._spare.pop() if self._spare else bytearray(self.chunk_size)

    def _retire(self, chunks: list[bytearray]) -> None:
        self._spare.extend(chunks[: 2 - len(self._spare)])

    def extend(self, parts: tuple[bytes, ...]) -> int:
        """Append ``parts`` at ``end``; return how many bytes they were."""
        last, pos, size = self._chunks[-1], self._fill, self.chunk_size
        added = 0
        for part in parts:
            n = len(part)
            stop = pos + n
            if stop <= size:  # the common case: a slice of equal length, no resize
                last[pos:stop] = part
                pos = stop
            else:
                last, pos = self._spill(part, pos)
            added += n
        self._fill = pos
        self.end += added
        return added

    def _spill(self, part: bytes, pos: int) -> tuple[bytearray, int]:
        """Write ``part`` from ``pos`` of the last chunk on, into new chunks past its end."""
        size = self.chunk_size
        last = self._chunks[-1]
        done = 0
        with memoryview(part) as view:
            while done < len(view):  # bounded: each pass writes at least one byte
                if pos == size:
                    last = self._new_chunk()
                    self._chunks.append(last)
                    pos = 0
                piece = min(size - pos, len(view) - done)
                last[pos : pos + piece] = view[done : done + piece]
                pos += piece
                done += piece
        return last, pos

    def truncate(self, end: int) -> None:
        """Forget the bytes from ``end`` on (``start <= end <= self.end``)."""
        if not self.start <= end <= self.end:
            raise ValueError(f"cannot truncate the tail [{self.start}, {self.end}) at {end}")
        index, rel = divmod(end, self.chunk_size)
        keep = index - self._first + 1
        if keep > len(self._chunks):  # end is the last chunk's full end
            keep, rel = len(self._chunks), self.chunk_size
        self._retire(self._chunks[keep:])
        del self._chunks[keep:]
        self._fill = rel
        self.end = end

    def drop_before(self, offset: int) -> None:
        """Free the whole chunks that end at or before ``offset`` (never the last one)."""
        size = self.chunk_size
        drop = min(offset // size - self._first, len(self._chunks) - 1)
        if drop <= 0:
            return
        self._retire(self._chunks[:drop])
        del self._chunks[:drop]
        self._first += drop
        self.start = max(self.start, self._first * size)

    def read(self, offset: int, size: int) -> bytes:
        """The ``size`` bytes at ``offset`` (the caller keeps inside ``[start, end)``)."""
        if size <= 0:
            return b""
        index, rel = divmod(offset, self.chunk_size)
        if rel + size <= self.chunk_size:
            with memoryview(self._chunks[index - self._first]) as view:  # one copy
                return bytes(view[rel : rel + size])
        return b"".join(bytes(view) for view in self.views(offset, offset + size))

    def view(self, start: int, stop: int) -> memoryview:
        """A view over ``[start, stop)`` up to the end of the chunk holding ``start``.
        Chunks never resize, so a live view blocks nothing; release it all the same."""
        index, rel = divmod(start, self.chunk_size)
        chunk = self._chunks[index - self._first]
        return memoryview(chunk)[rel : rel + min(stop - start, self.chunk_size - rel)]

    def views(self, start: int, stop: int) -> Iterator[memoryview]:
        """Views over ``[start, stop)``, one per chunk it spans."""
        while start < stop:
            view = self.view(start, stop)
            start += len(view)
            yield view
