"""Tile bytes of a slide read in place, fetched so that a remote store's latency is hidden: the tiles a read needs are
coalesced into large ranged GETs, several are in flight at once, and the tiles of the reads planned next are fetched
while the current one decodes.

The bytes land in a (sparse) scratch file at their own offsets, never held in memory past their request: what is in
memory at once is at most ``requests`` ranges of at most ``max_range_bytes`` each.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

Span = tuple[int, int]  # (offset, byte count) of one tile in the file


@dataclass(frozen=True)
class RangePolicy:
    """How tile reads become requests.

    Attributes:
        gap_bytes: neighbouring tiles less than this far apart are read by one request, the bytes between them too
            (a request costs a round trip; 256 KB is ~2 ms at 1 Gbit/s, against 20-50 ms of object-store latency).
        max_range_bytes: the most one request reads.
        requests: requests in flight at once (threads of a reader's own pool).
        ahead_bytes: how far the planned reads are fetched ahead of the read being decoded.
    """

    gap_bytes: int = 256 << 10
    max_range_bytes: int = 8 << 20
    requests: int = 4
    ahead_bytes: int = 32 << 20


def coalesce(spans: Iterable[Span], gap_bytes: int, max_range_bytes: int) -> list[tuple[int, int, list[int]]]:
    """``(start, end, tile offsets)`` of the requests that read ``spans`` (empty tiles aside): sorted by offset,
    neighbours closer than ``gap_bytes`` merged while the range stays within ``max_range_bytes`` (a single tile
    larger than that is one request of its own)."""
    ranges: list[tuple[int, int, list[int]]] = []
    for offset, count in sorted(set(s for s in spans if s[1] > 0)):
        if ranges:
            start, end, offsets = ranges[-1]
            if offset - end <= gap_bytes and max(end, offset + count) - start <= max_range_bytes:
                ranges[-1] = (start, max(end, offset + count), [*offsets, offset])
                continue
        ranges.append((offset, offset + count, [offset]))
    return ranges


class RangeFetcher:
    """Fetches tile spans of one object into the scratch file ``fd`` through ``fetch(start, end) -> bytes``.
    ``tiles``: every tile of the object (any order): one that a request's bytes hold whole (in a gap it read through)
    is not asked for again."""

    def __init__(
        self,
        fetch: Callable[[int, int], bytes],
        fd: int,
        policy: RangePolicy | None = None,
        tiles: Iterable[Span] = (),
    ) -> None:
        self._fetch, self._fd = fetch, fd
        self._tiles = sorted(set(t for t in tiles if t[1] > 0))
        self._starts = [t[0] for t in self._tiles]
        self.policy = policy or RangePolicy()
        self._lock = threading.Lock()
        self._have: set[int] = set()  # offsets of the tiles in the scratch file
        self._pending: dict[int, Future[None]] = {}  # offsets of the tiles on their way -> their request
        self._plan: deque[Span] = deque()  # tiles of the reads planned, in plan order
        self._pool: ThreadPoolExecutor | None = None
        self._on_way = 0  # bytes of the requests submitted and not yet done
        self.bytes = 0  # bytes fetched
        self.requests = 0  # requests made

    def plan(self, spans: Sequence[Span]) -> None:
        """Tiles a coming read needs, in the order the reads come: fetched ahead of it (:meth:`ensure`)."""
        self._plan.extend(spans)

    def ensure(self, spans: Sequence[Span]) -> None:
        """Have every tile of ``spans`` in the scratch file before returning (fetching those that are not, in as
        few requests as :func:`coalesce` makes), and start fetching the planned tiles that come next.

        Raises:
            Exception: a request failed (the store client's error, as it raised it).
        """
        with self._lock:
            self._submit([s for s in spans if self._missing(s)])
            waits = {id(f): f for f in (self._pending.get(s[0]) for s in spans) if f is not None}
        self._ahead()
        for future in waits.values():
            future.result()

    def _missing(self, span: Span) -> bool:
        return span[1] > 0 and span[0] not in self._have and span[0] not in self._pending

    def _ahead(self) -> None:
        """Submit the next planned tiles not yet fetched, up to ``ahead_bytes`` of them (counting those on their
        way): the requests run while the caller decodes."""
        with self._lock:
            on_way = self._on_way
            batch: list[Span] = []
            while self._plan and on_way < self.policy.ahead_bytes:
                span = self._plan.popleft()
                if self._missing(span) and span not in batch:
                    batch.append(span)
                    on_way += span[1]
            self._submit(batch)

    def _submit(self, spans: list[Span]) -> None:
        """Start the requests for ``spans`` (under the lock)."""
        if not spans:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.policy.requests, thread_name_prefix="wsishard-ranges")
        for start, end, offsets in coalesce(spans, self.policy.gap_bytes, self.policy.max_range_bytes):
            future = self._pool.submit(self._get, start, end, offsets)
            self._on_way += end - start
            self._pending.update((offset, future) for offset in offsets)

    def _get(self, start: int, end: int, offsets: list[int]) -> None:
        got = 0
        try:
            data = self._fetch(start, end)
            if len(data) != end - start:
                raise OSError(f"bytes {start}-{end - 1}: {len(data)} bytes came back")
            os.pwrite(self._fd, data, start)
            got = len(data)
        finally:
            with self._lock:
                self._on_way -= end - start
                self.requests += 1
                for offset in offsets:
                    self._pending.pop(offset, None)
                if got:
                    self._have.update(offsets)
                    self._have.update(self._within(start, end))
                    self.bytes += got

    def _within(self, start: int, end: int) -> list[int]:
        """Offsets of the known tiles that lie whole in bytes ``[start, end)``."""
        first, last = bisect.bisect_left(self._starts, start), bisect.bisect_left(self._starts, end)
        return [offset for offset, count in self._tiles[first:last] if offset + count <= end]

    def close(self) -> None:
        """Stop: requests not started are dropped, those running are waited for (the scratch file stays open)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self._plan.clear()
