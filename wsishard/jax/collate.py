"""Normalisation and dihedral augmentation of global uint8 NHWC batches on the devices, as one jitted function."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from wsishard.streaming.collate import _TAG_DIHEDRAL, check_mean_std

__all__ = ["Collate"]


@partial(jax.jit, static_argnames=("augment", "dtype"))
def _collate(image: jax.Array, codes: jax.Array, table: jax.Array, augment: bool, dtype: Any) -> Any:
    """uint8 (B, h, w, 3) -> ``dtype`` (B, h, w, 3): each sample by its dihedral code (``augment``), then each
    value looked up in ``table`` (256, 3): ``((v / 255) - mean) / std`` of every uint8 value ``v``, per channel."""
    x = image
    if augment:
        c = codes[:, None, None, None]  # (B, 1, 1, 1) int32
        if x.shape[1] == x.shape[2]:  # bit 0: swap height and width (square images only)
            x = jnp.where((c & 1) != 0, jnp.swapaxes(x, 1, 2), x)
        x = jnp.where((c & 2) != 0, jnp.flip(x, 2), x)  # bit 1: flip width
        x = jnp.where((c & 4) != 0, jnp.flip(x, 1), x)  # bit 2: flip height
    y = table[x.astype(jnp.int32), jnp.arange(3)]  # (B, h, w, 3) float32: a gather from 768 values
    return y.astype(dtype)


class Collate:
    """A global uint8 NHWC batch (:class:`~wsishard.jax.loader.JaxLoader`'s ``image``) -> normalised ``dtype`` NHWC
    on the same devices and sharding, each sample optionally moved by a random dihedral transform.

    The same results as :class:`~wsishard.streaming.collate.GpuCollate` given the same global batch (NHWC instead of
    NCHW), bit for bit: each value is looked up in a table of the 256 uint8 values' results per channel, computed
    by the reference's own float32 operations ``((v / 255) - mean) / std`` (then rounded to ``dtype``), as
    GpuCollate's CPU pass does. The ``n``-th batch's codes are
    ``np.random.default_rng((seed, n, tag)).integers(0, 8, B)`` over the global batch of ``B``, as GpuCollate draws
    them for a batch of ``B``; bit 0 of a code swaps height and width, bit 1 flips the width, bit 2 the height.

    Args:
        mean: per-channel mean, in [0, 1] units.
        std: per-channel standard deviation, in [0, 1] units.
        dtype: output float dtype (``jnp.float32``, ``jnp.bfloat16``...).
        augment: a random flip / 90-degree rotation per sample (flips only for non-square images).
        seed: the augmentation's seed, the same on every process (None: from OS entropy, a single process only).

    Raises:
        ValueError: mean or std without 3 values, a non-positive std, a non-float dtype, or ``augment`` without a
            seed under several processes.
    """

    def __init__(
        self,
        mean: Sequence[float] = (0.0, 0.0, 0.0),
        std: Sequence[float] = (1.0, 1.0, 1.0),
        dtype: Any = jnp.float32,
        augment: bool = False,
        seed: int | None = None,
    ) -> None:
        check_mean_std(mean, std)
        if not jnp.issubdtype(dtype, jnp.floating):
            raise ValueError(f"dtype must be a float dtype, got {dtype}")
        if augment and seed is None and jax.process_count() > 1:
            raise ValueError("augment=True under several processes needs seed= (the same on every process)")
        self.mean = np.asarray(mean, dtype=np.float32)  # (3,)
        self.std = np.asarray(std, dtype=np.float32)  # (3,)
        values = np.arange(256, dtype=np.float32)[:, None]  # (256, 1)
        self.table = ((values / np.float32(255)) - self.mean) / self.std  # (256, 3) float32, GpuCollate's operations
        self.dtype = dtype
        self.augment = augment
        self.seed = seed if seed is not None else int(np.random.default_rng().integers(2**63))
        self.batches = 0  # batches collated so far: the next one's number, which its codes follow

    def state_dict(self) -> dict[str, int]:
        """The seed and the number of batches collated so far (plain JSON data)."""
        return {"seed": self.seed, "batches": self.batches}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Go on from :meth:`state_dict`: the next batch gets the codes the saved run's next batch got."""
        self.seed, self.batches = int(state["seed"]), int(state["batches"])

    def codes(self, batch_size: int) -> np.ndarray:
        """(B,) int64 dihedral codes of the next batch of ``batch_size`` (global) samples, drawn on the host."""
        return np.random.default_rng((self.seed, self.batches, _TAG_DIHEDRAL)).integers(0, 8, batch_size)

    def images(self, image: jax.Array) -> jax.Array:
        """Global uint8 (B, h, w, 3) -> normalised ``dtype`` (B, h, w, 3), sharded as ``image``."""
        if image.dtype != jnp.uint8 or image.ndim != 4 or image.shape[-1] != 3:
            raise ValueError(f"expected a uint8 (B, h, w, 3) batch, got {image.dtype} {tuple(image.shape)}")
        drawn = self.codes(image.shape[0]).astype(np.int32)  # (B,), the same on every process
        sharding = image.sharding
        if isinstance(sharding, NamedSharding):
            sharding = NamedSharding(sharding.mesh, PartitionSpec(sharding.spec[0] if len(sharding.spec) else None))
        codes = jax.make_array_from_callback(drawn.shape, sharding, lambda index: drawn[index])
        try:
            return _collate(image, codes, self.table, self.augment, self.dtype)
        finally:
            self.batches += 1

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """The batch with its ``image`` collated (:meth:`images`); the other fields pass through."""
        return {**batch, "image": self.images(batch["image"])}
