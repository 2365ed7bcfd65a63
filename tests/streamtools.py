"""Helpers shared by the stream tests (tests/unit/test_stream_*.py and tests/integration/test_stream_*.py)."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from wsishard.streaming.dataset import ShardStream
from wsishard.streaming.pinning import Cuda
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World

COUNTS = (10, 7, 12, 5, 9, 14, 6, 11)  # samples per shard of conftest's ``stream_out``: uneven on purpose


def keys_of(batches: Iterable[dict[str, Any]]) -> list[str]:
    """Every sample key of ``batches``, in order."""
    return [k for b in batches for k in b["key"]]


def kept(batches: Iterable[dict[str, Any]]) -> Iterable[dict[str, Any]]:
    """``batches`` as a loop that keeps them must take them: each image copied before the next batch is taken (a
    loader's batch is valid until then)."""
    for batch in batches:
        yield {**batch, "image": batch["image"].clone()}


def two_ranks(source: str | Path, **kw: Any) -> ShardStream:
    """A stream as rank 0 of two sees it (``pipeline(World(rank=r, ...), epoch)`` plays any rank and worker)."""
    return stream(source, world=World(rank=0, world_size=2), **kw)


class Trickle(io.RawIOBase):
    """A raw file that returns at most ``step`` bytes per read (as a socket might): a reader's buffer then ends
    mid-member again and again."""

    def __init__(self, data: bytes, step: int) -> None:
        self._data, self._pos, self._step = data, 0, step

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        n = self._step if size < 0 else min(size, self._step)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out


class FakeCuda:
    """Records the calls; an event completes once ``done`` reaches its number (events numbered from 0)."""

    def __init__(self, fail: int = 0) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.done = -1
        self.fail = fail

    def cuda(self) -> Cuda:
        return Cuda(
            register=self._register,
            unregister=self._unregister,
            event=self._event,
            synchronize=lambda: self.calls.append(("sync",)),
        )

    def _register(self, ptr: int, n: int) -> int:
        self.calls.append(("register", ptr, n))
        return self.fail

    def _unregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr))
        return 0

    def _event(self) -> Any:
        fake, number = self, sum(c[0] == "event" for c in self.calls)
        self.calls.append(("event", number))

        class Event:
            recorded = False

            def record(self) -> None:
                self.recorded = True

            def query(self) -> bool:
                return self.recorded and fake.done >= number

        return Event()
