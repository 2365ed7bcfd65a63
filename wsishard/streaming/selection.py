"""The sampling plan of ``select=``/``weights=``/``proportions=``, made once in the main process (read by the
planner and by :class:`~wsishard.streaming.reader.ReadPieces`): a few numbers per shard and per slide, never a row
per sample.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from wsishard.manifest import Manifest
from wsishard.shards.index import ShardIndex, index_name
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming import sampling
from wsishard.streaming.indexscan import Share, read_summary, scan_shared, shard_of
from wsishard.streaming.indexscan import load_shard_index as load_shard_index  # its callers import it from here
from wsishard.streaming.sampling import Select, Table, Weights
from wsishard.streaming.stages import Opener, ShardRef


@dataclass(frozen=True, eq=False)
class SamplingPlan:
    """What to read of each shard, and with which weights: a few numbers per shard and per slide.

    Attributes:
        select: the user's ``select=`` (None: every sample).
        weights: the user's ``weights=`` (None: unweighted).
        urls: shard location -> its row in the arrays below.
        index_urls: (n,) each shard's index location.
        rows: (n,) samples in each shard (its manifest count).
        index_digests: (n,) each shard index's digest as the manifest records it ("": not recorded, an older build).
        selected: (n,) samples ``select`` keeps in each shard.
        totals: (n,) total weight of each shard's selected samples (scaled by its source's proportion).
        scales: (n,) the factor of each shard's source (``proportions=``).
        labels, label_weight: (L,) label values and the weight of one sample of each (``"class"``, mapping).
        slide_ptr, slide_global: shard ``s``'s slides (in its index's order) are global slides
            ``slide_global[slide_ptr[s]:slide_ptr[s + 1]]``.
        slide_weight: (S,) the weight of one sample of each global slide (``"slide"``).
        lazy: ``select`` is applied as each reader visits a shard (a resampled, unweighted stream: no shard index is
            read at start-up); ``selected`` are then the shards' rows, an upper bound.
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
    index_digests: tuple[str, ...] = ()
    lazy: bool = False

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
    where: str = "the stream",
) -> np.ndarray:
    """Each shard's weight in all under ``weights`` (a weight function's ``totals`` come from the scan); the
    per-slide or per-label weights are set on ``plan``. ``where`` names the sources in messages."""
    if callable(weights):
        return totals
    if weights == "slide":
        per_slide = np.bincount(plan.slide_global, weights=slide_count, minlength=slides)
        object.__setattr__(plan, "slide_weight", sampling.inverse(per_slide))
        return sampling.csr_totals(plan.slide_ptr, slide_count * plan.slide_weight[plan.slide_global])
    if weights == "class":
        sampling.check_classes(plan.labels, label_counts.sum(axis=0), where)
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
    lazy: bool = False,
) -> SamplingPlan:
    """The :class:`SamplingPlan` of ``sources`` (main process): summaries read, and every shard index read once
    only where ``select`` or a weight function needs the samples: by this process alone, or with ``share`` (in a
    DDP job, :func:`~wsishard.streaming.world.rank_share`) each rank reads its share and the counts are summed.
    ``lazy`` (a resampled stream with ``select`` and no weights): no index is read here, the readers apply
    ``select`` as they visit each shard.

    Raises:
        ManifestError: a source without an index summary (built by a wsishard without indexes).
        IndexFileError: an index summary or a shard index that does not match the manifest or its shard (on every
            process of a split scan).
        ValueError: bad ``weights``/``proportions``, or ``select``/a weight function returning bad values.
    """
    _check_weights(weights)
    summaries = [read_summary(src, storage_options) for src in sources]
    urls = [join(src.root, rec.name) for src in sources for rec in src.manifest.shards]
    index_urls = tuple(join(src.root, index_name(rec.name)) for src in sources for rec in src.manifest.shards)
    rows = np.array([rec.samples for src in sources for rec in src.manifest.shards], dtype=np.int64)
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
        index_digests=tuple(rec.index_sha256 for src in sources for rec in src.manifest.shards),
        lazy=lazy and select is not None and weights is None,
    )
    totals = np.zeros(len(rows))
    if (select is not None or callable(weights)) and not plan.lazy:
        label_counts, slide_count, totals = scan_shared(plan, opener, len(labels), share)
        plan.selected[:] = label_counts.sum(axis=1)
    if weights is None:
        return plan
    where = ", ".join(src.where for src in sources)
    totals = _weighted_totals(plan, weights, label_counts, slide_count, int(offsets[-1]), totals, where)
    per_source = np.bincount(source_of, weights=totals, minlength=len(sources))
    scales = sampling.proportion_scales(per_source, proportions)[source_of]
    plan.scales[:] = scales
    plan.totals[:] = totals * scales
    if plan.totals.sum() <= 0:
        raise ValueError("weights= gives every selected sample weight 0: nothing to draw")
    return plan


def _dense(have: np.ndarray, counts: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(n, L) ``counts`` (over labels ``have``) spread over ``labels``."""
    out = np.zeros((counts.shape[0], len(labels)), dtype=np.int64)
    out[:, np.searchsorted(labels, have)] = counts
    return out


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
    resampled: bool = False,
) -> tuple[list[ShardRef], SamplingPlan | None]:
    """The stream's shards and sampling plan: ``tasks`` and None without ``select``/``weights``. A ``resampled``
    stream with ``select`` and no weights reads no shard index here (:attr:`SamplingPlan.lazy`).

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
        lazy=resampled,
    )
    chosen = refs_of(plan, [t.url for t in tasks])
    if not chosen:
        raise ValueError(f"select= keeps no sample of {', '.join(s.where for s in sources)}")
    return chosen, plan


def selected_counts(plan: SamplingPlan, opener: Opener, urls: Sequence[str]) -> list[int]:
    """The samples ``select`` keeps in each of the shards ``urls`` (their indexes read): a lazy plan's true counts.

    Raises:
        IndexFileError: an index that cannot be read or does not match its shard.
    """
    out = []
    for url in urls:
        s = plan.urls[url]
        out.append(int(plan.mask(s, load_shard_index(plan, s, opener)).sum()))
    return out
