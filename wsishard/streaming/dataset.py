"""The training-time pipeline, composed from webdataset parts and run inside the DataLoader workers.

    the reader's pieces (:mod:`wsishard.streaming.planner`: every mode is a plan)
      -> ReadPieces: tar -> samples (counted against the manifest) -> shuffle buffer (bytes) -> the piece's share
      -> (pad_last: repeats up to the budget) -> lean decode -> uint8 batches (b, h, w, 3) -> the batch budget

Which reader reads what comes from the planner, given a :class:`~wsishard.streaming.world.World` detected once in
the main process: webdataset's splitters re-detect the rank in each worker from the environment, which in a worker
started by ``spawn`` without ``RANK`` silently gives every rank all shards.

Error behaviour (``on_error``): ``"raise"`` (default): a shard that cannot be opened, is truncated, corrupt or short
of its manifest's count, or holds a sample with a missing member, an undecodable image, an image of another size
than the manifest's (checked from its header: a decompression bomb costs nothing) or a member name that is not a key
raises :class:`~wsishard.errors.ShardError` naming the shard (and the sample); a short shard shows only at its end,
after its complete samples may have been batched. ``"skip"``: the rest of the shard (or the one sample) is skipped,
counted and logged, and a resume stays exact (:attr:`ReadPieces.position`). In epoch mode under DDP a worker left
short tops up by re-reading its own shards, so every rank yields its planned batches.

The stages live in :mod:`wsishard.streaming.stages` and :mod:`wsishard.streaming.decode`. Members other than the
image, ``.json`` and ``.cls`` are never read: ``.pyd``/``.pth``/``.pickle`` members are ignored and nothing is
ever unpickled. A worker's :class:`~wsishard.errors.ShardError` reaches the caller as a ``ShardError`` with its
fields: the worker hands it over as data (:class:`WorkerShardError`), not as an exception DataLoader would
re-raise as ``RuntimeError`` text.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
import webdataset as wds

from wsishard.errors import ShardError, TopologyError
from wsishard.storage.opener import StreamOpener
from wsishard.streaming import planner, selection
from wsishard.streaming.bags import BagBatches
from wsishard.streaming.config import StreamConfig
from wsishard.streaming.context import context_shape
from wsishard.streaming.decode import Batch, DecodeIntoBatches, EncodedBatches
from wsishard.streaming.planner import Plan, Segment, Spec
from wsishard.streaming.reader import Budget, MarkValid, PadSamples, ReadPieces, Validity
from wsishard.streaming.ring import UNLENT, Handed, Lending
from wsishard.streaming.stages import Opener, ShardRef
from wsishard.streaming.work import Passes, Pieces, Work, epoch_work
from wsishard.streaming.world import World, detect_world

logger = logging.getLogger(__name__)

_TOPUP_STREAM = 2  # a seed word keeping the top-up passes' random stream apart from the shuffles'


@dataclass
class _Refill:
    """Top-up batches for :class:`~wsishard.streaming.reader.Budget`: one more reshuffled pass over a reader's whole
    plan (``pieces``, of ``start`` items), after the ``skip`` items of top-up passes a resumed reader had passed."""

    dataset: ShardStream
    pieces: tuple[planner.Piece, ...]
    lending: Lending
    epoch: int = 0
    start: int = 0
    skip: int = 0
    reader: ReadPieces | None = None  # the current pass's reader stage (its position: the reader's)

    def __call__(self, pass_index: int) -> Iterator[Batch]:
        total = sum(p.count for p in self.pieces)
        done = self.skip // total if total else 0  # whole top-up passes a resumed reader had passed
        at, pass_index = (self.skip - done * total if pass_index == 1 else 0), pass_index + done
        seed = (*self.pieces[0].seed, _TOPUP_STREAM, pass_index) if self.pieces else ()
        order = np.random.default_rng(seed).permutation(len(self.pieces)).tolist()
        pieces = tuple(replace(self.pieces[i], seed=(*self.pieces[i].seed, _TOPUP_STREAM, pass_index)) for i in order)
        self.reader = self.dataset.reader_stage(len(pieces), self.start + (pass_index - 1) * total + at)
        pieces = tuple(planner.cut(pieces, at, total)) if at else pieces
        return iter(wds.DataPipeline(Pieces(pieces), self.reader, self.dataset.batch_stage(self.lending, self.epoch)))


@dataclass(frozen=True)
class _Place:
    """Where a reader stands in its plan: its reader stage's position, or its current top-up pass's once one began."""

    main: ReadPieces
    refill: _Refill | None

    @property
    def position(self) -> int:
        topping = self.refill.reader if self.refill is not None else None
        return topping.position if topping is not None else self.main.position


# ---- the dataset ---------------------------------------------------------------------------------------


class ShardStream(torch.utils.data.IterableDataset[Batch]):
    """An iterable dataset of uint8 :class:`Batch` es over the shards of one or more build outputs.

    Resampled mode never ends: iterate it for a number of steps. Epoch mode yields one exact pass, the
    same number of batches (:meth:`batches_per_rank`) on every rank. Each new iteration is a new epoch
    (counted per process, and by :func:`loader` across worker restarts); :meth:`set_epoch` sets it
    explicitly. Ranks may use different ``num_workers`` when :func:`~wsishard.streaming.loader.loader` runs under
    torch.distributed (it gathers them); otherwise batch counts assume every rank uses the same.

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
        self._base_seed = config.seed if config.seed is not None else int(np.random.default_rng().integers(2**63))
        self._next_epoch = 0
        self.history: tuple[int, tuple[Segment, ...]] | None = None  # an epoch's stretches on earlier topologies
        self.workers_by_rank: planner.Topology | None = None  # every rank's workers, gathered by loader()
        self.sampling, self._warned = sampling, False
        totals = None
        if sampling is not None and sampling.weighted:
            totals = np.array([sampling.totals[sampling.urls[s.url]] for s in self.shards], dtype=np.float64)
        self.spec = Spec(
            counts=self.counts,
            batch_size=config.batch_size,
            seed=self.plan_seed,
            stream_seed=self._base_seed,
            totals=totals,
            epoch_size=config.epoch_size,
            drop_last=config.drop_last and not config.pad_last,
            pad_last=config.pad_last,
        )

    @property
    def base_seed(self) -> int:
        """The seed of this rank's resampled passes: ``seed``, or one drawn once in the main process."""
        return self._base_seed

    @base_seed.setter
    def base_seed(self, value: int) -> None:  # a resumed loader goes on with the seed its state drew
        self._base_seed = int(value)
        self.spec = replace(self.spec, stream_seed=int(value))

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

    def topology(self, num_workers: int, rank: int | None = None) -> planner.Topology:
        """This job's readers: the workers of each rank as :func:`~wsishard.streaming.loader.loader` gathered them
        under torch.distributed (ranks may differ), where they include ``num_workers`` (at least 1) on ``rank``
        (default: this process's); else ``num_workers`` on each rank."""
        gathered, rank = self.workers_by_rank, self.world.rank if rank is None else rank
        if gathered is not None and len(gathered) == self.world.world_size and gathered[rank] == max(num_workers, 1):
            return gathered
        return (max(num_workers, 1),) * self.world.world_size

    def segments(self, epoch: int) -> tuple[Segment, ...]:
        """The stretches of ``epoch`` run on earlier topologies (a resumed job), or none."""
        return self.history[1] if self.history is not None and self.history[0] == epoch else ()

    def plan(self, epoch: int, num_workers: int) -> Plan:
        """The epoch's plan for this job's ranks with ``num_workers`` workers each (epoch mode)."""
        return planner.plan_epoch(self.spec, self.topology(num_workers), epoch, self.segments(epoch))

    def batches_per_rank(self, num_workers: int, epoch: int = 0) -> int:
        """Batches each rank yields in ``epoch`` (epoch mode; varies slightly between epochs)."""
        return self.plan(epoch, num_workers).batches_per_rank

    def check_topology(self, num_workers: int) -> None:
        """Raise now, in the main process, what the workers would otherwise hit.

        Raises:
            TopologyError: fewer samples than ranks x workers, or an epoch without a single batch.
        """
        if self.config.resampled:
            planner.check_readers(int(self.counts.sum()), self.topology(num_workers), len(self.counts))
            return
        plan = self.plan(self.next_epoch, num_workers)
        if plan.batches_per_rank == 0:
            raise TopologyError(
                f"{int(self.counts.sum())} samples give no batch of {self.config.batch_size} per rank "
                f"with {self.world.world_size} rank(s) x {max(num_workers, 1)} worker(s)"
            )
        if not self._warned and self.world.rank == 0:
            self._warned = _log_dropped(plan, self.spec)

    def reader_stage(self, pieces: int, position: int = 0) -> ReadPieces:
        """The reading stage of a reader with ``pieces`` pieces (that many failing in a row raise), starting at
        item ``position`` of its plan."""
        cfg = self.config
        return ReadPieces(
            self.shards,
            self.opener,
            cfg.shuffle,
            self.sampling,
            cfg.on_error,
            max(pieces, 1),
            cfg.context_scales,
            cfg.bags,
            position,
        )

    def batch_stage(self, lending: Lending, epoch: int = 0) -> DecodeIntoBatches | EncodedBatches | BagBatches:
        """The batching stage: decoded into uint8 batches, or (``lending.encoded``) batches of JPEG bytes, or for an
        embeddings output padded bags (their subsets seeded by the seed and ``epoch``)."""
        cfg = self.config
        drop_last = (cfg.drop_last or cfg.resampled) and not cfg.pad_last
        if cfg.bags:
            seed = (self.base_seed, epoch)
            return BagBatches(cfg.batch_size, drop_last, cfg.on_error, cfg.max_patches, seed)
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

    def work(self, world: World, epoch: int, done: int = 0, items: int | None = None) -> Work:
        """What ``world``'s (rank, worker) reads in ``epoch`` (or for ever) after the ``done`` batches it had yielded,
        having passed ``items`` items of its plan (None: ``done`` full batches' worth, nothing skipped)
        (:mod:`~wsishard.streaming.planner`)."""
        topology = self.topology(world.num_workers, world.rank) if world.world_size == self.world.world_size else ()
        topology = topology or (world.num_workers,) * world.world_size
        if self.config.resampled:
            sizes = self._true_sizes if self.sampling is not None and self.sampling.lazy else None
            items = done * self.config.batch_size if items is None else items
            share = tuple(planner.reader_share(self.spec, topology, world.rank, world.worker))
            return Work(
                Passes(self.spec, topology, world.rank, world.worker, items, sizes), None, None, 0, items, share
            )
        plan = planner.plan_epoch(self.spec, topology, epoch, self.segments(epoch))
        return epoch_work(plan, world.rank, world.worker, done, items)

    def pipeline(
        self, world: World, epoch: int, done: int = 0, lending: Lending = UNLENT, items: int | None = None
    ) -> wds.DataPipeline:
        """The webdataset pipeline that ``world``'s (rank, worker) runs in ``epoch`` (or for ever), after the
        ``done`` batches it had yielded and the ``items`` of its plan it had passed (a resumed loader): pieces before
        its position are skipped unread, and only the piece it stopped in is read again. ``lending``: how its batch
        buffers are lent (:class:`~wsishard.streaming.ring.Lending`)."""
        return wds.DataPipeline(*self._stages(world, epoch, done, lending, items)[1])

    def _stages(
        self, world: World, epoch: int, done: int, lending: Lending, items: int | None
    ) -> tuple[_Place, list[object]]:
        """:meth:`pipeline`'s reader stage, and all its stages in order."""
        cfg, size = self.config, self.config.batch_size
        work = self.work(world, epoch, done, items)
        counter = Validity(work.done)
        topup = work.budget is not None and cfg.on_error == "skip" and world.world_size > 1
        refill = _Refill(self, work.plan, lending, epoch, work.start + (work.real or 0), work.topped) if topup else None
        total = (work.budget or 0) * size if cfg.pad_last else 0
        logger.debug("rank %d worker %d epoch %d: %d pieces", world.rank, world.worker, epoch, len(work.plan))
        main = self.reader_stage(len(work.plan), work.start)  # as many failing in a row raise (skip mode)
        return _Place(main, refill), [
            work.source,
            main,
            PadSamples(work.real, total, size, counter),
            self.batch_stage(lending, epoch),
            *([MarkValid(counter, done * size)] if cfg.pad_last else []),
            Budget(work.budget, refill),
        ]

    def _true_sizes(self, shards: Sequence[int]) -> list[int]:
        """The samples ``select`` keeps in each of ``shards`` (positions in :attr:`shards`): a lazy plan's counts."""
        assert self.sampling is not None
        return selection.selected_counts(self.sampling, self.opener, [self.shards[s].url for s in shards])

    def __iter__(self) -> Iterator[Batch]:
        """One pass (:meth:`next_pass`): every batch is a fresh buffer of its own."""
        return self.batches(self.next_pass())

    def batches(
        self, epoch: int, *, resume: Resume | None = None, lending: Lending = UNLENT, handover: bool = False
    ) -> Iterator[Batch]:
        """The batches of ``epoch`` that this process reads: in a DataLoader worker, that worker's share; else the
        whole rank's.

        Args:
            epoch: the pass's epoch.
            resume: where each worker of a resumed loader stands in ``epoch``, and which worker the first plays.
            lending: how the batch buffers are lent (:class:`~wsishard.streaming.ring.Lending`).
            handover: for a :class:`~wsishard.streaming.loader.ShardLoader` (:func:`_handed`); a DataLoader of the
                user's own gets plain batches.
        """
        info = torch.utils.data.get_worker_info()
        workers = info.num_workers if info is not None else 1
        resumed = resume if resume is not None and resume.epoch == epoch else None
        logical = (info.id + (resumed.rotation if resumed else 0)) % workers if info is not None else 0
        world = self.world.with_worker(logical, workers)
        done = resumed.batches[logical] if resumed else 0
        items = resumed.items[logical] if resumed and resumed.items else None
        reader, stages = self._stages(world, epoch, done, lending, items)
        batches = iter(wds.DataPipeline(*stages))
        return _handed(batches, logical, reader, info is not None) if handover else batches  # type: ignore[return-value]


@dataclass(frozen=True)
class WorkerShardError:
    """A worker's :class:`~wsishard.errors.ShardError`, handed to the main process as data (DataLoader would
    re-raise the exception as a ``RuntimeError`` of its text), which ``ShardLoader`` raises as the ShardError it was.
    """

    shard: str
    reason: str


def _handed(
    batches: Iterator[Batch], worker: int, reader: _Place, in_worker: bool
) -> Iterator[Batch | WorkerShardError]:
    """For :class:`~wsishard.streaming.loader.ShardLoader`: each batch tagged with the (logical) worker that made it
    and the reader's place in its plan after it (the loader keeps both for its state); in a DataLoader worker, a
    ShardError that ends the batches handed over as the stream's last item."""
    try:
        for batch in batches:
            handed = batch if isinstance(batch, Handed) else Handed(batch)
            handed.worker, handed.position = worker, reader.position
            yield handed  # type: ignore[misc]
    except ShardError as exc:
        if not in_worker:
            raise
        yield WorkerShardError(exc.shard, exc.reason)


@dataclass(frozen=True)
class Resume:
    """Where a resumed loader picks an epoch up: each (logical) worker's batches, and which worker the first plays."""

    epoch: int
    batches: tuple[int, ...]
    rotation: int = 0
    last: int | None = None  # the logical worker of the last batch yielded before
    items: tuple[int | None, ...] | None = None  # items of its plan each worker had passed (None: its batches')


def _log_dropped(plan: Plan, spec: Spec) -> bool:
    """Log (a warning) what an epoch of ``plan`` drops, if anything; True."""
    total, kept = (sum(getattr(r, k) for row in plan.readers for r in row) for k in ("items", "real"))
    if kept < total:
        last = ", and each worker its last incomplete batch (drop_last)" if spec.drop_last else ""
        logger.warning(
            f"epoch mode reads {kept} of {total} samples each epoch ({total - kept} dropped, "
            f"{100 * (total - kept) / total:.1f}%): every rank yields the same number of batches "
            f"({plan.batches_per_rank} of {plan.batch_size}) with {len(plan.topology)} rank(s) x "
            f"{max(plan.topology)} worker(s){last}; stream(..., pad_last=True) reads every sample exactly once, "
            "padding with repeats marked batch['valid'] == False"
        )
    return True
