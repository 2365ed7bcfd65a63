"""Opening a stream: :func:`stream` reads each build output's manifest (and, for ``select``/``weights``, its
per-sample index summary) and makes the :class:`~wsishard.streaming.dataset.ShardStream` over their shards."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

from wsishard.embedding.output import is_embeddings
from wsishard.errors import ManifestError
from wsishard.manifest import build_mpps, expected_patch_size
from wsishard.storage.opener import StreamOpener, load_manifest
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming import selection
from wsishard.streaming.config import StreamConfig
from wsishard.streaming.context import one_context, read_context
from wsishard.streaming.dataset import ShardStream
from wsishard.streaming.sampling import Select, Weights
from wsishard.streaming.stages import ErrorMode, Opener, ShardRef
from wsishard.streaming.world import World, rank_share

__all__ = ["stream"]


def stream(
    source: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    batch_size: int,
    resampled: bool = True,
    shuffle: int = 1000,
    seed: int | None = None,
    drop_last: bool = True,
    on_error: ErrorMode = "raise",
    storage_options: StorageOptions | None = None,
    opener: Opener | None = None,
    world: World | None = None,
    select: Select | None = None,
    weights: Weights | None = None,
    proportions: Sequence[float] | None = None,
    pad_last: bool = False,
    split_scan: bool | None = None,
    lazy_select: bool | None = None,
    context: bool = True,
    mixed_mpp: bool = False,
    epoch_size: int | None = None,
    max_patches: int | None = None,
) -> ShardStream:
    """Stream batches from one or more build outputs (folder, manifest path or URL prefix).

    Shard names and per-shard sample counts come from each output's manifest. Iterate the result
    directly, or through :func:`loader` for worker processes. Options are those of :class:`StreamConfig`.
    ``select``, ``weights`` and ``proportions`` read each output's per-sample index (:mod:`wsishard.shards.index`,
    written by the build): see ``docs/guide/sampling.md``.

    Args:
        source: a build output, or a list of them (their shards are combined).
        storage_options: fsspec options for URLs, used for manifests and shards.
        opener: ``location -> binary file`` replacing the fsspec/local opener (must pickle).
        world: rank and world size; detected when None.
        select: ``columns -> (n,) bool`` over a shard index's columns (``label``, ``slide_id``, ``tissue``, ``x``...):
            only the samples it keeps are streamed. Deterministic, and it must pickle (the workers call it). A
            resampled stream without weights reads no index at start-up: each reader applies it as it visits a
            shard (its errors then come from the reader; see ``lazy_select``); epoch mode and weights read every
            index once at start-up (see ``split_scan``).
        weights: ``"class"`` (every label equally likely), ``"slide"`` (every slide equally likely),
            ``{label: weight}`` (labels not named: 0), or ``columns -> (n,) weights >= 0``. Resampled: endless draws;
            epoch mode: ``epoch_size`` draws with replacement per epoch, every rank the same number of batches.
        proportions: with several sources and ``weights``, the share of draws of each (MosaicML's ``proportion``).
        pad_last: epoch mode: every selected sample exactly once over all ranks and workers, every rank the same
            number of batches, the last ones padded with repeats marked ``batch["valid"] == False``.
        split_scan: for ``select``/a weight function under torch.distributed, each rank reads 1/world of the shard
            indexes and the counts are summed (every rank must then call :func:`stream` alike). None (default):
            whenever a process group of several ranks is initialised; False: every rank reads every index.
        lazy_select: None (default): a resampled stream with ``select`` and no weights applies it as its readers
            visit their shards; False: it reads every index at start-up, as epoch mode does, and leaves out the
            shards it keeps nothing of (a ``select`` so sparse that some reader's shards hold no selected sample).
        context: decode a context build's context patches into ``batch["context"]`` (or leave them unread).
        mixed_mpp: stream outputs built at different mpps together (a batch then mixes magnifications; each
            sample's ``.json`` says its ``patch_mpp``). Without it they are refused. A build that records several
            mpps itself (its ``options.patch.target_mpp`` a list) needs it only beside an output of other mpps.
        epoch_size: epoch mode with ``weights``: draws per epoch over all ranks (default: the selected samples).
        max_patches: bags (an embeddings output, :mod:`~wsishard.streaming.bags`): at most this many patches per bag
            per draw, a subset seeded by (seed, epoch, slide id). None: every patch.

    Raises:
        ManifestError: a manifest is missing or unreadable, names no shard or a bad one, or the outputs differ in
            patch size or context, or in mpp without ``mixed_mpp``; with ``select``/``weights``, an output without a
            per-sample index.
        ValueError: a bad option.
    """
    sources = [source] if isinstance(source, str | os.PathLike) else list(source)
    tasks, sizes, read = _read_manifests(sources, storage_options)
    patch_size_px = _one_patch_size(sizes)
    bags = _bags(read)
    context = context and not bags
    if not mixed_mpp:
        _one_mpp({s.where: build_mpps(s.manifest, s.where) for s in read})
    scales = one_context({s.where: read_context(s.manifest, s.where, patch_size_px) for s in read}) if context else None
    config = StreamConfig(
        batch_size=batch_size,
        resampled=resampled,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        on_error=on_error,
        patch_size_px=patch_size_px,
        pad_last=pad_last,
        context_scales=len(scales.mpp) if scales else 0,
        context_size_px=scales.size_px if scales else None,
        epoch_size=epoch_size,
        bags=bags,
        max_patches=max_patches,
    )
    _check_epoch_size(epoch_size, weights)
    opener = opener or StreamOpener(dict(storage_options or {}))
    tasks, plan = selection.choose(
        read,
        tasks,
        select=select,
        weights=weights,
        proportions=proportions,
        storage_options=storage_options,
        opener=opener,
        share=rank_share(world) if split_scan is not False else None,
        resampled=resampled and lazy_select is not False,
    )
    return ShardStream(tasks, config, world=world, opener=opener, sampling=plan)


def _check_epoch_size(epoch_size: int | None, weights: Weights | None) -> None:
    """Refuse ``epoch_size`` without ``weights`` (it counts weighted draws)."""
    if epoch_size is not None and weights is None:
        raise ValueError(f"epoch_size={epoch_size!r} counts weighted draws: it needs weights= (and resampled=False)")


def _bags(read: list[selection.Source]) -> bool:
    """Whether the sources are embeddings outputs (streamed as bags) rather than pixel builds.

    Raises:
        ManifestError: some are and some are not.
    """
    kinds = {s.where: is_embeddings(s.manifest) for s in read}
    if len(set(kinds.values())) > 1:
        bags = ", ".join(w for w, k in kinds.items() if k)
        raise ManifestError(bags, "an embeddings output (bags of slides) streamed with pixel builds: stream each alone")
    return any(kinds.values())


def _one_patch_size(sizes: dict[str, int]) -> int:
    """The patch size all sources share (a batch holds images of one size).

    Raises:
        ManifestError: the sources have different patch sizes (each is named with its size).
    """
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{where}: {px} px" for where, px in sizes.items())
        raise ManifestError(", ".join(sizes), f"the outputs have different patch sizes ({listed}); stream them apart")
    return next(iter(sizes.values()))


def _one_mpp(mpps: dict[str, tuple[float, ...]]) -> None:
    """Refuse sources whose builds recorded different mpps (a batch would mix magnifications without a word).

    A build that records several mpps (a list) is compared as that list: it streams alone, or beside builds of the
    same mpps. A source that records none (not written by ``wsishard build``) differs from one that does.

    Raises:
        ManifestError: the sources' mpps differ (each named with its mpps), pointing at ``mixed_mpp=True``.
    """
    first = next(iter(mpps.values()))
    if all(_same_mpps(first, other) for other in mpps.values()):
        return
    listed = ", ".join(f"{where}: {_mpps_text(m)}" for where, m in mpps.items())
    raise ManifestError(
        ", ".join(mpps),
        f"the outputs were built at different mpps ({listed}): a batch would mix magnifications; "
        "stream them apart, or pass mixed_mpp=True to mix them on purpose",
    )


def _same_mpps(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, rel_tol=1e-6) for x, y in zip(a, b, strict=True))


def _mpps_text(mpps: tuple[float, ...]) -> str:
    return " and ".join(f"{m:g}" for m in mpps) + " mpp" if mpps else "mpp not recorded"


def _read_manifests(
    sources: Sequence[str | os.PathLike[str]], storage_options: StorageOptions | None
) -> tuple[list[ShardRef], dict[str, int], list[selection.Source]]:
    """Every source's shards (in manifest order), patch size (by its redacted location) and manifest.

    Raises:
        ManifestError: a manifest is missing or unreadable, lacks the patch size, or the sources hold no shard.
    """
    tasks: list[ShardRef] = []
    sizes: dict[str, int] = {}  # source (redacted) -> its patch size, px
    read: list[selection.Source] = []
    for src in sources:
        manifest, root = load_manifest(os.fspath(src), storage_options, slides=False)
        where = redact(os.fspath(src), storage_options)
        sizes[where] = expected_patch_size(manifest, where)
        tasks += [ShardRef(url=join(root, rec.name), samples=rec.samples) for rec in manifest.shards]
        read.append(selection.Source(root, manifest, where))
    if not tasks:
        raise ManifestError(", ".join(sizes), "lists no shards")
    return tasks, sizes, read
