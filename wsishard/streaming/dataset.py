"""The training-time pipeline, composed from webdataset parts and run inside the DataLoader workers.

    manifest shard list -> split by node (rank) -> split by worker
      -> resampled: endless re-shuffle of this worker's shards, seeded by (seed, rank, worker, pass)
       | epoch:     this worker's shards of the epoch's plan, capped at its batch budget
      -> tar -> samples (counted against the manifest) -> shuffle buffer (bytes) -> lean decode
      -> uint8 batches (b, h, w, 3)

Ranks and workers split the shard list exactly as ``wds.split_by_node`` and ``wds.split_by_worker`` do
(``islice(src, index, None, count)``), but from a :class:`~wsishard.streaming.world.World` detected once in the
main process: webdataset's splitters re-detect the rank in each worker from the environment, which in a
worker started by ``spawn`` without ``RANK`` silently gives every rank all shards, and would let the epoch
arithmetic in :mod:`wsishard.streaming.partition` and the actual split disagree.

Error behaviour (``on_error``):
    ``"raise"`` (default): a shard that cannot be opened, is truncated or corrupt, holds a sample with a
    missing member, an undecodable image, an image whose header declares another size than the manifest's
    patch size (checked before decoding: a decompression bomb costs nothing) or a member name that is not a key
    (a path), or holds fewer samples than the manifest says raises :class:`~wsishard.errors.ShardError` naming
    the shard (and the sample). A sample missing a member is never yielded; a short shard is only detectable at
    its end, so its earlier (complete) samples may already have been batched. ``"skip"``: the rest of a failing
    shard (or the one bad sample) is skipped, counted and logged; complete samples read before the failure are
    kept. In epoch mode under DDP a worker left short by skipping tops up by re-reading its own shards, so every
    rank still yields the planned number of batches (some samples are then seen twice); a single process just
    yields fewer batches.

The stages live in :mod:`wsishard.streaming.stages` and :mod:`wsishard.streaming.decode`. Members other than the
image, ``.json`` and ``.cls`` are never read: ``.pyd``/``.pth``/``.pickle`` members are ignored and nothing is
ever unpickled. A worker's :class:`~wsishard.errors.ShardError` reaches the caller as a ``ShardError`` with its
fields: the worker hands it over as data (:class:`WorkerShardError`), not as an exception DataLoader would
re-raise as ``RuntimeError`` text.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import webdataset as wds

from wsishard.errors import ManifestError, ShardError, TopologyError
from wsishard.format import expected_patch_size
from wsishard.storage.opener import StreamOpener, load_manifest
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming.decode import Batch, DecodeIntoBatches
from wsishard.streaming.partition import EpochPlan, Slice, check_readers, epoch_order, plan_epoch, reader_slices
from wsishard.streaming.stages import (
    Budget,
    ErrorMode,
    Opener,
    ReadShards,
    Resample,
    ShardList,
    ShardRef,
    Shuffle,
)
from wsishard.streaming.world import World, detect_world

logger = logging.getLogger(__name__)

_SHUFFLE_STREAM, _TOPUP_STREAM = 1, 2  # extra seed words keeping the random streams apart


@dataclass(frozen=True, kw_only=True)
class StreamConfig:
    """Options of a :class:`ShardStream`.

    Attributes:
        batch_size: samples per batch, batched in the workers.
        resampled: endless step-based streaming (True) or exact epochs (False).
        shuffle: shuffle buffer size in samples per worker (0 or 1: no buffer).
        seed: base seed; None draws one from OS entropy (resampled) and uses 0 for the epoch plan,
            which all ranks must share.
        drop_last: epoch mode: workers drop their last incomplete batch (resampled batches are always full).
        on_error: ``"raise"`` or ``"skip"`` broken shards and samples.
        patch_size_px: width = height of every image, px: the manifests' patch size (:func:`stream` reads it);
            a :class:`ShardStream` needs it. A sample of another size is a broken sample.
    """

    batch_size: int
    resampled: bool = True
    shuffle: int = 1000
    seed: int | None = None
    drop_last: bool = True
    on_error: ErrorMode = "raise"
    patch_size_px: int | None = None

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.shuffle < 0:
            raise ValueError(f"shuffle must be >= 0 samples, got {self.shuffle}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0 or None, got {self.seed}")
        if self.on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.patch_size_px is not None and self.patch_size_px < 1:
            raise ValueError(f"patch_size_px must be >= 1 px or None, got {self.patch_size_px}")


# ---- stages: each is picklable and maps an iterator to an iterator -------------------------------------


@dataclass(frozen=True)
class _Refill:
    """Top-up batches for :class:`Budget`: one more reshuffled pass over a worker's own shards."""

    dataset: ShardStream
    tasks: tuple[ShardRef, ...]
    seed: tuple[int, ...]

    def __call__(self, pass_index: int) -> Iterator[Batch]:
        order = np.random.default_rng((*self.seed, pass_index)).permutation(len(self.tasks))
        source = ShardList(tuple(self.tasks[i] for i in order.tolist()))
        stages = self.dataset.sample_stages((*self.seed, pass_index), max_failures=len(self.tasks))
        return iter(wds.DataPipeline(source, *stages))


# ---- the dataset ---------------------------------------------------------------------------------------


class ShardStream(torch.utils.data.IterableDataset[Batch]):
    """An iterable dataset of uint8 :class:`Batch` es over the shards of one or more build outputs.

    Resampled mode never ends: iterate it for a number of steps. Epoch mode yields one exact pass, the
    same number of batches (:meth:`batches_per_rank`) on every rank. Each new iteration is a new epoch
    (counted per process, and by :func:`loader` across worker restarts); :meth:`set_epoch` sets it
    explicitly. Batch counts assume every rank uses the same ``num_workers``.

    Args:
        shards: every shard of the job, in manifest order.
        config: the stream's options.
        world: rank and world size; detected from torch.distributed / torchrun when None.
        opener: ``location -> binary file``; :class:`~wsishard.storage.opener.StreamOpener` when None.
    """

    def __init__(self, shards: Sequence[ShardRef], config: StreamConfig, *, world: World | None = None,
                 opener: Opener | None = None) -> None:  # fmt: skip
        super().__init__()
        if config.patch_size_px is None:
            raise ValueError("config.patch_size_px is None: a stream needs the build's patch size (stream() reads it "
                             "from the manifests)")  # fmt: skip
        self.shards = tuple(shards)
        self.config = config
        self.image_hw = (config.patch_size_px, config.patch_size_px)  # (h, w) of every image
        self.world = (world or detect_world()).with_worker(0, 1)
        self.opener: Opener = opener or StreamOpener()
        self.counts = np.array([s.samples for s in self.shards], dtype=np.int64)  # (n,)
        # drawn once here, in the main process, so that every worker of this rank agrees on it
        self.base_seed = config.seed if config.seed is not None else int(np.random.default_rng().integers(2**63))
        self._epoch_next = 0
        self._local_passes = 0
        self._pinned = False

    @property
    def plan_seed(self) -> int:
        """The seed of the shard assignment, shared by all ranks (``seed``, or 0 without one)."""
        return self.config.seed if self.config.seed is not None else 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``; passes after it count on from there."""
        self._epoch_next, self._local_passes, self._pinned = epoch, 0, True

    def plan(self, epoch: int, num_workers: int) -> EpochPlan:
        """The epoch's plan for this job's ranks with ``num_workers`` workers each (epoch mode)."""
        return plan_epoch(self.counts, world_size=self.world.world_size, num_workers=max(num_workers, 1),
                          batch_size=self.config.batch_size, seed=self.plan_seed, epoch=epoch,
                          drop_last=self.config.drop_last)  # fmt: skip

    def batches_per_rank(self, num_workers: int, epoch: int = 0) -> int:
        """Batches each rank yields in ``epoch`` (epoch mode; varies slightly between epochs)."""
        return self.plan(epoch, num_workers).batches_per_rank

    def check_topology(self, num_workers: int) -> None:
        """Raise now, in the main process, what the workers would otherwise hit.

        Raises:
            TopologyError: fewer samples than ranks x workers, or an epoch without a single batch.
        """
        check_readers(self.counts, self.world.world_size, max(num_workers, 1))
        if not self.config.resampled and self.batches_per_rank(num_workers) == 0:
            raise TopologyError(
                f"{int(self.counts.sum())} samples give no batch of {self.config.batch_size} per rank "
                f"with {self.world.world_size} rank(s) x {max(num_workers, 1)} worker(s)"
            )

    def sample_stages(self, seed: tuple[int, ...], max_failures: int = 1) -> list[Any]:
        """The stages from shard tasks to batches: read, shuffle (seeded by ``seed``), decode, batch."""
        cfg = self.config
        drop_last = cfg.drop_last or cfg.resampled
        return [ReadShards(self.opener, cfg.on_error, max_failures=max_failures),
                Shuffle(cfg.shuffle, (*seed, _SHUFFLE_STREAM)),
                DecodeIntoBatches(cfg.batch_size, self.image_hw, drop_last=drop_last,
                                  on_error=cfg.on_error)]  # fmt: skip

    def pipeline(self, world: World, epoch: int) -> wds.DataPipeline:
        """The webdataset pipeline that ``world``'s (rank, worker) runs in ``epoch`` (or for ever)."""
        check_readers(self.counts, world.world_size, world.num_workers)
        seed = (self.base_seed, world.rank, world.worker, epoch)
        if self.config.resampled:
            order = epoch_order(self.counts, world_size=world.world_size, num_workers=world.num_workers,
                                seed=self.plan_seed, epoch=0)  # fmt: skip
            mine = self._refs(reader_slices(order, self.counts, world))
            resample, budget = Resample(self.base_seed, world.rank, world.worker), None
            if not any(ref.kept for ref in mine):
                raise TopologyError(f"rank {world.rank} worker {world.worker} owns only empty shards")
        else:
            plan = self.plan(epoch, world.num_workers)
            mine, resample = self._refs(plan.slices_of(world)), None
            topup = self.config.on_error == "skip" and world.world_size > 1
            budget = Budget(plan.budget_of(world), _Refill(self, mine, (*seed, _TOPUP_STREAM)) if topup else None)
        logger.debug("rank %d worker %d epoch %d: %d shards", world.rank, world.worker, epoch, len(mine))
        return wds.DataPipeline(ShardList(mine), resample, *self.sample_stages(seed, max_failures=len(mine)), budget)

    def _refs(self, slices: list[Slice]) -> tuple[ShardRef, ...]:
        """The shards a reader reads, each with the part of it the reader keeps."""
        return tuple(replace(self.shards[sl.shard], phase=sl.phase, step=sl.step) for sl in slices)

    def __iter__(self) -> Iterator[Batch]:
        info = torch.utils.data.get_worker_info()
        world = self.world.with_worker(info.id, info.num_workers) if info is not None else self.world
        epoch = self._epoch_next + self._local_passes
        self._local_passes += 1
        batches = iter(self.pipeline(world, epoch))
        return batches if info is None else _hand_over_errors(batches)  # type: ignore[return-value]

    def _loader_pass(self, first: bool) -> None:
        """Called by :class:`ShardLoader` in the main process before it starts its workers."""
        if self._pinned:
            self._pinned = False
        elif not first:
            self._epoch_next += 1


@dataclass(frozen=True)
class WorkerShardError:
    """A worker's :class:`~wsishard.errors.ShardError`, handed to the main process as data.

    DataLoader re-raises a worker's exception by calling its type with one message string, which a
    ``ShardError`` (two fields) does not take, so it would arrive as a ``RuntimeError``; as an item of the
    stream it arrives intact and :class:`ShardLoader` raises it as the ``ShardError`` it was.
    """

    shard: str
    reason: str


def _hand_over_errors(batches: Iterator[Batch]) -> Iterator[Batch | WorkerShardError]:
    """In a worker: the batches, then, if a ShardError ends them, that error as the stream's last item."""
    try:
        yield from batches
    except ShardError as exc:
        yield WorkerShardError(exc.shard, exc.reason)


def _raise_handed_over(items: Iterator[Batch | WorkerShardError]) -> Iterator[Batch]:
    """In the main process: the batches; a worker's handed-over error is raised as its ShardError."""
    for item in items:
        if isinstance(item, WorkerShardError):
            raise ShardError(item.shard, item.reason)
        yield item


class ShardLoader(wds.WebLoader):
    """A ``wds.WebLoader`` (a DataLoader with ``batch_size=None``) that counts epochs for its dataset.

    Each iteration after the first advances the dataset's epoch (unless :meth:`ShardStream.set_epoch`
    was called), so non-persistent workers, which get a fresh copy of the dataset, still see a new
    shard order every epoch. With ``persistent_workers=True`` the workers count epochs themselves (the
    same numbers), but a later ``set_epoch`` no longer reaches them. Errors from workers come back as
    :class:`~wsishard.errors.ShardError` (DataLoader itself would turn them into ``RuntimeError``).
    """

    def __init__(self, dataset: ShardStream, **kwargs: Any) -> None:
        super().__init__(dataset, batch_size=None, **kwargs)
        self.dataset = dataset
        self.num_workers = int(kwargs.get("num_workers", 0))
        self._iterations = 0

    def __iter__(self) -> Iterator[Batch]:
        if self.num_workers > 0:
            self.dataset._loader_pass(first=self._iterations == 0)
        self._iterations += 1
        return _raise_handed_over(super().__iter__())


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
) -> ShardStream:
    """Stream batches from one or more build outputs (folder, manifest path or URL prefix).

    Shard names and per-shard sample counts come from each output's manifest. Iterate the result
    directly, or through :func:`loader` for worker processes. Options are those of :class:`StreamConfig`.

    Args:
        source: a build output, or a list of them (their shards are combined).
        storage_options: fsspec options for URLs, used for manifests and shards.
        opener: ``location -> binary file`` replacing the fsspec/local opener (must pickle).
        world: rank and world size; detected when None.

    Raises:
        ManifestError: a manifest is missing or unreadable, names a shard that is no shard file name, lacks the
            patch size, or the outputs hold no shard or have different patch sizes.
        ValueError: a bad option.
    """
    sources = [source] if isinstance(source, str | os.PathLike) else list(source)
    tasks: list[ShardRef] = []
    sizes: dict[str, int] = {}  # source (redacted) -> its patch size, px
    for src in sources:
        manifest, root = load_manifest(os.fspath(src), storage_options)
        where = redact(os.fspath(src), storage_options)
        sizes[where] = expected_patch_size(manifest, where)
        tasks += [ShardRef(url=join(root, rec.name), samples=rec.samples) for rec in manifest.shards]
    if not tasks:
        raise ManifestError(", ".join(sizes), "lists no shards")
    config = StreamConfig(batch_size=batch_size, resampled=resampled, shuffle=shuffle, seed=seed,
                          drop_last=drop_last, on_error=on_error, patch_size_px=_one_patch_size(sizes))  # fmt: skip
    return ShardStream(tasks, config, world=world, opener=opener or StreamOpener(dict(storage_options or {})))


def _one_patch_size(sizes: dict[str, int]) -> int:
    """The patch size all sources share (a batch holds images of one size).

    Raises:
        ManifestError: the sources have different patch sizes (each is named with its size).
    """
    if len(set(sizes.values())) > 1:
        listed = ", ".join(f"{where}: {px} px" for where, px in sizes.items())
        raise ManifestError(", ".join(sizes), f"the outputs have different patch sizes ({listed}); stream them apart")
    return next(iter(sizes.values()))


def loader(dataset: ShardStream, *, num_workers: int = 4, pin_memory: bool | None = None,
           **kwargs: Any) -> ShardLoader:  # fmt: skip
    """A :class:`ShardLoader` over ``dataset``: ``batch_size=None`` (the workers batch), pinned on CUDA.

    Args:
        dataset: from :func:`stream`.
        num_workers: DataLoader worker processes per rank (use the same on every rank).
        pin_memory: default: True when CUDA is available.
        **kwargs: passed to ``torch.utils.data.DataLoader`` (``prefetch_factor``, ``persistent_workers``...).

    Raises:
        TopologyError: too few shards for ranks x ``num_workers`` (raised here, not in a worker).
        ValueError: ``batch_size`` among ``kwargs`` (batching happens in the workers).
    """
    if "batch_size" in kwargs:
        raise ValueError(f"batch_size={kwargs['batch_size']!r}: batch in stream(), the loader gets None")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    dataset.check_topology(num_workers)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    return ShardLoader(dataset, num_workers=num_workers, pin_memory=pin, **kwargs)
