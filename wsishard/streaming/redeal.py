"""Finishing an epoch on another topology: the samples the old ranks had not yet yielded, dealt to the new ones.

Each old (rank, worker) reader's stream is addressable (:mod:`wsishard.streaming.stages` shuffles each shard with
a seed of its own), so what it had left of the epoch is a list of :class:`Piece` s: a shard (or the reader's slice
of one), shuffled with the old reader's seed for it, minus the samples already taken, up to what the old plan
would have yielded. The new readers split those pieces by sample, as :func:`~wsishard.streaming.partition.
reader_slices` splits shards: remaining sample ``i`` (counted across the pieces) to new rank ``i % W'`` and its
worker ``(i // W') % K'``. No sample is yielded twice; the new ranks drop only what keeping them in step needs
(the last partial batch of a worker, as in any epoch).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any

import numpy as np

from wsishard.streaming.partition import batch_budgets, plan_epoch
from wsishard.streaming.stages import (
    SHUFFLE_STREAM,
    ErrorMode,
    Opener,
    RawSample,
    ShardRef,
    read_shard,
    shuffled,
    slice_refs,
)
from wsishard.streaming.world import World


@dataclass(frozen=True)
class Piece:
    """Samples ``[skip, skip + take)`` of a shard's shuffled order (``seed``), of which a new reader keeps those
    at piece-local index ``k`` with ``k % step == phase``."""

    ref: ShardRef
    seed: tuple[int, ...]
    skip: int
    take: int
    phase: int = 0
    step: int = 1

    @property
    def kept(self) -> int:
        return len(range(self.phase, self.take, self.step))


def remainders(
    counts: np.ndarray,
    refs: Sequence[ShardRef],
    states: Sequence[dict[str, Any]],
    *,
    batch_size: int,
    plan_seed: int,
    drop_last: bool,
) -> list[Piece]:
    """What every old reader had left of the states' epoch, in (rank, worker, shard) order.

    Args:
        counts: (n,) samples per shard; ``refs`` the shards (whole).
        states: every old rank's :meth:`~wsishard.streaming.loader.ShardLoader.state_dict`, one per rank.
    """
    first = states[0]
    world_size, workers, epoch = int(first["world_size"]), max(int(first["num_workers"]), 1), int(first["epoch"])
    plan = plan_epoch(
        counts,
        world_size=world_size,
        num_workers=workers,
        batch_size=batch_size,
        seed=plan_seed,
        epoch=epoch,
        drop_last=drop_last,
    )
    pieces = []
    for state in sorted(states, key=lambda s: int(s["rank"])):
        rank = int(state["rank"])
        for worker in range(workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=workers)
            mine = list(slice_refs(refs, plan.slices_of(world)))
            seed = (int(state["seed"]), rank, worker, epoch, SHUFFLE_STREAM)
            start, end = int(state["batches"][worker]) * batch_size, int(plan.kept[rank, worker])
            pieces += _cut(mine, seed, start, end)
    return pieces


def _cut(mine: list[ShardRef], seed: tuple[int, ...], start: int, end: int) -> list[Piece]:
    """The pieces of one reader's stream between samples ``start`` and ``end``."""
    out, at = [], 0
    for position, ref in enumerate(mine):
        lo, hi = max(start, at), min(end, at + ref.kept)
        if lo < hi:
            out.append(Piece(ref, (*seed, position), lo - at, hi - lo))
        at += ref.kept
    return out


def share(pieces: Sequence[Piece], world: World) -> list[Piece]:
    """The pieces as new reader ``world`` reads them: remaining sample ``i`` is reader ``i % readers``'s."""
    readers, reader = world.total_workers, world.rank + world.world_size * world.worker
    out, at = [], 0
    for piece in pieces:
        out.append(replace(piece, phase=(reader - at) % readers, step=readers))
        at += piece.take
    return out


def budgets(pieces: Sequence[Piece], world_size: int, workers: int, *, batch_size: int, drop_last: bool) -> np.ndarray:
    """(W', K') batches each new reader yields: every new rank the same number."""
    samples = np.zeros((world_size, workers), dtype=np.int64)
    for rank in range(world_size):
        for worker in range(workers):
            world = World(rank=rank, world_size=world_size, worker=worker, num_workers=workers)
            samples[rank, worker] = sum(p.kept for p in share(pieces, world))
    return batch_budgets(samples, batch_size=batch_size, drop_last=drop_last)


@dataclass(frozen=True)
class PieceList:
    """A pipeline source: a new reader's pieces."""

    pieces: tuple[Piece, ...]

    def __call__(self) -> Iterator[Piece]:
        return iter(self.pieces)


@dataclass(frozen=True)
class ReadPieces:
    """Each piece's samples: its shard read and shuffled as the old reader did, then this reader's share."""

    opener: Opener
    size: int  # the shuffle buffer the old readers used
    on_error: ErrorMode = "raise"
    context: int = 0  # context scales read with each sample

    def __call__(self, src: Iterator[Piece]) -> Iterator[RawSample]:
        for piece in src:
            raws = read_shard(piece.ref, self.opener, self.on_error, self.context)
            samples: Iterator[RawSample] = shuffled(raws, self.size, piece.seed)
            taken = islice(samples, piece.skip, piece.skip + piece.take)
            yield from (s for k, s in enumerate(taken) if k % piece.step == piece.phase)
