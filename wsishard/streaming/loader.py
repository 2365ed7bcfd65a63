"""The DataLoader over a :class:`~wsishard.streaming.dataset.ShardStream`: epochs counted, worker errors handed
back as :class:`~wsishard.errors.ShardError`, and the position saved and restored (:meth:`ShardLoader.state_dict`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import islice
from typing import Any

import torch
import webdataset as wds

from wsishard.errors import ShardError
from wsishard.streaming import redeal
from wsishard.streaming.dataset import Resume, ShardStream, WorkerShardError
from wsishard.streaming.decode import Batch, decode_mode
from wsishard.streaming.pinning import HostPins, cuda_runtime
from wsishard.streaming.ring import Lending, Returns


def _raise_handed_over(items: Iterator[Batch | WorkerShardError]) -> Iterator[Batch]:
    """In the main process: the batches; a worker's handed-over error is raised as its ShardError."""
    for item in items:
        if isinstance(item, WorkerShardError):
            raise ShardError(item.shard, item.reason)
        yield item


def as_is(batch: Batch) -> Batch:
    """The workers' batch as it is: already tensors (``default_convert`` would look into each of its meta dicts,
    about 2 ms a batch of 256 in the worker)."""
    return batch


_STATE_FORMAT, _STATE_VERSION = "wsishard-loader-state", 1


class ShardLoader(wds.WebLoader):
    """A ``wds.WebLoader`` (a DataLoader with ``batch_size=None``) that counts epochs for its dataset.

    Each iteration after the first advances the dataset's epoch (unless :meth:`ShardStream.set_epoch`
    was called), so non-persistent workers, which get a fresh copy of the dataset, still see a new
    shard order every epoch. With ``persistent_workers=True`` the workers count epochs themselves (the
    same numbers), but a later ``set_epoch`` no longer reaches them. Errors from workers come back as
    :class:`~wsishard.errors.ShardError` (DataLoader itself would turn them into ``RuntimeError``).

    Each worker's batch images are buffers of its ring (:mod:`wsishard.streaming.ring`): at every step the loader
    hands back the buffers nothing in this process refers to any more, and the worker fills them again. A batch
    the loop keeps (or a view, or a numpy array of its image) is never refilled; hand a copy, not the tensor, to
    another process. With ``pin_memory`` on CUDA those buffers are page-locked in place (``cudaHostRegister``) and
    a buffer goes back only once the work queued on the current CUDA stream when the loop let it go has finished, so
    ``batch["image"].to("cuda", non_blocking=True)`` needs no copy and no care (on another stream: synchronise).

    :meth:`state_dict` says where the batches the training loop has taken stand (plain JSON data, no pickle);
    :meth:`load_state_dict` on a new loader of the same stream and topology makes its batches from there on the
    same as an uninterrupted run's (without skipped shards: ``on_error="skip"`` can shift them).
    """

    def __init__(self, dataset: ShardStream, **kwargs: Any) -> None:
        kwargs.setdefault("collate_fn", as_is)  # DataLoader's default walks every meta dict of every batch
        lend = int(kwargs.get("num_workers", 0)) > 0 and kwargs["collate_fn"] is as_is
        # pinned on CUDA: the workers' buffers page-locked in place (pinning.py) instead of DataLoader's copy of each
        self._cuda = cuda_runtime() if lend and kwargs.get("pin_memory", False) else None
        if self._cuda is not None:
            kwargs["pin_memory"] = False
        super().__init__(dataset, batch_size=None, **kwargs)
        self.dataset = dataset
        self.num_workers = int(kwargs.get("num_workers", 0))
        self.persistent = bool(kwargs.get("persistent_workers", False))
        self._iterations = 0
        self._epoch = dataset._epoch_next
        self._taken = [0] * max(self.num_workers, 1)  # batches the training loop took from each (logical) worker
        self._last: int | None = None
        # workers may name their buffers instead of sending them (nothing between them and _count needs the tensor),
        # and make the buffers they will keep lent before the first batch: the prefetched ones and the one filled
        self._lending = Lending(
            by_reference=lend and not kwargs.get("pin_memory", False),
            prefill=int(kwargs.get("prefetch_factor") or 2) + 1 if self.num_workers > 0 else 0,
        )

    def __iter__(self) -> Iterator[Batch]:
        if self.num_workers > 0:
            self.dataset._loader_pass(first=self._iterations == 0)
        self._iterations += 1
        resumed = self.dataset.resumed
        self._epoch = self.dataset._epoch_next + (self.dataset._local_passes if self.num_workers == 0 else 0)
        at_resume = resumed is not None and resumed.epoch == self._epoch
        self._taken = list(resumed.batches) if at_resume else [0] * max(self.num_workers, 1)  # type: ignore[union-attr]
        self._last = resumed.last if at_resume else None  # type: ignore[union-attr]
        # pinned in place (pinning.py) unless .repeat() makes later passes: their buffers would stay page-locked
        # pass after pass, so DataLoader's pin thread pins those, as before
        in_place = self._cuda is not None and self.repetitions == 1
        if self._cuda is not None:
            self.pipeline[0].pin_memory = not in_place
        lending = self._lending if in_place or self._cuda is None else replace(self._lending, by_reference=False)
        self.dataset.lending = lending  # for the workers DataLoader starts (or forks) in its iterator's making
        try:  # iterator1() makes that iterator at once (webdataset's __iter__ would only once a batch is asked for)
            first = self.iterator1()
        finally:
            self.dataset.lending = Lending()  # they have their copy: the dataset is as it was again
        batches = self._passes(first)
        if self.repetitions != 1 and self.nsamples > 0:  # as webdataset's DataPipeline.__iter__
            batches = islice(batches, self.nsamples)
        return self._count(_raise_handed_over(batches), HostPins(self._cuda) if in_place and self._cuda else None)

    def _passes(self, first: Iterator[Any]) -> Iterator[Any]:
        """webdataset's ``DataPipeline.iterator``, its first pass made already: ``.repeat()`` passes, the later
        ones made as they come (non-persistent workers of a later pass then send batches by tensor)."""
        for k in range(self.repetitions):
            count = 0
            for batch in first if k == 0 else self.iterator1():
                yield batch
                count += 1
            if count == 0:  # an empty pass: the dataset is empty, do not go on
                break

    def _count(self, batches: Iterator[Batch], pins: HostPins[Any] | None) -> Iterator[Batch]:
        returns = Returns(pins)  # the workers' buffers lent with the batches, handed back once unused
        try:
            for batch in batches:
                worker = int(batch.pop("worker", 0))  # type: ignore[typeddict-item]
                ticket = batch.pop("buffer", None)  # type: ignore[typeddict-item]
                image = None if ticket is None else returns.add(ticket)
                if image is not None:  # a batch by reference: its image in the buffer, its labels (b,) as sent
                    batch["image"], batch["label"] = image, torch.from_numpy(batch["label"])
                self._taken[worker] += 1
                self._last = worker
                yield batch
                del batch, ticket, image
                returns.sweep()  # the loop has asked for the next batch: what it let go of goes back
        finally:
            returns.close()

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands: plain JSON-able data to save with a checkpoint (never pickled)."""
        ds, cfg = self.dataset, self.dataset.config
        return {"format": _STATE_FORMAT, "version": _STATE_VERSION, "epoch": self._epoch, "batches": list(self._taken),
                "last_worker": self._last, "resampled": cfg.resampled, "seed": ds.base_seed,
                "batch_size": cfg.batch_size, "rank": ds.world.rank, "world_size": ds.world.world_size,
                "num_workers": self.num_workers, "samples": [len(ds.shards), int(ds.counts.sum())],
                "shuffle": cfg.shuffle,
                "redealt": ds.redealt is not None and ds.redealt[0] == self._epoch}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Go on from ``state`` (from :meth:`state_dict` of a loader over the same build, options and topology).

        In epoch mode the states of every rank of the old job (a list) may be given instead: the epoch then
        finishes on this loader's topology (another world size or number of workers), every sample the old job had
        not yielded dealt to the new readers, none twice.

        Raises:
            ValueError: not a loader state, or one of another stream, seed, batch size or topology.
        """
        states = state if isinstance(state, list) else [state]
        mine = self.state_dict()
        if not states or any(s.get("format") != _STATE_FORMAT or s.get("version") != _STATE_VERSION for s in states):
            raise ValueError("not a wsishard loader state (ShardLoader.state_dict())")
        if self.persistent:
            raise ValueError("resuming needs persistent_workers=False (workers that start anew each epoch)")
        if any(s.get("redealt") for s in states):
            raise ValueError(
                "the state was saved while an epoch begun on another topology was finishing: resume "
                "from a checkpoint taken at an epoch's end, or from the states of the older job"
            )
        if len(states) > 1 or (states[0]["world_size"], states[0]["num_workers"]) != (mine["world_size"],
                                                                                      mine["num_workers"]):  # fmt: skip
            self._redeal(states, mine)
            return
        fixed = ("resampled", "batch_size", "rank", "world_size", "num_workers", "samples", "shuffle")
        other = [f"{k} {states[0].get(k)!r} (now {mine[k]!r})" for k in fixed if states[0].get(k) != mine[k]]
        if other or (not mine["resampled"] and states[0].get("seed") != mine["seed"]):
            raise ValueError(f"the state is of another stream or topology: {', '.join(other) or 'seed'}")
        self.dataset.base_seed = int(states[0]["seed"])  # resampled without a seed drew one: go on with it
        self.dataset.resume(_resume(self.dataset, states[0], max(self.num_workers, 1)))

    def _redeal(self, states: list[dict[str, Any]], mine: dict[str, Any]) -> None:
        first, ds = states[0], self.dataset
        fixed = ("resampled", "batch_size", "samples", "shuffle", "seed", "epoch", "world_size", "num_workers")
        other = sorted({k for s in states for k in fixed if s.get(k) != first.get(k)})
        other += [k for k in ("resampled", "batch_size", "samples", "shuffle", "seed") if first.get(k) != mine[k]]
        if mine["resampled"] or other or sorted(int(s["rank"]) for s in states) != list(range(first["world_size"])):
            raise ValueError(
                "resuming on another topology needs epoch mode and the states of every rank of the old "
                f"job, of the same stream{': ' + ', '.join(other) if other else ''}"
            )
        pieces = redeal.remainders(ds.counts, ds.shards, states, batch_size=ds.config.batch_size,
                                   plan_seed=ds.plan_seed, drop_last=ds.config.drop_last)  # fmt: skip
        epoch = int(first["epoch"])
        ds.set_epoch(epoch if pieces else epoch + 1)  # nothing left: the next epoch, from its start
        ds.redealt = (epoch, tuple(pieces)) if pieces else None


def _resume(dataset: ShardStream, state: dict[str, Any], workers: int) -> Resume:
    """The :class:`Resume` of ``state``: the next batch is the uninterrupted run's next, from the worker after the
    last one taken (in epoch mode, after the last with batches left), which the DataLoader's first worker plays."""
    epoch, taken, last = int(state["epoch"]), tuple(int(b) for b in state["batches"]), state["last_worker"]
    left = [1] * workers
    if not dataset.config.resampled:
        budgets = dataset.plan(epoch, workers).budgets[dataset.world.rank]
        left = [int(b) - t for b, t in zip(budgets.tolist(), taken, strict=True)]
        if not any(n > 0 for n in left):  # the epoch was over: the next one from its start
            return Resume(epoch + 1, (0,) * workers)
    first = 0 if last is None else int(last) + 1
    rotation = next(w % workers for w in range(first, first + workers) if left[w % workers] > 0)
    return Resume(epoch, taken, rotation, last)


def loader(dataset: ShardStream, *, num_workers: int = 4, pin_memory: bool | None = None, decode: str = "worker",
           **kwargs: Any) -> ShardLoader:  # fmt: skip
    """A :class:`ShardLoader` over ``dataset``: ``batch_size=None`` (the workers batch), pinned on CUDA.

    Args:
        dataset: from :func:`stream`.
        num_workers: DataLoader worker processes per rank (use the same on every rank).
        pin_memory: default: True when CUDA is available. With workers, the batches' images are then the workers'
            buffers page-locked in place (:mod:`wsishard.streaming.pinning`), not DataLoader's copy of each batch.
        decode: ``"worker"``: JPEGs decoded in the workers; ``"device"``: batches of JPEG bytes, decoded on the GPU
            by :class:`~wsishard.streaming.collate.GpuCollate` (needs CUDA and torchvision; refused otherwise).
        **kwargs: passed to ``torch.utils.data.DataLoader`` (``prefetch_factor``, ``persistent_workers``...).

    Raises:
        TopologyError: too few shards for ranks x ``num_workers`` (raised here, not in a worker).
        ValueError: ``batch_size`` among ``kwargs`` (batching happens in the workers), or ``decode="device"``
            without CUDA or torchvision.
    """
    dataset.decode = decode_mode(decode)
    if "batch_size" in kwargs:
        raise ValueError(f"batch_size={kwargs['batch_size']!r}: batch in stream(), the loader gets None")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    dataset.check_topology(num_workers)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    return ShardLoader(dataset, num_workers=num_workers, pin_memory=pin, **kwargs)
