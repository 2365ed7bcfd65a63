"""Streams chosen by the per-sample index: ``select=``, ``weights=`` and ``pad_last=`` of :func:`wsishard.stream`.

In the main process, :func:`plan_sampling` reads each source's index summary (``index.npz``: per shard, samples per
label and per slide) and, only where ``select=`` or a weight function needs the samples themselves, goes through
every shard index once, one shard at a time (memory: one shard's index), to count the selected samples per shard,
label and slide and each shard's total weight. The result, a :class:`SamplingPlan`, holds a few numbers per shard
and per slide, never a row per sample, and travels to the DataLoader workers.

In a worker, :class:`ReadIndexed` reads each shard's index when it reaches the shard, chooses the samples it
yields there (selected ones, its own slice of them, or weighted draws: :mod:`wsishard.streaming.sampling`), and
reads the shard once, in order, keeping those (a sample drawn twice is yielded twice). :class:`PadSamples` and
:class:`MarkValid` make ``pad_last`` epochs.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

import numpy as np
import torch
import webdataset as wds

from wsishard.errors import ShardError
from wsishard.storage.secrets import redact
from wsishard.streaming import sampling
from wsishard.streaming.decode import Batch
from wsishard.streaming.partition import EpochPlan, resume_position
from wsishard.streaming.ring import Lending
from wsishard.streaming.selection import SamplingPlan, load_shard_index, shard_of
from wsishard.streaming.stages import (
    Budget,
    ErrorMode,
    Opener,
    RawSample,
    ShardList,
    ShardRef,
    Unit,
    read_shard,
    shuffled,
)
from wsishard.streaming.world import World

logger = logging.getLogger(__name__)


# ---- stages run in the workers -------------------------------------------------------------------------


@dataclass
class ReadIndexed:
    """Read each shard (or slice) of a reader's stream, keeping the samples its index chooses, and shuffle them as
    :class:`~wsishard.streaming.stages.ReadShuffled` does (the buffer re-seeded at each position).

    Unweighted: the selected samples, the reader's slice of them (``phase``/``step`` count selected samples).
    Weighted: at position ``p``, ``visit_count(expected[url])`` draws by weight among the reader's slice of the
    selected samples, from ``rng((seed, rank, worker, p, DRAW_STREAM))``. The next shard's index is read ahead in a
    thread while a shard is read, so on object storage its request costs no wait.

    Args:
        plan: the stream's :class:`SamplingPlan`.
        opener, size, seed, on_error, max_failures, skip: as ``ReadShuffled``.
        reader: ``(base seed, rank, worker)`` of the weighted draws.
        expected: shard location -> expected draws per visit (weighted mode).
        context: context scales to read with each sample (:func:`~wsishard.streaming.stages.read_shard`).
    """

    plan: SamplingPlan
    opener: Opener
    size: int
    seed: tuple[int, ...]
    on_error: ErrorMode = "raise"
    max_failures: int = 1
    skip: int = 0
    reader: tuple[int, int, int] = (0, 0, 0)
    expected: dict[str, float] | None = None
    context: int = 0
    _in_a_row: int = field(default=0, init=False)
    _kept: OrderedDict[str, _Visit] = field(default_factory=OrderedDict, init=False)

    def __call__(self, src: Iterator[Unit]) -> Iterator[RawSample]:
        pool = ThreadPoolExecutor(1, thread_name_prefix="wsishard-index")  # the next shard's index, read ahead
        try:
            units = iter(src)
            unit = next(units, None)
            ahead = pool.submit(self._prepare, unit[1]) if unit is not None else None
            first = True
            while unit is not None and ahead is not None:
                (position, ref), index = unit, ahead
                unit = next(units, None)
                ahead = pool.submit(self._prepare, unit[1]) if unit is not None else None
                samples = shuffled(self._read(position, ref, index), self.size, (*self.seed, position))
                if first and self.skip:
                    samples = islice(samples, self.skip, None)
                first = False
                yield from samples
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _prepare(self, ref: ShardRef) -> _Visit:
        """What a visit of ``ref`` needs of its shard's index, position aside (in the read-ahead thread; the last
        :data:`VISITS_KEPT` are kept, so a small build's shards are not read and selected again at every pass)."""
        kept = self._kept
        if ref.url in kept:
            kept.move_to_end(ref.url)
            return kept[ref.url]
        plan, s = self.plan, self.plan.urls[ref.url]
        index = load_shard_index(plan, s, self.opener)
        table = index.table(shard_of(plan.index_urls[s])) if plan.select or callable(plan.weights) else None
        chosen = np.flatnonzero(plan.mask(s, index, table))
        if len(chosen) != int(plan.selected[s]):
            raise ShardError(
                redact(ref.url),
                f"select= keeps {len(chosen)} samples now, {int(plan.selected[s])} "
                "when the stream was planned (select must be deterministic)",
            )
        mine = chosen[ref.phase :: ref.step]
        weights = plan.sample_weights(s, index, table)[mine] if self.expected is not None else None
        visit = kept[ref.url] = _Visit(index.key[mine].astype(str).tolist(), weights)
        if len(kept) > VISITS_KEPT:
            kept.popitem(last=False)
        return visit

    def _read(self, position: int, ref: ShardRef, ahead: Future[_Visit]) -> Iterator[RawSample]:
        s = self.plan.urls[ref.url]
        try:
            wanted = self._wanted(position, ref, ahead.result())
            if wanted:
                whole, found = ShardRef(ref.url, int(self.plan.rows[s])), 0
                for raw in read_shard(whole, self.opener, self.on_error, self.context):
                    found += raw["key"] in wanted
                    for _ in range(wanted.get(raw["key"], 0)):
                        yield raw
                if found < len(wanted):  # keys its index lists that the shard lacks: never a silent drop
                    _lacking(ref.url, len(wanted) - found, self.on_error)
            self._in_a_row = 0
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            self._in_a_row += 1
            logger.warning("skipping %s", exc)
            if self._in_a_row >= self.max_failures:
                raise ShardError(ref.url, f"all {self._in_a_row} shards of this worker failed") from exc

    def _wanted(self, position: int, ref: ShardRef, visit: _Visit) -> dict[str, int]:
        """key -> times to yield it, for ``ref`` at ``position``."""
        if self.expected is None or visit.weights is None:
            return dict.fromkeys(visit.keys, 1)
        rng = sampling.visit_rng(*self.reader, position)
        n = sampling.visit_count(self.expected[ref.url], rng)
        counts = sampling.draw_counts(visit.weights, n, rng)
        return {k: int(c) for k, c in zip(visit.keys, counts.tolist(), strict=True) if c}


def _lacking(url: str, missing: int, on_error: ErrorMode) -> None:
    """Raise (or, skipping bad samples, log) that shard ``url`` lacks ``missing`` samples its index lists."""
    error = ShardError(redact(url), f"lacks {missing} sample(s) its index lists (a shard or index replaced?)")
    if on_error == "raise":
        raise error
    logger.warning("%s", error)


VISITS_KEPT = 16  # shards a reader keeps prepared (keys and weights of its samples: ~60 bytes a sample)


@dataclass(frozen=True)
class _Visit:
    keys: list[str]  # the reader's chosen samples of the shard, in shard order
    weights: np.ndarray | None  # (len(keys),) their weights (weighted mode)


@dataclass
class Validity:
    """Shared by a worker's :class:`PadSamples` and :class:`MarkValid`: the real samples let through so far."""

    real: int = 0


@dataclass
class PadSamples:
    """Let ``real`` samples through (each counted in ``counter``), then repeats of the first ones up to ``total``
    samples (``pad_last``); with ``real`` 0 (a resumed worker past its real samples), the first sample of ``src``
    is taken as the repeat."""

    real: int
    total: int
    batch_size: int
    counter: Validity

    def __call__(self, src: Iterator[RawSample]) -> Iterator[RawSample]:
        kept: list[RawSample] = []
        yielded = 0
        for raw in islice(src, self.real) if self.real else ():
            if len(kept) < self.batch_size:
                kept.append(raw)
            self.counter.real += 1
            yielded += 1
            yield raw
        if not self.real:
            kept = list(islice(src, 1))
        if not kept and self.total > yielded:
            raise ShardError("(every shard of this worker)", "no sample to pad the last batches with")
        for i in range(self.total - yielded):
            yield kept[i % len(kept)]


@dataclass
class MarkValid:
    """Add ``batch["valid"]``: (b,) bool, True for the real samples, False for :class:`PadSamples`' repeats."""

    counter: Validity
    done: int = 0  # samples of the worker's batches before (a resumed worker)

    def __call__(self, src: Iterator[Batch]) -> Iterator[Batch]:
        for batch in src:
            b = len(batch["key"])
            batch["valid"] = torch.arange(self.done, self.done + b) < self.counter.real  # type: ignore[typeddict-unknown-key]
            self.done += b
            yield batch


def read_stage(
    plan: SamplingPlan | None,
    opener: Opener,
    cfg: Any,
    seed: tuple[int, ...],
    max_failures: int,
    skip: int,
    read: dict[str, Any] | None,
) -> ReadIndexed | None:
    """The reading stage of a stream with a sampling plan (None without one): ``cfg`` its StreamConfig, ``read`` the
    weighted draws' extra arguments."""
    if plan is None:
        return None
    return ReadIndexed(
        plan, opener, cfg.shuffle, seed, cfg.on_error, max_failures, skip, **(read or {}), context=cfg.context_scales
    )


def padded_pipeline(
    ds: Any,
    world: World,
    seed: tuple[int, ...],
    plan: EpochPlan,
    mine: tuple[ShardRef, ...],
    done: int,
    lending: Lending,
) -> wds.DataPipeline:
    """The epoch of ``world``'s reader of ``ds`` (a :class:`~wsishard.streaming.dataset.ShardStream`) with ``pad_last``:
    its samples, then repeats up to its (padded) budget, after the ``done`` batches it had yielded (a resumed
    loader)."""
    size, real = ds.config.batch_size, int(plan.samples[world.rank, world.worker])
    budget, past = int(plan.budget_of(world)), done * size
    start, skip = resume_position([r.kept for r in mine], past) if past < real else (0, 0)
    counter = Validity(min(past, real))
    read, decode = ds.sample_stages(seed, max_failures=len(mine), skip=skip, lending=lending)
    pad = PadSamples(max(real - past, 0), (budget - done) * size, size, counter)
    return wds.DataPipeline(ShardList(mine, start), read, pad, decode, MarkValid(counter, past), Budget(budget - done))
