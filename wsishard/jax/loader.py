"""Batches of a :class:`~wsishard.streaming.loader.ShardLoader` as global ``jax.Array`` s.

Each process streams its own share (its rank is ``jax.process_index()``: :func:`~wsishard.streaming.world.detect_world`)
and contributes its batch of ``B`` to one global batch of ``jax.process_count() * B`` samples, made by
``jax.make_array_from_process_local_data`` and sharded along the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TypedDict

import jax
import numpy as np
import torch
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from wsishard.streaming.dataset import ShardStream
from wsishard.streaming.decode import Batch, Metas
from wsishard.streaming.loader import ShardLoader
from wsishard.streaming.loader import loader as torch_loader

__all__ = ["JaxBatch", "JaxLoader", "default_sharding", "loader"]


class JaxBatch(TypedDict):
    """A batch as :class:`JaxLoader` yields it: global arrays, and this process's keys and metadata."""

    image: jax.Array  # (P * b, h, w, 3) uint8, P = jax.process_count()
    label: jax.Array  # (P * b,) int32, -1 when unlabelled
    valid: jax.Array  # (P * b,) bool, False for pad_last's repeats
    key: list[str]  # this process's b keys, in the order of its rows of the global batch
    meta: Metas  # this process's b samples' metadata


def default_sharding() -> NamedSharding:
    """Along the batch over every device of every process: ``NamedSharding(Mesh(jax.devices(), ("batch",)),
    P("batch"))``."""
    return NamedSharding(Mesh(np.array(jax.devices()), ("batch",)), PartitionSpec("batch"))


def _batch_only(sharding: Sharding) -> Sharding:
    """The sharding of the (P * b,) label and valid arrays: ``sharding``'s mesh and its batch axes only.

    Raises:
        ValueError: ``sharding`` is not a :class:`jax.sharding.NamedSharding`.
    """
    if not isinstance(sharding, NamedSharding):
        raise ValueError(
            f"sharding must be a jax.sharding.NamedSharding (its first dimension the batch's), got "
            f"{type(sharding).__name__}"
        )
    spec = sharding.spec
    return NamedSharding(sharding.mesh, PartitionSpec(spec[0] if len(spec) else None))


def _batch_blocks(sharding: NamedSharding) -> int:
    """Blocks of rows the global batch is cut into: the product of the sizes of the mesh axes its first dimension
    is sharded over (1: replicated)."""
    first = sharding.spec[0] if len(sharding.spec) else None
    axes = () if first is None else (first,) if isinstance(first, str) else tuple(first)
    return int(np.prod([sharding.mesh.shape[a] for a in axes], dtype=np.int64))


class JaxLoader:
    """Iterate a :class:`~wsishard.streaming.loader.ShardLoader`'s batches as global ``jax.Array`` s.

    Every process of the job iterates its own loader in step: batch ``n`` of each makes global batch ``n``, process
    ``p``'s samples its rows ``[p * b, (p + 1) * b)``. An epoch stream needs ``pad_last=True`` under several
    processes (every rank then has the same number of full batches; ``valid`` marks the repeats).

    The images are copied onto the devices before the next batch is taken from the torch loader (its buffers are
    reused then: :mod:`wsishard.streaming.ring`), so a batch's arrays are the caller's to keep.

    Args:
        loader: the torch loader, from :func:`wsishard.loader` (or :func:`loader` here).
        sharding: the image's sharding (first dimension the batch); label and valid take its mesh and batch axes.
            None: :func:`default_sharding`.

    Raises:
        ValueError: a sharding that is not a ``NamedSharding``; while iterating, a batch of another size than the
            stream's ``batch_size`` under several processes, or one that does not split over this process's devices.
    """

    def __init__(self, loader: ShardLoader, sharding: Sharding | None = None) -> None:
        self.torch_loader = loader
        self.sharding = sharding if sharding is not None else default_sharding()
        self.label_sharding = _batch_only(self.sharding)

    def __iter__(self) -> Iterator[JaxBatch]:
        for batch in self.torch_loader:
            out = self._globals(batch)
            yield out
            # the buffers go back to the workers when the next batch is taken: the copies must be done by then
            jax.block_until_ready((out["image"], out["label"], out["valid"]))

    def _globals(self, batch: Batch) -> JaxBatch:
        image = batch["image"].numpy()  # (b, h, w, 3) uint8, a view of the worker's buffer
        b, count = image.shape[0], jax.process_count()
        size = self.torch_loader.dataset.config.batch_size
        if count > 1 and b != size:
            raise ValueError(
                f"a batch of {b} samples, not batch_size={size}: a global batch needs every process's batch full "
                "(stream with pad_last=True, or resampled=True)"
            )
        blocks = _batch_blocks(self.sharding)  # type: ignore[arg-type]  # a NamedSharding: checked when made
        if (b * count) % blocks:
            raise ValueError(
                f"a global batch of {b * count} samples ({b} a process) does not split into the sharding's {blocks} "
                f"blocks along the batch: give each process a batch_size that is a multiple of {-(-blocks // count)}"
            )
        label = batch["label"].numpy().astype(np.int32)  # (b,)
        valid = batch.get("valid")
        valid_np = np.ones(b, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)  # (b,)
        return JaxBatch(
            image=self._global(self.sharding, image),
            label=self._global(self.label_sharding, label),
            valid=self._global(self.label_sharding, valid_np),
            key=list(batch["key"]),
            meta=batch["meta"],
        )

    @staticmethod
    def _global(sharding: Sharding, local: np.ndarray) -> jax.Array:
        shape = (local.shape[0] * jax.process_count(), *local.shape[1:])
        return jax.make_array_from_process_local_data(sharding, local, shape)

    def state_dict(self) -> dict[str, Any]:
        """The torch loader's :meth:`~wsishard.streaming.loader.ShardLoader.state_dict`."""
        return self.torch_loader.state_dict()

    def load_state_dict(self, state: dict[str, Any] | list[dict[str, Any]]) -> None:
        """The torch loader's :meth:`~wsishard.streaming.loader.ShardLoader.load_state_dict`."""
        self.torch_loader.load_state_dict(state)


def loader(dataset: ShardStream, *, num_workers: int = 4, sharding: Sharding | None = None, **kwargs: Any) -> JaxLoader:
    """A :class:`JaxLoader` over ``dataset`` (from :func:`wsishard.stream`): the same DataLoader workers as
    :func:`wsishard.loader`, their batches made global ``jax.Array`` s.

    Args:
        dataset: the stream; under ``jax.distributed`` its rank is ``jax.process_index()`` (detected).
        num_workers: DataLoader worker processes of this process.
        sharding: the global image's sharding (None: :func:`default_sharding`).
        **kwargs: passed to :func:`wsishard.loader` (``prefetch_factor``, ``reuse_buffers``...); ``decode`` and
            ``pin_memory`` are the torch loader's (refused here: workers decode, jax copies).

    Under ``jax.distributed`` without torch.distributed, every process's ``num_workers`` is gathered (a JAX
    collective, ``multihost_utils.process_allgather``: every process must call this), so that processes with
    different numbers plan their epochs alike, as :func:`wsishard.loader` does under torch.distributed.

    Raises:
        ValueError: ``decode`` or ``pin_memory`` given, a bad ``num_workers``, a sharding that is not a
            ``NamedSharding``.
        TopologyError: too few shards for processes x ``num_workers``.
    """
    refused = sorted(k for k in ("decode", "pin_memory") if k in kwargs)
    if refused:
        raise ValueError(f"{', '.join(refused)}: not options of the jax loader (workers decode, jax copies)")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
        raise ValueError(f"num_workers must be an integer >= 0, got {num_workers!r}")
    _gather_workers(dataset, num_workers)
    return JaxLoader(torch_loader(dataset, num_workers=num_workers, pin_memory=False, **kwargs), sharding)


def _gather_workers(dataset: ShardStream, num_workers: int) -> None:
    """Every process's workers into ``dataset.workers_by_rank`` when the stream's ranks are JAX's processes and
    torch.distributed (which :func:`wsishard.loader` gathers them with) is not initialised."""
    dist = torch.distributed
    count = jax.process_count()
    if count == 1 or dataset.world.world_size != count or (dist.is_available() and dist.is_initialized()):
        return
    mine = np.array([max(num_workers, 1)], dtype=np.int32)  # (1,)
    every = np.asarray(multihost_utils.process_allgather(mine)).reshape(count)  # (P,) in process order
    dataset.workers_by_rank = tuple(int(k) for k in every)
