"""The loader over a :class:`~wsishard.streaming.dataset.ShardStream`: a ``torch.utils.data.DataLoader`` that
wsishard configures, with epochs counted, worker errors handed back as :class:`~wsishard.errors.ShardError`, batch
buffers reused under an explicit ownership rule, and the position saved and restored
(:meth:`ShardLoader.state_dict`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from wsishard.errors import ShardError
from wsishard.streaming.dataset import Resume, ShardStream, WorkerShardError
from wsishard.streaming.decode import Batch, decode_mode
from wsishard.streaming.pinning import HostPins, cuda_runtime
from wsishard.streaming.planner import Segment
from wsishard.streaming.ring import Lending, Lent, Returns, Tagged
from wsishard.streaming.state import STATE_FORMAT, STATE_VERSION, a_type, check_state, history_entry, segments
from wsishard.streaming.world import rank_share

__all__ = ["ShardLoader", "as_is", "loader"]


def _raise_handed_over(items: Iterator[Batch | WorkerShardError]) -> Iterator[Batch]:
    """In the main process: the batches; a worker's handed-over error is raised as its ShardError."""
    for item in items:
        if isinstance(item, WorkerShardError):
            raise ShardError(item.shard, item.reason)
        yield item


_gc_at_fork: bool | None = None  # the parent's collector state while its workers fork; None: settled


def _start(dl: DataLoader[Batch]) -> Iterator[Batch]:
    """``iter(dl)``, its workers forked with the garbage collector off; each worker freezes what it inherited
    (:func:`_settle_worker`) before collecting anything.

    A forked worker that collects the parent's cyclic garbage runs its destructors there, and a CUDA tensor freed in a
    forked child aborts it ("CUDA error: initialization error"): a worker must never collect what existed before it
    started. The parent's collector is on again (if it was) as soon as the workers are started.
    """
    global _gc_at_fork
    _gc_at_fork = gc.isenabled()
    gc.disable()
    try:
        return iter(dl)
    finally:
        if _gc_at_fork:
            gc.enable()
        _gc_at_fork = None


class _WorkerInit:
    """DataLoader's ``worker_init_fn``: the worker settled (:func:`_settle_worker`), then the user's own, if any."""

    def __init__(self, user: Callable[[int], Any] | None) -> None:
        self.user = user

    def __call__(self, worker_id: int) -> None:
        _settle_worker()
        if self.user is not None:
            self.user(worker_id)


def _settle_worker() -> None:
    """In a worker forked by :func:`_start`: what it inherited is frozen out of its collector, which is on again."""
    global _gc_at_fork
    if _gc_at_fork is None:  # the main process, a spawned worker, or settled already
        return
    gc.freeze()
    if _gc_at_fork:
        gc.enable()
    _gc_at_fork = None


def as_is(batch: Batch) -> Batch:
    """The workers' batch as it is: already tensors (``default_convert`` would look into each of its meta dicts)."""
    return batch


class _UserCollate:
    """A ``collate_fn`` of the user's, run on each batch as DataLoader does, its result :class:`Tagged` with the
    batch's worker and position (which a new dict made by the user's function would lose), and a worker's handed-over
    error passed on untouched."""

    def __init__(self, user: Callable[[Any], Any]) -> None:
        self.user = user

    def __call__(self, item: Any) -> Any:
        if isinstance(item, WorkerShardError):
            return item
        worker, position = getattr(item, "worker", 0), getattr(item, "position", None)
        return Tagged(self.user(item), worker, position)


class _Pass(IterableDataset[Batch]):
    """What the DataLoader iterates: one pass of ``stream`` at ``epoch`` (persistent workers count their later
    passes themselves), resumed where ``resume`` says, its buffers lent as ``lending`` says."""

    def __init__(self, stream: ShardStream, epoch: int, resume: Resume | None, lending: Lending) -> None:
        super().__init__()
        self.stream, self.epoch, self.resume, self.lending = stream, epoch, resume, lending
        self._passes = 0

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.epoch + self._passes
        self._passes += 1
        return self.stream.batches(epoch, resume=self.resume, lending=self.lending, handover=True)


class ShardLoader:
    """Batches of a :class:`~wsishard.streaming.dataset.ShardStream` through a ``torch.utils.data.DataLoader``
    (``batch_size=None``: the workers batch), one pass per iteration.

    Each iteration is a pass of the stream's next epoch (:meth:`ShardStream.next_pass`: one more than the last, or
    what :meth:`ShardStream.set_epoch` set), so non-persistent workers, which get a fresh copy of the dataset, see a
    new shard order every epoch. With ``persistent_workers=True`` the workers count epochs themselves (the same
    numbers), but a later ``set_epoch`` no longer reaches them. Errors from workers come back as
    :class:`~wsishard.errors.ShardError` (a DataLoader would turn them into ``RuntimeError``).

    **Buffer ownership.** With ``reuse_buffers=True`` (the default) and no ``collate_fn``, the batches' images are
    buffers the readers fill again: *a batch's images are valid until the loop takes the next batch.* A loop that
    keeps batches longer (``list(loader)``, a queue to another thread) copies the image (``.clone()``) or builds the
    loader with ``reuse_buffers=False``, which gives every batch memory of its own (slower: fresh pages per batch).
    With ``pin_memory`` on CUDA the buffers are page-locked in place (``cudaHostRegister``), and a buffer goes back
    to its worker only once the work queued on the current CUDA stream when the loop asked for the next batch has
    finished, so ``batch["image"].to("cuda", non_blocking=True)`` needs no copy and no care (on another stream:
    synchronise).

    :meth:`state_dict` says where the batches the training loop has taken stand (plain JSON data, no pickle);
    :meth:`load_state_dict` on a new loader of the same stream and topology makes its batches from there on the
    same as an uninterrupted run's, also after ``on_error="skip"`` skipped a shard or sample (each worker's place in
    its plan is saved with its batch count), and through a ``collate_fn`` of the user's (its result carries the
    batch's worker to the loader).

    Args:
        dataset: from :func:`~wsishard.streaming.sources.stream`.
        num_workers: DataLoader worker processes (ranks may differ when :func:`loader` made it under
            torch.distributed: it gathers them).
        pin_memory: page-locked batches (in place on CUDA, else by DataLoader's copy).
        reuse_buffers: the ownership rule above (True), or memory of its own for every batch (False).
        decode: ``"worker"`` (pixels), or ``"device"``: batches of JPEG bytes that ``GpuCollate`` decodes on the GPU
            (main patches only: refused for a stream with context).
        **kwargs: passed to ``torch.utils.data.DataLoader`` (``prefetch_factor``, ``persistent_workers``,
            ``collate_fn``, ``multiprocessing_context``, ``timeout``...).
    """

    def __init__(
        self,
        dataset: ShardStream,
        *,
        num_workers: int = 0,
        pin_memory: bool = False,
        reuse_buffers: bool = True,
        decode: str = "worker",
        **kwargs: Any,
    ) -> None:
        if "batch_size" in kwargs:
            raise ValueError(f"batch_size={kwargs['batch_size']!r}: batch in stream(), the loader gets None")
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
        self.dataset = dataset
        self.num_workers = num_workers
        self.persistent = bool(kwargs.get("persistent_workers", False))
        collate_fn = kwargs.pop("collate_fn", None)
        if decode == "device" and dataset.config.context_scales:
            raise ValueError(
                "decode='device' decodes the main patches only, and this build has context: use "
                "decode='worker', or stream(..., context=False)"
            )
        encoded = decode_mode(decode) == "device"  # batches of JPEG bytes: no pixel buffer to lend
        own = (collate_fn is None or collate_fn is as_is) and not encoded  # a user's collate_fn: nothing is reused
        lend = num_workers > 0 and own and reuse_buffers
        self._cuda = cuda_runtime() if lend and pin_memory else None  # pinned in place, not by DataLoader's copy
        self._pin = bool(pin_memory) and self._cuda is None
        prefill = int(kwargs.get("prefetch_factor") or 2) + 1 if lend else 0  # the prefetched ones and one filled
        self._lending = Lending(
            reuse=own and reuse_buffers, by_reference=lend and not self._pin, prefill=prefill, encoded=encoded
        )
        self._kwargs = {
            **kwargs,
            "collate_fn": as_is if collate_fn is None or collate_fn is as_is else _UserCollate(collate_fn),
            "worker_init_fn": _WorkerInit(kwargs.get("worker_init_fn")),
        }
        self._loader: DataLoader[Batch] | None = None  # persistent workers: one DataLoader for every pass
        self._resume: Resume | None = None  # from load_state_dict, for the pass of its epoch
        self._epoch = dataset.next_epoch
        self._taken = [0] * max(num_workers, 1)  # batches the training loop took from each (logical) worker
        self._items: list[int | None] = [None] * max(num_workers, 1)  # items of its plan each had passed then
        self._last: int | None = None

    def __iter__(self) -> Iterator[Batch]:
        epoch = self.dataset.next_pass()
        resume = self._resume if self._resume is not None and self._resume.epoch == epoch else None
        self._resume = None
        self._epoch = epoch
        self._taken = list(resume.batches) if resume else [0] * max(self.num_workers, 1)
        self._items = list(resume.items or [None] * len(self._taken)) if resume else [None] * len(self._taken)
        self._last = resume.last if resume else None
        if self._loader is None or not self.persistent:
            self._loader = DataLoader(
                _Pass(self.dataset, epoch, resume, self._lending),
                batch_size=None,
                num_workers=self.num_workers,
                pin_memory=self._pin,
                **self._kwargs,
            )
        pins: HostPins[Any] | None = HostPins(self._cuda) if self._cuda is not None else None
        return self._count(_raise_handed_over(_start(self._loader)), pins)

    def _count(self, batches: Iterator[Batch], pins: HostPins[Any] | None) -> Iterator[Batch]:
        returns = Returns(pins)  # the workers' buffers lent with the batches, handed back at the next request
        try:
            for handed in batches:
                worker, ticket = int(getattr(handed, "worker", 0)), getattr(handed, "ticket", None)
                assert ticket is None or isinstance(ticket, Lent)
                self._items[worker] = getattr(handed, "position", None)
                # a user's collate_fn: its result as it made it; else the keys alone, as a plain dict
                batch: Batch = handed.value if isinstance(handed, Tagged) else dict(handed)  # type: ignore[assignment]
                del handed
                image = None if ticket is None else returns.add(ticket)
                if image is not None and ticket is not None:  # by reference: its image in the buffer
                    batch["image"], batch["label"] = image, torch.from_numpy(batch["label"])
                    if ticket.context_shape is not None:  # and its context, in the same buffer
                        batch["context"] = returns.context(ticket)  # type: ignore[typeddict-item]
                self._taken[worker] += 1
                self._last = worker
                yield batch
                del batch, ticket, image
                returns.release()  # the loop has asked for the next batch: the ones before go back
        finally:
            returns.close()

    def state_dict(self) -> dict[str, Any]:
        """Where the training loop stands: plain JSON-able data to save with a checkpoint (never pickled)."""
        ds, cfg = self.dataset, self.dataset.config
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batches": list(self._taken),
            "items": list(self._items),
            "last_worker": self._last,
            "resampled": cfg.resampled,
            "seed": ds.base_seed,
            "batch_size": cfg.batch_size,
            "rank": ds.world.rank,
            "world_size": ds.world.world_size,
            "num_workers": self.num_workers,
            "samples": [len(ds.shards), int(ds.counts.sum())],
            "shuffle": cfg.shuffle,
            "history": [history_entry(g) for g in ds.segments(self._epoch)],
        }

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """Go on from ``state`` (from :meth:`state_dict` of a loader over the same build and options).

        In epoch mode the states of every rank of the old job (a list) may be given instead: the epoch then
        finishes on this loader's topology (another world size or number of workers, the old ranks' worker counts
        may have differed), every sample the old job had not yielded dealt to the new readers, none twice; a job so
        resumed may be stopped and resumed again, on any topology. Every field is checked before anything changes.

        Raises:
            ValueError: not a loader state (a field missing or of the wrong type or range, named), or one of
                another stream, seed, batch size or topology.
        """
        states = state if isinstance(state, list) else [state]
        if not states:
            raise ValueError("not a wsishard loader state: an empty list")
        for i, s in enumerate(states):
            if isinstance(state, list) and not isinstance(s, dict):
                raise ValueError(
                    f"not a wsishard loader state: a list whose item {i} is {a_type(s)}, not a state (a dict); give "
                    "this rank's state_dict(), or a list of every old rank's state_dict()"
                )
            check_state(s)
        mine = self.state_dict()
        if any(s.get("redealt") for s in states):
            raise ValueError("the state was saved by an older wsishard while a re-dealt epoch was finishing")
        first = states[0]
        if len(states) > 1 or (first["world_size"], first["num_workers"]) != (mine["world_size"], mine["num_workers"]):
            self._redeal(states, mine)
            return
        fixed = ("resampled", "batch_size", "rank", "world_size", "num_workers", "samples", "shuffle")
        other = [f"{k} {first.get(k)!r} (now {mine[k]!r})" for k in fixed if first.get(k) != mine[k]]
        if other or (not mine["resampled"] and first.get("seed") != mine["seed"]):
            raise ValueError(f"the state is of another stream or topology: {', '.join(other) or 'seed'}")
        before, self.dataset.history = self.dataset.history, (int(first["epoch"]), segments(first))
        try:
            at = _resume(self.dataset, first, max(self.num_workers, 1))
        except ValueError as exc:
            self.dataset.history = before  # refused: nothing changed
            raise ValueError(f"loader state: {exc}" if "loader state" not in str(exc) else str(exc)) from exc
        self.dataset.base_seed = int(first["seed"])  # resampled without a seed drew one: go on with it
        self.dataset.set_epoch(at.epoch)
        self._resume, self._epoch = at, at.epoch

    def _redeal(self, states: list[dict[str, Any]], mine: dict[str, Any]) -> None:
        first, ds = states[0], self.dataset
        fixed = ("resampled", "batch_size", "samples", "shuffle", "seed", "epoch", "world_size", "history")
        other = sorted({k for s in states for k in fixed if s.get(k, []) != first.get(k, [])})
        other += [k for k in ("resampled", "batch_size", "samples", "shuffle", "seed") if first.get(k) != mine[k]]
        if mine["resampled"] or other or sorted(int(s["rank"]) for s in states) != list(range(first["world_size"])):
            raise ValueError(
                "resuming on another topology needs epoch mode and the states of every rank of the old "
                f"job, of the same stream{': ' + ', '.join(other) if other else ''}"
            )
        ordered = sorted(states, key=lambda s: int(s["rank"]))
        segment = Segment(
            tuple(max(int(s["num_workers"]), 1) for s in ordered),
            tuple(tuple(s["batches"]) for s in ordered),
            tuple(tuple(s.get("items") or [None] * len(s["batches"])) for s in ordered),
        )
        epoch = int(first["epoch"])
        ds.history = (epoch, (*segments(first), segment))
        try:
            left = ds.batches_per_rank(self.num_workers, epoch)
        except ValueError as exc:
            ds.history = None
            raise ValueError(f"loader state: {exc}") from exc
        ds.set_epoch(epoch if left else epoch + 1)  # nothing left: the next epoch, from its start
        self._epoch = ds.next_epoch


def _resume(dataset: ShardStream, state: dict[str, Any], workers: int) -> Resume:
    """The :class:`Resume` of ``state``: the next batch is the uninterrupted run's next, from the worker after the
    last one taken (in epoch mode, after the last with batches left), which the DataLoader's first worker plays.

    Raises:
        ValueError: in epoch mode, a worker's batches beyond what the epoch gives it.
    """
    epoch, taken, last = int(state["epoch"]), tuple(int(b) for b in state["batches"]), state["last_worker"]
    left = [1] * workers
    if not dataset.config.resampled:
        budgets = [r.budget for r in dataset.plan(epoch, workers).readers[dataset.world.rank]]
        left = [int(b) - t for b, t in zip(budgets, taken, strict=True)]
        if any(n < 0 for n in left):
            raise ValueError(f"loader state: batches {list(taken)} exceed the epoch's {budgets} per worker")
        if not any(n > 0 for n in left):  # the epoch was over: the next one from its start
            return Resume(epoch + 1, (0,) * workers)
    first = 0 if last is None else int(last) + 1
    rotation = next(w % workers for w in range(first, first + workers) if left[w % workers] > 0)
    return Resume(epoch, taken, rotation, last, tuple(state.get("items") or [None] * workers))


def loader(
    dataset: ShardStream,
    *,
    num_workers: int = 4,
    pin_memory: bool | None = None,
    reuse_buffers: bool = True,
    decode: str = "worker",
    **kwargs: Any,
) -> ShardLoader:
    """A :class:`ShardLoader` over ``dataset``, pinned on CUDA.

    Args:
        dataset: from :func:`~wsishard.streaming.sources.stream`.
        num_workers: DataLoader worker processes per rank; ranks may differ under torch.distributed (this call then
            gathers them: every rank must call it).
        pin_memory: default: True when CUDA is available. With workers, the batches' images are then the workers'
            buffers page-locked in place (:mod:`wsishard.streaming.pinning`), not DataLoader's copy of each batch.
        reuse_buffers: a batch's images are valid until the loop takes the next batch (True, fast), or every batch
            has memory of its own (False): see :class:`ShardLoader`.
        decode: ``"worker"``: JPEGs decoded in the workers; ``"device"``: batches of JPEG bytes, decoded on the GPU
            by :class:`~wsishard.streaming.collate.GpuCollate` (needs CUDA and torchvision, and a stream without
            context; refused otherwise).
        **kwargs: passed to ``torch.utils.data.DataLoader`` (``prefetch_factor``, ``persistent_workers``...).

    Raises:
        TopologyError: too few shards for ranks x ``num_workers`` (raised here, not in a worker).
        ValueError: ``batch_size`` among ``kwargs`` (batching happens in the workers), a bad ``num_workers``, or
            ``decode="device"`` without CUDA or torchvision, or for a stream with context.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    share = rank_share(dataset.world)
    if share is not None:  # every rank's workers, so that ranks with different numbers plan alike (a collective)
        rank, size, total = share
        mine = np.zeros(size)
        mine[rank] = max(num_workers, 1)
        dataset.workers_by_rank = tuple(int(k) for k in total(mine))
    dataset.check_topology(num_workers)
    pin = torch.cuda.is_available() if pin_memory is None else pin_memory
    return ShardLoader(
        dataset, num_workers=num_workers, pin_memory=pin, reuse_buffers=reuse_buffers, decode=decode, **kwargs
    )
