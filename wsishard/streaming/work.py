"""What each reader runs, from the plan: a source of pieces (an epoch's, or a resampled reader's endless passes)
and the items and batches it has left. Plain data that pickles into DataLoader workers."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

from wsishard.errors import TopologyError
from wsishard.streaming.planner import (
    Piece,
    Plan,
    Spec,
    Topology,
    cut,
    reader_pass,
    reader_share,
    resampled_start,
)


@dataclass(frozen=True)
class Passes:
    """A pipeline source: a resampled reader's pieces, pass after pass, after its first ``items`` items.

    ``sizes``: where ``select`` is applied as shards are visited (the spec's counts then are the shards' rows), the
    items each of the given shards really has (their indexes read): called to find a resumed reader's place."""

    spec: Spec
    topology: Topology
    rank: int
    worker: int
    items: int = 0
    sizes: Callable[[Sequence[int]], Sequence[int]] | None = None

    def __call__(self) -> Iterator[Piece]:
        mine = reader_share(self.spec, self.topology, self.rank, self.worker)
        if not any(p.count for p in mine):
            raise TopologyError(f"rank {self.rank} worker {self.worker} owns only empty shards")
        if self.sizes is not None and self.items:
            mine = [replace(p, items=n) for p, n in zip(mine, self.sizes([p.shard for p in mine]), strict=True)]
        pass_index, skip = resampled_start(self.spec, mine, self.rank, self.worker, self.items)
        yield from cut(reader_pass(self.spec, mine, self.rank, self.worker, pass_index), skip, 2**62)
        for p in range(pass_index + 1, 2**62):
            yield from reader_pass(self.spec, mine, self.rank, self.worker, p)


@dataclass(frozen=True)
class Pieces:
    """A pipeline source: an epoch reader's pieces."""

    pieces: tuple[Piece, ...]

    def __call__(self) -> Iterator[Piece]:
        return iter(self.pieces)


@dataclass(frozen=True)
class Work:
    """What a reader does from where it stands: its pieces' source, the real items it has left (None: endless),
    the batches it has left (None: endless; ``pad_last``: real items, then repeats) and the real items of its
    batches before."""

    source: Pieces | Passes
    real: int | None
    budget: int | None
    done: int = 0
    start: int = 0  # items of its plan the reader has passed (yielded, or skipped under on_error="skip")
    plan: tuple[Piece, ...] = ()  # the reader's whole plan (an epoch's top-ups re-read it; resampled: one pass)
    topped: int = 0  # items of top-up passes it had passed (a resumed reader that stopped while topping up)


def epoch_work(plan: Plan, rank: int, worker: int, batches: int, items: int | None = None) -> Work:
    """Reader (``rank``, ``worker``) of ``plan`` after its first ``batches`` batches, having passed ``items`` of its
    plan's items (None: the batches' items, nothing skipped) (a resumed loader)."""
    reader, size = plan.reader(rank, worker), plan.batch_size
    done = min(batches * size, reader.real)
    at = reader.passed(batches, size, items)
    rest = cut(reader.pieces, at, reader.real) if at < reader.real else list(reader.pieces)  # repeats' source
    topped = max(items - reader.real, 0) if items is not None else 0
    return Work(Pieces(tuple(rest)), reader.real - at, max(reader.budget - batches, 0), done, at, reader.pieces, topped)
