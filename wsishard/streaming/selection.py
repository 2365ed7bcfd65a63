"""The sampling plan of ``select=``/``weights=``/``proportions=``, made once in the main process (see
:mod:`wsishard.streaming.indexed`): a few numbers per shard and per slide, never a row per sample.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from wsishard.errors import ManifestError, ShardError
from wsishard.manifest import Manifest
from wsishard.shards.index import ShardIndex, index_name, load_index
from wsishard.shards.summary import SUMMARY_NAME, Summary
from wsishard.storage.opener import read_bytes
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming import sampling
from wsishard.streaming.sampling import Select, Table, Weights
from wsishard.streaming.stages import Opener, ShardRef

Share = tuple[int, int, Callable[[np.ndarray], np.ndarray] | None]  # (rank, size, sum over the processes)
_READERS = 8  # shard indexes read at once in the main process's scan


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
        return sampling.checked_mask(self.select(table or index.table(shard_of(where))), len(index), where)

    def sample_weights(self, s: int, index: ShardIndex, table: Table | None = None) -> np.ndarray:
        """(rows,) each sample's weight in shard ``s`` (before ``select``), times its source's scale."""
        w = self.weights
        if w == "slide":
            lo, hi = int(self.slide_ptr[s]), int(self.slide_ptr[s + 1])
            out = self.slide_weight[self.slide_global[lo:hi]][index.columns["slide"]]
        elif callable(w):
            where = redact(self.index_urls[s])
            out = sampling.checked_weights(w(table or index.table(shard_of(where))), len(index), where)
        else:  # "class" or a mapping: by label
            labels = index.columns["label"]
            at = np.searchsorted(self.labels, labels).clip(0, max(len(self.labels) - 1, 0))
            known = (self.labels[at] == labels) if len(self.labels) else np.zeros(len(labels), bool)
            out = np.where(known, self.label_weight[at] if len(self.labels) else 0.0, 0.0)
        return np.asarray(out, dtype=np.float64) * float(self.scales[s])


def shard_of(location: str) -> str:
    """The shard name an index location stands for (its last path part, ``.idx.npz`` made ``.tar``)."""
    return location.rsplit("/", 1)[-1].replace(".idx.npz", ".tar")


@dataclass(frozen=True)
class Source:
    """One build output as :func:`plan_sampling` reads it."""

    root: str
    manifest: Manifest
    where: str  # redacted, for messages


def _check_weights(weights: Weights | None) -> None:
    """Refuse a ``weights`` that is no mode, mapping or function."""
    if isinstance(weights, str) and weights not in ("class", "slide"):
        raise ValueError(
            f"weights= must be 'class', 'slide', a {{label: weight}} mapping or a function, got {weights!r}"
        )
    if isinstance(weights, Mapping):
        sampling.check_mapping(weights)


def _weighted_totals(
    plan: SamplingPlan,
    weights: Weights,
    label_counts: np.ndarray,
    slide_count: np.ndarray,
    slides: int,
    totals: np.ndarray,
) -> np.ndarray:
    """Each shard's weight in all under ``weights`` (a weight function's ``totals`` come from the scan); the
    per-slide or per-label weights are set on ``plan``."""
    if callable(weights):
        return totals
    if weights == "slide":
        per_slide = np.bincount(plan.slide_global, weights=slide_count, minlength=slides)
        object.__setattr__(plan, "slide_weight", sampling.inverse(per_slide))
        return sampling.csr_totals(plan.slide_ptr, slide_count * plan.slide_weight[plan.slide_global])
    label_weight = sampling.label_weights(plan.labels, label_counts.sum(axis=0), weights)
    object.__setattr__(plan, "label_weight", label_weight)
    return label_counts @ label_weight


def plan_sampling(
    sources: Sequence[Source],
    *,
    select: Select | None,
    weights: Weights | None,
    proportions: Sequence[float] | None,
    storage_options: StorageOptions | None,
    opener: Opener,
    share: Share | None = None,
) -> SamplingPlan:
    """The :class:`SamplingPlan` of ``sources`` (main process): summaries read, and every shard index read once
    only where ``select`` or a weight function needs the samples: by this process alone, or with ``share`` (in a
    DDP job, :func:`~wsishard.streaming.world.rank_share`) each rank reads its share and the counts are summed.

    Raises:
        ManifestError: a source without an index summary (built by a wsishard without indexes), or one that does
            not match its manifest, or a shard index that does not match its shard.
        ValueError: bad ``weights``/``proportions``, or ``select``/a weight function returning bad values.
    """
    _check_weights(weights)
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
    plan = SamplingPlan(
        select=select,
        weights=weights,
        urls={u: i for i, u in enumerate(urls)},
        index_urls=index_urls,
        rows=rows,
        selected=rows.copy(),
        totals=np.zeros(len(rows)),
        scales=np.ones(len(rows)),
        labels=labels,
        slide_ptr=slide_ptr.astype(np.int64),
        slide_global=slide_global,
    )
    totals = np.zeros(len(rows))
    if select is not None or callable(weights):
        label_counts, slide_count, totals = scan_shared(plan, opener, len(labels), share)
        plan.selected[:] = label_counts.sum(axis=1)
    if weights is None:
        return plan
    totals = _weighted_totals(plan, weights, label_counts, slide_count, int(offsets[-1]), totals)
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
        raise ManifestError(
            src.where,
            f"has no per-sample index ({SUMMARY_NAME}): it was built by a wsishard "
            "without one; select= and weights= need it (rebuild it, or stream it without "
            "them)",
        ) from exc
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


def scan_shared(
    plan: SamplingPlan, opener: Opener, n_labels: int, share: Share | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per shard its selected samples per label (n, L), per slide (in CSR order) and its total weight under a
    weight function, from every shard index. With ``share`` (``(rank, size, sum)``: ``sum`` adds an array over the
    ``size`` processes, each calling it with the same shape) this process reads shards ``rank::size`` only."""
    rank, size, total = share or (0, 1, None)
    label_counts = np.zeros((len(plan.rows), n_labels), dtype=np.int64)
    slide_count = np.zeros(len(plan.slide_global), dtype=np.int64)
    totals = np.zeros(len(plan.rows))
    with ThreadPoolExecutor(_READERS) as pool:  # reads overlap (object stores: latency); masks in order, here
        for s, index in zip(
            range(rank, len(plan.rows), size), _read_ahead(pool, plan, opener, rank, size), strict=True
        ):
            table = index.table(shard_of(plan.index_urls[s]))
            mask = plan.mask(s, index, table)
            label_counts[s] = np.bincount(
                np.searchsorted(plan.labels, index.columns["label"][mask]), minlength=n_labels
            )
            lo, hi = int(plan.slide_ptr[s]), int(plan.slide_ptr[s + 1])
            slide_count[lo:hi] = np.bincount(index.columns["slide"][mask], minlength=hi - lo)[: hi - lo]
            if callable(plan.weights):
                totals[s] = float(plan.sample_weights(s, index, table)[mask].sum())
    if total is None or size == 1:
        return label_counts, slide_count, totals
    # each entry is non-zero on exactly one process: the sums are exact and the same everywhere
    flat = total(np.concatenate([label_counts.ravel(), slide_count, totals]).astype(np.float64))
    cut = label_counts.size + slide_count.size
    return (
        flat[: label_counts.size].astype(np.int64).reshape(label_counts.shape),
        flat[label_counts.size : cut].astype(np.int64),
        flat[cut:],
    )


def _read_ahead(
    pool: ThreadPoolExecutor, plan: SamplingPlan, opener: Opener, rank: int, size: int
) -> Iterator[ShardIndex]:
    """The indexes of shards ``rank::size`` in order, up to ``2 * _READERS`` read ahead."""
    pending: deque[Future[ShardIndex]] = deque()
    for s in range(rank, len(plan.rows), size):
        pending.append(pool.submit(load_shard_index, plan, s, opener))
        if len(pending) > 2 * _READERS:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


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


def refs_of(plan: SamplingPlan, urls: Sequence[str]) -> list[ShardRef]:
    """The stream's shards under ``plan``: each with its selected count, those with nothing to yield left out."""
    out = []
    for url in urls:
        s = plan.urls[url]
        if plan.selected[s] > 0 and (not plan.weighted or plan.totals[s] > 0):
            out.append(ShardRef(url=url, samples=int(plan.selected[s])))
    return out


def choose(
    sources: Sequence[Source],
    tasks: list[ShardRef],
    *,
    select: Select | None,
    weights: Weights | None,
    proportions: Sequence[float] | None,
    storage_options: StorageOptions | None,
    opener: Opener,
    share: Share | None = None,
) -> tuple[list[ShardRef], SamplingPlan | None]:
    """The stream's shards and sampling plan: ``tasks`` and None without ``select``/``weights``.

    Raises:
        ValueError: ``proportions`` without ``weights``, or a ``select`` keeping nothing; as :func:`plan_sampling`.
    """
    if proportions is not None and weights is None:
        raise ValueError("proportions= weighs sources against each other: it needs weights= too")
    if select is None and weights is None:
        return tasks, None
    plan = plan_sampling(
        sources,
        select=select,
        weights=weights,
        proportions=proportions,
        storage_options=storage_options,
        opener=opener,
        share=share,
    )
    chosen = refs_of(plan, [t.url for t in tasks])
    if not chosen:
        raise ValueError(f"select= keeps no sample of {', '.join(s.where for s in sources)}")
    return chosen, plan
