"""Where this process sits in a training job: DDP rank and world size, DataLoader worker and worker count.

Detected once (:func:`detect_world`, in the main process) and passed down as a :class:`World` value; later
stages never re-read it from the environment.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from wsishard.errors import TopologyError


@dataclass(frozen=True, kw_only=True)
class World:
    """Where this process sits: DDP ``rank`` of ``world_size`` and DataLoader ``worker`` of ``num_workers``.

    Detected once (see :func:`detect_world`) and passed down, never re-read from the
    environment by later stages.

    Raises:
        ValueError: a size below 1 or an index outside ``[0, size)``.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if self.num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {self.num_workers}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")
        if not 0 <= self.worker < self.num_workers:
            raise ValueError(f"worker must be in [0, {self.num_workers}), got {self.worker}")

    def with_worker(self, worker: int, num_workers: int) -> World:
        """The same rank, seen from DataLoader worker ``worker`` of ``num_workers``."""
        return replace(self, worker=worker, num_workers=num_workers)

    @classmethod
    def jax(cls) -> World:
        """This JAX process's place: rank ``jax.process_index()`` of ``jax.process_count()`` (imports jax; after
        ``jax.distributed.initialize``, or a single process)."""
        import jax

        return cls(rank=jax.process_index(), world_size=jax.process_count())


def _jax_distributed() -> tuple[int, int] | None:
    """``(jax.process_index(), jax.process_count())`` when jax is imported already and ``jax.distributed`` is
    initialised; None otherwise (jax is never imported here: it costs seconds, and a GPU's memory on first use)."""
    jax = sys.modules.get("jax")
    initialised = getattr(getattr(jax, "distributed", None), "is_initialized", None)
    if jax is None or initialised is None or not initialised():
        return None
    return int(jax.process_index()), int(jax.process_count())


def detect_world() -> World:
    """This process's rank and world size and its worker.

    The rank and world size come from torch.distributed when it is initialised, else from ``jax.distributed`` when
    jax is imported and that is initialised (``jax.process_index()`` of ``jax.process_count()``), else from
    torchrun's RANK/WORLD_SIZE, else rank 0 of 1.

    Raises:
        TopologyError: torch.distributed (or jax.distributed) and RANK/WORLD_SIZE disagree.
    """
    env = (os.environ.get("RANK"), os.environ.get("WORLD_SIZE"))
    rank, size = (int(env[0]), int(env[1])) if env[0] is not None and env[1] is not None else (0, 1)
    dist = torch.distributed
    found: tuple[str, tuple[int, int]] | None = None
    if dist.is_available() and dist.is_initialized():
        found = ("torch.distributed", (dist.get_rank(), dist.get_world_size()))
    elif (jax_place := _jax_distributed()) is not None:
        found = ("jax.distributed", jax_place)
    if found is not None:
        if env[0] is not None and (rank, size) != found[1]:
            raise TopologyError(f"RANK/WORLD_SIZE say {rank}/{size} but {found[0]} says {found[1][0]}/{found[1][1]}")
        rank, size = found[1]
    info = torch.utils.data.get_worker_info()
    worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
    return World(rank=rank, world_size=size, worker=worker, num_workers=workers)


def rank_share(world: World | None = None) -> tuple[int, int, Callable[[np.ndarray], np.ndarray]] | None:
    """``(rank, world_size, sum)`` when torch.distributed is initialised with several ranks (and agrees with
    ``world``): ``sum`` adds a float64 array over the ranks (a collective: every rank must call it). None otherwise.

    Raises:
        TopologyError: ``world`` names another rank or world size than torch.distributed.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    rank, size = dist.get_rank(), dist.get_world_size()
    if world is not None and (world.rank, world.world_size) != (rank, size):
        raise TopologyError(
            f"world= says rank {world.rank} of {world.world_size} but torch.distributed says {rank} of {size}"
        )

    def total(a: np.ndarray) -> np.ndarray:
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
        t = torch.from_numpy(np.ascontiguousarray(a, dtype=np.float64)).to(device or "cpu")
        dist.all_reduce(t)
        return t.cpu().numpy()

    return rank, size, total
