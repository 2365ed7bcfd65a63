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
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice

import numpy as np
import torch

from wsishard.errors import ManifestError, ShardError
from wsishard.format import SUMMARY_NAME, index_name
from wsishard.manifest import Manifest
from wsishard.shards.index import ShardIndex, Summary, load_index
from wsishard.storage.opener import read_bytes
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming import sampling
from wsishard.streaming.decode import Batch
from wsishard.streaming.sampling import Select, Table, Weights
from wsishard.streaming.stages import ErrorMode, Opener, RawSample, ShardRef, Unit, read_shard, shuffled

logger = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class SamplingPlan:
    """What to read of each shard, and with which weights: a few numbers per shard and per slide.

    Attributes:
        select: the user's ``select=`` (None: every sample).
        weights: the user's ``weights=`` (None: unweighted).
        urls: shard location -> its row in the arrays below.
        index_urls: (n,) each shard's index location.
        rows: (n,) samples in each shard (its manifest count).
        selected: (n,) samples ``select`` keeps in each shard.
        totals: (n,) total weight of each shard's selected samples (scaled by its source's proportion).
        scales: (n,) the factor of each shard's source (``proportions=``).
        labels, label_weight: (L,) label values and the weight of one sample of each (``"class"``, mapping).
        slide_ptr, slide_global: shard ``s``'s slides (in its index's order) are global slides
            ``slide_global[slide_ptr[s]:slide_ptr[s + 1]]``.
        slide_weight: (S,) the weight of one sample of each global slide (``"slide"``).
    """

    select: Select | None
    weights: Weights | None
    urls: dict[str, int]
    index_urls: tuple[str, ...]
    rows: np.ndarray
    selected: np.ndarray
    totals: np.ndarray
    scales: np.ndarray
    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    label_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))
    slide_ptr: np.ndarray = field(default_factory=lambda: np.zeros(1, np.int64))
    slide_global: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    slide_weight: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def weighted(self) -> bool:
        return self.weights is not None

    def mask(self, s: int, index: ShardIndex, table: Table | None = None) -> np.ndarray:
        """(rows,) the samples of shard ``s`` that ``select`` keeps."""
        if self.select is None:
            return np.ones(len(index), dtype=bool)
        where = redact(self.index_urls[s])
        return sampling.checked_mask(self.select(table or index.table(_shard_of(where))), len(index), where)

    def sample_weights(self, s: int, index: ShardIndex, table: Table | None = None) -> np.ndarray:
        """(rows,) each sample's weight in shard ``s`` (before ``select``), times its source's scale."""
        w = self.weights
        if w == "slide":
            lo, hi = int(self.slide_ptr[s]), int(self.slide_ptr[s + 1])
            out = self.slide_weight[self.slide_global[lo:hi]][index.columns["slide"]]
        elif callable(w):
            where = redact(self.index_urls[s])
            out = sampling.checked_weights(w(table or index.table(_shard_of(where))), len(index), where)
        else:  # "class" or a mapping: by label
            labels = index.columns["label"]
            at = np.searchsorted(self.labels, labels).clip(0, max(len(self.labels) - 1, 0))
            known = (self.labels[at] == labels) if len(self.labels) else np.zeros(len(labels), bool)
            out = np.where(known, self.label_weight[at] if len(self.labels) else 0.0, 0.0)
        return np.asarray(out, dtype=np.float64) * float(self.scales[s])


def _shard_of(location: str) -> str:
    """The shard name an index location stands for (its last path part, ``.idx.npz`` made ``.tar``)."""
    return location.rsplit("/", 1)[-1].replace(".idx.npz", ".tar")


@dataclass(frozen=True)
class Source:
    """One build output as :func:`plan_sampling` reads it."""

    root: str
    manifest: Manifest
    where: str  # redacted, for messages


def plan_sampling(sources: Sequence[Source], *, select: Select | None, weights: Weights | None,
                  proportions: Sequence[float] | None, storage_options: StorageOptions | None,
                  opener: Opener) -> SamplingPlan:  # fmt: skip
    """The :class:`SamplingPlan` of ``sources`` (main process): summaries read, and every shard index read once
    (one at a time) only where ``select`` or a weight function needs the samples.

    Raises:
        ManifestError: a source without an index summary (built by a wsishard without indexes), or one that does
            not match its manifest, or a shard index that does not match its shard.
        ValueError: bad ``weights``/``proportions``, or ``select``/a weight function returning bad values.
    """
    if isinstance(weights, str) and weights not in ("class", "slide"):
        raise ValueError(
            f"weights= must be 'class', 'slide', a {{label: weight}} mapping or a function, got {weights!r}"
        )
    if isinstance(weights, Mapping):
        sampling.check_mapping(weights)
    summaries = [_summary(src, storage_options) for src in sources]
    urls = [join(src.root, rec.name) for src in sources for rec in src.manifest.shards]
    index_urls = tuple(join(src.root, index_name(rec.name)) for src in sources for rec in src.manifest.shards)
    rows = np.concatenate([s.samples for s in summaries]).astype(np.int64)
    source_of = np.concatenate([np.full(len(s.shards), i) for i, s in enumerate(summaries)]).astype(np.int64)
    labels = np.unique(np.concatenate([s.labels for s in summaries]))
    label_counts = np.concatenate([_dense(s.labels, s.label_counts, labels) for s in summaries])  # (n, L)
    offsets = np.cumsum([0] + [len(s.slides) for s in summaries])
    slide_global = np.concatenate([s.slide_index.astype(np.int64) + offsets[i] for i, s in enumerate(summaries)])
    slide_ptr = np.concatenate([[0], np.cumsum(np.concatenate([np.diff(s.slide_ptr) for s in summaries]))])
    slide_count = np.concatenate([s.slide_count for s in summaries]).astype(np.int64)
    plan = SamplingPlan(select=select, weights=weights, urls={u: i for i, u in enumerate(urls)}, index_urls=index_urls,
                        rows=rows, selected=rows.copy(), totals=np.zeros(len(rows)), scales=np.ones(len(rows)),
                        labels=labels, slide_ptr=slide_ptr.astype(np.int64), slide_global=slide_global)  # fmt: skip
    totals = np.zeros(len(rows))
    if select is not None or callable(weights):
        label_counts, slide_count, totals = _scan(plan, opener, len(labels))
        plan.selected[:] = label_counts.sum(axis=1)
    if weights is None:
        return plan
    if callable(weights):
        pass
    elif weights == "slide":
        per_slide = np.bincount(slide_global, weights=slide_count, minlength=int(offsets[-1]))
        object.__setattr__(plan, "slide_weight", sampling.inverse(per_slide))
        totals = sampling.csr_totals(plan.slide_ptr, slide_count * plan.slide_weight[slide_global])
    else:
        object.__setattr__(plan, "label_weight", sampling.label_weights(labels, label_counts.sum(axis=0), weights))
        totals = label_counts @ plan.label_weight
    per_source = np.bincount(source_of, weights=totals, minlength=len(sources))
    scales = sampling.proportion_scales(per_source, proportions)[source_of]
    plan.scales[:] = scales
    plan.totals[:] = totals * scales
    if plan.totals.sum() <= 0:
        raise ValueError("weights= gives every selected sample weight 0: nothing to draw")
    return plan


def _summary(src: Source, storage_options: StorageOptions | None) -> Summary:
    location = join(src.root, SUMMARY_NAME)
    try:
        data = read_bytes(location, storage_options)
    except FileNotFoundError as exc:
        raise ManifestError(src.where, f"has no per-sample index ({SUMMARY_NAME}): it was built by a wsishard "
                                       "without one; select= and weights= need it (rebuild it, or stream it without "
                                       "them)") from exc  # fmt: skip
    summary = Summary.from_bytes(data, redact(location, storage_options))
    names = [rec.name for rec in src.manifest.shards]
    if summary.shards.astype(str).tolist() != names:
        raise ManifestError(src.where, f"{SUMMARY_NAME} lists other shards than the manifest (a stale index?)")
    return summary


def _dense(have: np.ndarray, counts: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, L) ``counts`` (over labels ``have``) spread over ``labels``."""
    out = np.zeros((counts.shape[0], len(labels)), dtype=np.int64)
    out[:, np.searchsorted(labels, have)] = counts
    return out


def _scan(plan: SamplingPlan, opener: Opener, n_labels: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every shard index read once, one at a time: per shard its selected samples per label (n, L), per slide (in
    CSR order) and its total weight under a weight function."""
    n = len(plan.rows)
    label_counts = np.zeros((n, n_labels), dtype=np.int64)
    slide_count = np.zeros(len(plan.slide_global), dtype=np.int64)
    totals = np.zeros(n)
    for s in range(n):
        index = load_shard_index(plan, s, opener)
        table = index.table(_shard_of(plan.index_urls[s]))
        mask = plan.mask(s, index, table)
        labels = index.columns["label"][mask]
        label_counts[s] = np.bincount(np.searchsorted(plan.labels, labels), minlength=n_labels)
        lo, hi = int(plan.slide_ptr[s]), int(plan.slide_ptr[s + 1])
        slide_count[lo:hi] = np.bincount(index.columns["slide"][mask], minlength=hi - lo)[: hi - lo]
        if callable(plan.weights):
            totals[s] = float(plan.sample_weights(s, index, table)[mask].sum())
    return label_counts, slide_count, totals


def load_shard_index(plan: SamplingPlan, s: int, opener: Opener) -> ShardIndex:
    """Shard ``s``'s index, read whole through ``opener``.

    Raises:
        ShardError: it cannot be read, is no index, or holds another number of samples than the shard.
    """
    location = plan.index_urls[s]
    shown = redact(location)
    try:
        with opener(location) as fh:
            data = fh.read()
        index = load_index(data, shown)
    except (OSError, ValueError) as exc:
        raise ShardError(shown, f"its index cannot be read ({type(exc).__name__}: {exc})") from exc
    if len(index) != int(plan.rows[s]):
        raise ShardError(shown, f"indexes {len(index)} samples, the manifest says {int(plan.rows[s])}")
    return index


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
        table = index.table(_shard_of(plan.index_urls[s])) if plan.select or callable(plan.weights) else None
        chosen = np.flatnonzero(plan.mask(s, index, table))
        if len(chosen) != int(plan.selected[s]):
            raise ShardError(redact(ref.url), f"select= keeps {len(chosen)} samples now, {int(plan.selected[s])} "
                                              "when the stream was planned (select must be deterministic)")  # fmt: skip
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
                whole = ShardRef(ref.url, int(self.plan.rows[s]))
                for raw in read_shard(whole, self.opener, self.on_error):
                    for _ in range(wanted.get(raw["key"], 0)):
                        yield raw
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


def weights_of_reader(plan: SamplingPlan, refs: Sequence[ShardRef]) -> dict[str, float]:
    """Expected draws per visit of each of a reader's shards (their slices' share of each shard's total weight)."""
    s = [plan.urls[r.url] for r in refs]
    kept = np.array([r.kept for r in refs], dtype=np.float64)
    share = kept / np.maximum(plan.selected[s], 1)
    expected = sampling.expected_draws(plan.totals[s] * share, kept)
    return {r.url: float(e) for r, e in zip(refs, expected.tolist(), strict=True)}


def refs_of(plan: SamplingPlan, urls: Sequence[str]) -> list[ShardRef]:
    """The stream's shards under ``plan``: each with its selected count, those with nothing to yield left out."""
    out = []
    for url in urls:
        s = plan.urls[url]
        if plan.selected[s] > 0 and (not plan.weighted or plan.totals[s] > 0):
            out.append(ShardRef(url=url, samples=int(plan.selected[s])))
    return out
