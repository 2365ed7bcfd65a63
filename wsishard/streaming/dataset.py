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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import webdataset as wds

from wsishard.errors import ShardError, TopologyError
from wsishard.storage.opener import StreamOpener
from wsishard.streaming import indexed, redeal, selection
from wsishard.streaming.config import StreamConfig
from wsishard.streaming.context import context_shape
from wsishard.streaming.decode import Batch, DecodeIntoBatches, EncodedBatches
from wsishard.streaming.partition import (
    EpochPlan,
    check_readers,
    epoch_order,
    plan_epoch,
    reader_slices,
    resume_position,
)
from wsishard.streaming.ring import UNLENT, Lending
from wsishard.streaming.sampling import log_dropped, pad_plan
from wsishard.streaming.stages import (
    SHUFFLE_STREAM,
    Budget,
    Opener,
    ReadShuffled,
    Resample,
    ShardList,
    ShardRef,
    slice_refs,
)
from wsishard.streaming.world import World, detect_world

logger = logging.getLogger(__name__)

_TOPUP_STREAM = 2  # a seed word keeping the top-up passes' random stream apart from the shuffles' (SHUFFLE_STREAM)


# ---- stages: each is picklable and maps an iterator to an iterator -------------------------------------


@dataclass(frozen=True)
class _Refill:
    """Top-up batches for :class:`Budget`: one more reshuffled pass over a worker's own shards."""

    dataset: ShardStream
    tasks: tuple[ShardRef, ...]
    seed: tuple[int, ...]
    lending: Lending

    def __call__(self, pass_index: int) -> Iterator[Batch]:
        order = np.random.default_rng((*self.seed, pass_index)).permutation(len(self.tasks))
        source = ShardList(tuple(self.tasks[i] for i in order.tolist()))
        stages = self.dataset.sample_stages(
            (*self.seed, pass_index), max_failures=len(self.tasks), lending=self.lending
        )
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
        sampling: what to read of each shard by its index (``select=``, ``weights=``); ``shards`` then carry their
            selected counts (:func:`~wsishard.streaming.selection.choose`).
    """

    def __init__(
        self,
        shards: Sequence[ShardRef],
        config: StreamConfig,
        *,
        world: World | None = None,
        opener: Opener | None = None,
        sampling: selection.SamplingPlan | None = None,
    ) -> None:
        super().__init__()
        if config.patch_size_px is None:
            raise ValueError(
                "config.patch_size_px is None: a stream needs the build's patch size (stream() reads it "
                "from the manifests)"
            )
        self.shards = tuple(shards)
        self.config = config
        self.image_hw = (config.patch_size_px, config.patch_size_px)  # (h, w) of every image
        self.world = (world or detect_world()).with_worker(0, 1)
        self.opener: Opener = opener or StreamOpener()
        self.counts = np.array([s.samples for s in self.shards], dtype=np.int64)  # (n,)
        # drawn once here, in the main process, so that every worker of this rank agrees on it
        self.base_seed = config.seed if config.seed is not None else int(np.random.default_rng().integers(2**63))
        self._next_epoch = 0
        self.redealt: tuple[int, tuple[redeal.Piece, ...]] | None = None  # an epoch begun on another topology
        self.sampling, self._warned = selection.checked(sampling, config.resampled), False

    @property
    def plan_seed(self) -> int:
        """The seed of the shard assignment, shared by all ranks (``seed``, or 0 without one)."""
        return self.config.seed if self.config.seed is not None else 0

    @property
    def next_epoch(self) -> int:
        """The epoch the next pass (an iteration of this stream or of its loader) will be."""
        return self._next_epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch``; passes after it count on from there."""
        if isinstance(epoch, bool) or not isinstance(epoch, int | np.integer) or epoch < 0:
            raise ValueError(f"epoch must be an integer >= 0, got {epoch!r}")
        self._next_epoch = int(epoch)

    def next_pass(self) -> int:
        """Start a pass: its epoch (:attr:`next_epoch`), and the next pass's is one more."""
        epoch = self._next_epoch
        self._next_epoch = epoch + 1
        return epoch

    def plan(self, epoch: int, num_workers: int) -> EpochPlan:
        """The epoch's plan for this job's ranks with ``num_workers`` workers each (epoch mode)."""
        plan = plan_epoch(
            self.counts,
            world_size=self.world.world_size,
            num_workers=max(num_workers, 1),
            batch_size=self.config.batch_size,
            seed=self.plan_seed,
            epoch=epoch,
            drop_last=self.config.drop_last and not self.config.pad_last,
        )
        return pad_plan(plan) if self.config.pad_last else plan

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
        if not self.config.resampled and not self._warned and self.world.rank == 0:
            self._warned = log_dropped(self.plan(0, max(num_workers, 1)))

    def sample_stages(
        self,
        seed: tuple[int, ...],
        max_failures: int = 1,
        skip: int = 0,
        read: dict[str, Any] | None = None,
        lending: Lending = UNLENT,
    ) -> list[Any]:
        """The stages from shards to batches: read and shuffle (by ``seed`` and each shard's position, passing over
        ``skip`` samples first; by the index where the stream has a sampling plan, with ``read``'s extra arguments of
        :class:`~wsishard.streaming.indexed.ReadIndexed`), decode, batch (into buffers lent as ``lending`` says)."""
        cfg = self.config
        drop_last = cfg.drop_last or cfg.resampled
        shuffle_seed = (*seed, SHUFFLE_STREAM)
        reader: indexed.ReadIndexed | ReadShuffled | None
        reader = indexed.read_stage(self.sampling, self.opener, cfg, shuffle_seed, max_failures, skip, read)
        if reader is None:
            reader = ReadShuffled(
                self.opener, cfg.shuffle, shuffle_seed, cfg.on_error, max_failures, skip, cfg.context_scales
            )
        return [reader, self._batches(drop_last, lending)]

    def _batches(self, drop_last: bool, lending: Lending) -> DecodeIntoBatches | EncodedBatches:
        """The batching stage: decoded into uint8 batches, or (``lending.encoded``) batches of JPEG bytes."""
        cfg = self.config
        if lending.encoded:
            return EncodedBatches(cfg.batch_size, self.image_hw, drop_last=drop_last, on_error=cfg.on_error)
        return DecodeIntoBatches(
            cfg.batch_size,
            self.image_hw,
            drop_last=drop_last,
            on_error=cfg.on_error,
            lending=lending,
            context=context_shape(cfg),
        )

    def pipeline(self, world: World, epoch: int, done: int = 0, lending: Lending = UNLENT) -> wds.DataPipeline:
        """The webdataset pipeline that ``world``'s (rank, worker) runs in ``epoch`` (or for ever), after the
        ``done`` batches it had yielded (a resumed loader): whole shards before its position are skipped by their
        manifest counts, unread, and only the shard it stopped in is read again. ``lending``: how its batch buffers
        are lent (:class:`~wsishard.streaming.ring.Lending`)."""
        check_readers(self.counts, world.world_size, world.num_workers)
        seed = (self.base_seed, world.rank, world.worker, epoch)
        cfg = self.config
        read: dict[str, Any] | None = None  # the extra arguments of an indexed read (weighted draws)
        if cfg.resampled:
            order = epoch_order(
                self.counts, world_size=world.world_size, num_workers=world.num_workers, seed=self.plan_seed, epoch=0
            )
            mine = slice_refs(self.shards, reader_slices(order, self.counts, world))
            if not any(ref.kept for ref in mine):
                raise TopologyError(f"rank {world.rank} worker {world.worker} owns only empty shards")
            start, skip = resume_position(
                [r.kept for r in mine], done * cfg.batch_size, seed=self.base_seed, rank=world.rank, worker=world.worker
            )
            start, skip, read = selection.weighted_start(
                self.sampling, mine, done * cfg.batch_size, (self.base_seed, world.rank, world.worker), (start, skip)
            )
            source: tuple[Any, ...] = (ShardList(mine), Resample(self.base_seed, world.rank, world.worker, start))
            budget = None
        elif self.redealt is not None and self.redealt[0] == epoch:
            return self._redealt_pipeline(world, seed, lending)
        else:
            plan = self.plan(epoch, world.num_workers)
            mine = slice_refs(self.shards, plan.slices_of(world))
            start, skip = resume_position([r.kept for r in mine], done * cfg.batch_size)
            topup = cfg.on_error == "skip" and world.world_size > 1
            refill = _Refill(self, mine, (*seed, _TOPUP_STREAM), lending) if topup else None
            source, budget = (ShardList(mine, start),), Budget(max(plan.budget_of(world) - done, 0), refill)
            if cfg.pad_last:
                return indexed.padded_pipeline(self, world, seed, plan, mine, done, lending)
        logger.debug(
            "rank %d worker %d epoch %d: %d shards, from %d (+%d)",
            world.rank,
            world.worker,
            epoch,
            len(mine),
            start,
            skip,
        )
        stages = self.sample_stages(seed, max_failures=len(mine), skip=skip, read=read, lending=lending)
        return wds.DataPipeline(*source, *stages, budget)

    def _redealt_pipeline(self, world: World, seed: tuple[int, ...], lending: Lending) -> wds.DataPipeline:
        """The rest of an epoch begun on another topology: this reader's share of the old readers' remainders."""
        assert self.redealt is not None
        if self.sampling is not None:
            raise TopologyError("an epoch with select= resumes on the topology it began on only (same ranks, workers)")
        cfg, pieces = self.config, self.redealt[1]
        caps = redeal.budgets(
            pieces, world.world_size, world.num_workers, batch_size=cfg.batch_size, drop_last=cfg.drop_last
        )
        return wds.DataPipeline(
            redeal.PieceList(tuple(redeal.share(pieces, world))),
            redeal.ReadPieces(self.opener, cfg.shuffle, cfg.on_error, cfg.context_scales),
            self._batches(cfg.drop_last, lending),
            Budget(int(caps[world.rank, world.worker])),
        )

    def __iter__(self) -> Iterator[Batch]:
        """One pass (:meth:`next_pass`): every batch is a fresh buffer of its own."""
        return self.batches(self.next_pass())

    def batches(self, epoch: int, *, resume: Resume | None = None, lending: Lending = UNLENT) -> Iterator[Batch]:
        """The batches of ``epoch`` that this process reads: in a DataLoader worker, that worker's share, each batch
        tagged with its (logical) worker and a worker's :class:`~wsishard.errors.ShardError` handed over as the last
        item (:class:`WorkerShardError`); else the whole rank's.

        Args:
            epoch: the pass's epoch.
            resume: where each worker of a resumed loader stands in ``epoch``, and which worker the first plays.
            lending: how the batch buffers are lent (:class:`~wsishard.streaming.ring.Lending`).
        """
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        resumed = resume if resume is not None and resume.epoch == epoch else None
        logical = (info.id + (resumed.rotation if resumed else 0)) % workers if info is not None else 0
        world = self.world.with_worker(logical, workers)
        done = resumed.batches[logical] if resumed else 0
        batches = iter(self.pipeline(world, epoch, done, lending))
        return batches if info is None else _from_worker(batches, logical)  # type: ignore[return-value]


@dataclass(frozen=True)
class WorkerShardError:
    """A worker's :class:`~wsishard.errors.ShardError`, handed to the main process as data.

    DataLoader re-raises a worker's exception by calling its type with one message string, which a
    ``ShardError`` (two fields) does not take, so it would arrive as a ``RuntimeError``; as an item of the
    stream it arrives intact and :class:`~wsishard.streaming.loader.ShardLoader` raises it as the ``ShardError``
    it was.
    """

    shard: str
    reason: str


def _from_worker(batches: Iterator[Batch], worker: int) -> Iterator[Batch | WorkerShardError]:
    """In a DataLoader worker: each batch tagged with the (logical) worker that made it (the loader counts them
    for its state), then, if a ShardError ends the batches, that error as the stream's last item."""
    try:
        for batch in batches:
            batch["worker"] = worker  # type: ignore[typeddict-unknown-key]  # taken off again by the loader
            yield batch
    except ShardError as exc:
        yield WorkerShardError(exc.shard, exc.reason)


@dataclass(frozen=True)
class Resume:
    """Where a resumed loader picks an epoch up: batches each (logical) worker had yielded, and which worker the
    DataLoader's first worker plays (``rotation``), so the round robin goes on where it stopped."""

    epoch: int
    batches: tuple[int, ...]
    rotation: int = 0
    last: int | None = None  # the logical worker of the last batch yielded before
