"""The one reader stage: a reader's pieces (:mod:`wsishard.streaming.planner`) in, its samples out.

    pieces -> ReadPieces (shard read once, sequentially; its items shuffled; the piece's share kept)
           -> PadSamples (the real items, then repeats up to the budget) -> decode -> MarkValid -> Budget

A piece's items are its shard's samples in shard order (those ``select=`` keeps, by the shard's index), or in a
weighted epoch its draws (:func:`~wsishard.streaming.draws.draw_counts` over the kept samples' weights, each
drawn sample yielded as often as it was drawn). A piece that yields nothing is not read.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from itertools import chain, islice
from typing import Generic, TypeVar

import numpy as np
import torch

from wsishard.errors import ShardError
from wsishard.storage.secrets import redact
from wsishard.streaming.decode import Batch
from wsishard.streaming.draws import draw_counts, piece_items
from wsishard.streaming.planner import Piece
from wsishard.streaming.selection import SamplingPlan, load_shard_index, shard_of
from wsishard.streaming.stages import ErrorMode, Opener, RawSample, ShardRef, read_shard

logger = logging.getLogger(__name__)
B = TypeVar("B")  # a batch
VISITS_KEPT = 16  # shards a reader keeps chosen (keys and weights of its samples: ~60 bytes a sample)


@dataclass(frozen=True)
class _Chosen:
    keys: list[str]  # the shard's samples select= keeps, in shard order
    weights: np.ndarray | None  # (len(keys),) their weights (weighted streams)


@dataclass
class ReadPieces:
    """Read each piece's shard and yield the piece's items (:func:`~wsishard.streaming.draws.piece_items`).

    Args:
        shards: the stream's shards (a piece names one by its position); ``samples`` their selected counts.
        opener: ``location -> binary file``.
        size: shuffle buffer, items (0 or 1: read order).
        sampling: the stream's ``select=``/``weights=`` plan (None: every sample, unweighted).
        on_error: ``"raise"`` or ``"skip"`` (the rest of a broken shard; what was read before is kept).
        max_failures: in skip mode, this many failed pieces in a row raise.
        context: context scales to read with each sample (:func:`~wsishard.streaming.stages.read_shard`).
        bags: the shards hold an embeddings output's slide samples (read as bags).
        position: the plan items the reader has passed (a resumed reader's, at start): those it yielded, and those
            a skip (``on_error="skip"``) left out, so a resume goes on where the uninterrupted reader did.
    """

    shards: tuple[ShardRef, ...]
    opener: Opener
    size: int
    sampling: SamplingPlan | None = None
    on_error: ErrorMode = "raise"
    max_failures: int = 1
    context: int = 0
    bags: bool = False
    position: int = 0
    skipped: int = field(default=0, init=False)
    _size: int | None = field(default=None, init=False)  # the current piece's selected samples (lazy select=)
    _in_a_row: int = field(default=0, init=False)
    _chosen: OrderedDict[int, _Chosen] = field(default_factory=OrderedDict, init=False)

    def __call__(self, src: Iterable[Piece]) -> Iterator[RawSample]:
        ahead = getattr(self.opener, "ahead", None)  # StreamOpener's: the next shard opened while one is read
        lazy, empty = self.sampling is not None and self.sampling.lazy, 0
        pieces = (p for p in src if p.count)
        piece = next(pieces, None)
        while piece is not None:
            following = next(pieces, None)
            items = piece_items(piece, self._items(piece), self.size)
            first = next(items, None)  # the current shard is open (and read up to its first item)
            if ahead is not None and following is not None:  # (the same shard again too: a read of its own)
                ahead(self.shards[following.shard].url)
            passed = 0
            if first is not None:
                for item in chain((first,), items):
                    self.position += 1
                    passed += 1
                    yield item
            self.position += max(self._count(piece) - passed, 0)  # what a skip left out: passed all the same
            empty = 0 if first is not None else empty + 1
            if lazy and empty > len(self.shards):  # a whole pass of its shards, and select= kept nothing
                raise ValueError(
                    f"select= keeps no sample of the {len(self.shards)} shard(s) this reader visits (a resampled "
                    "stream applies it as readers visit their shards): pass lazy_select=False to stream() (every "
                    "index read at start-up, the shards without a selected sample left out), or use fewer workers"
                )
            piece = following

    def _count(self, piece: Piece) -> int:
        """The items ``piece`` yields without a skip (a lazy piece: its selected samples once read, not its rows)."""
        size = self._size
        if size is None or piece.draws or size == piece.items:
            return piece.count
        return replace(piece, items=size, take=-1 if piece.take == piece.items else min(piece.take, size)).count

    def _items(self, piece: Piece) -> Iterator[RawSample]:
        self._size = None
        ref = self.shards[piece.shard]
        try:
            yield from self._read(piece, ref)
            self._in_a_row = 0
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            self.skipped += 1
            self._in_a_row += 1
            logger.warning("skipping %s (%d skipped in this worker so far)", exc, self.skipped)
            if self._in_a_row >= self.max_failures:
                raise ShardError(redact(ref.url), f"all {self._in_a_row} shards of this worker failed") from exc

    def _read(self, piece: Piece, ref: ShardRef) -> Iterator[RawSample]:
        plan = self.sampling
        if plan is None:  # every sample once (draws need weights, hence a plan)
            yield from read_shard(ref, self.opener, self.on_error, self.context, self.bags)
            return
        s = plan.urls[ref.url]
        chosen = self._choose(s, ref)
        if piece.draws:
            assert chosen.weights is not None
            times = draw_counts(chosen.weights, piece.items, piece.seed)
            wanted = {k: int(t) for k, t in zip(chosen.keys, times.tolist(), strict=True) if t}
        else:
            wanted = dict.fromkeys(chosen.keys, 1)
            self._size = len(chosen.keys) if plan.lazy else None
        whole, found = ShardRef(ref.url, int(plan.rows[s])), 0
        for raw in read_shard(whole, self.opener, self.on_error, self.context, self.bags):
            found += raw["key"] in wanted
            for _ in range(wanted.get(raw["key"], 0)):
                yield raw
        if found < len(wanted):  # keys its index lists that the shard lacks: never a silent drop
            _lacking(ref.url, len(wanted) - found, self.on_error)

    def _choose(self, s: int, ref: ShardRef) -> _Chosen:
        """Shard ``s``'s samples that ``select`` keeps, and their weights (the last :data:`VISITS_KEPT` kept)."""
        if s in self._chosen:
            self._chosen.move_to_end(s)
            return self._chosen[s]
        plan = self.sampling
        assert plan is not None
        index = load_shard_index(plan, s, self.opener)
        table = index.table(shard_of(plan.index_urls[s])) if plan.select or callable(plan.weights) else None
        mine = np.flatnonzero(plan.mask(s, index, table))
        if len(mine) != ref.samples and not plan.lazy:
            raise ShardError(
                redact(ref.url),
                f"select= keeps {len(mine)} samples now, {ref.samples} when the stream was planned "
                "(select must be deterministic)",
            )
        weights = plan.sample_weights(s, index, table)[mine] if plan.weighted else None
        chosen = self._chosen[s] = _Chosen(index.key[mine].astype(str).tolist(), weights)
        if len(self._chosen) > VISITS_KEPT:
            self._chosen.popitem(last=False)
        return chosen


def _lacking(url: str, missing: int, on_error: ErrorMode) -> None:
    """Raise (or, skipping bad samples, log) that shard ``url`` lacks ``missing`` samples its index lists."""
    error = ShardError(redact(url), f"lacks {missing} sample(s) its index lists (a shard or index replaced?)")
    if on_error == "raise":
        raise error
    logger.warning("%s", error)


@dataclass
class Validity:
    """Shared by a worker's :class:`PadSamples` and :class:`MarkValid`: the real samples let through so far."""

    real: int = 0


@dataclass
class PadSamples:
    """Let ``real`` samples through (counted in ``counter``; None: all of them, an endless stream), then repeats
    of the first ones up to ``total`` samples (``pad_last``); with ``real`` 0 (a resumed reader past its real
    samples), the first sample of ``src`` is taken as the repeat."""

    real: int | None
    total: int
    batch_size: int
    counter: Validity

    def __call__(self, src: Iterator[RawSample]) -> Iterator[RawSample]:
        if self.real is None:
            yield from src
            return
        kept: list[RawSample] = []
        yielded = 0
        for raw in islice(src, self.real) if self.real else ():
            if len(kept) < self.batch_size:
                kept.append(raw)
            self.counter.real += 1
            yielded += 1
            yield raw
        if self.total <= yielded:
            return
        if not self.real:
            kept = list(islice(src, 1))
        if not kept:
            raise ShardError("(every shard of this worker)", "no sample to pad the last batches with")
        for i in range(self.total - yielded):
            yield kept[i % len(kept)]


@dataclass
class MarkValid:
    """Add ``batch["valid"]``: (b,) bool, True for the real samples, False for :class:`PadSamples`' repeats."""

    counter: Validity
    done: int = 0  # real samples of the reader's batches before (a resumed reader)

    def __call__(self, src: Iterator[Batch]) -> Iterator[Batch]:
        for batch in src:
            b = len(batch["key"])
            batch["valid"] = torch.arange(self.done, self.done + b) < self.counter.real  # type: ignore[typeddict-unknown-key]
            self.done += b
            yield batch


@dataclass(frozen=True)
class Budget(Generic[B]):
    """Yield exactly ``batches`` batches (None: all), every rank's batch count equal.

    When the stream ends early (skipped shards under DDP), ``refill(p)`` for ``p = 1, 2, ...`` supplies
    batches re-read from the worker's own pieces until the budget is met.
    """

    batches: int | None
    refill: Callable[[int], Iterator[B]] | None = None

    def __call__(self, src: Iterator[B]) -> Iterator[B]:
        if self.batches is None:
            yield from src
            return
        count = 0
        for batch in src if self.batches > 0 else ():
            yield batch
            count += 1
            if count == self.batches:
                return
        refill, empty = self.refill, 0
        for pass_index in range(1, 2**31):
            if count >= self.batches or refill is None:
                return
            logger.warning(
                "%d batches short of the epoch budget after skipping; re-reading this worker's shards",
                self.batches - count,
            )
            got = 0
            for batch in refill(pass_index):
                yield batch
                count, got = count + 1, got + 1
                if count == self.batches:
                    return
            empty = empty + 1 if got == 0 else 0
            if empty == 2:  # (a resumed reader's first top-up may be the end of a pass: nothing to give)
                raise ShardError(
                    "(every shard of this worker)", f"re-reading gave no batch; {count} of {self.batches} planned"
                )
