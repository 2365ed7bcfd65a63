"""The options of a :class:`~wsishard.streaming.dataset.ShardStream`, checked when made."""

from __future__ import annotations

from dataclasses import dataclass

from wsishard.streaming.context import check_context
from wsishard.streaming.stages import ErrorMode


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
        pad_last: epoch mode: every sample exactly once, every rank the same number of batches, the last ones
            filled with repeats marked ``batch["valid"] == False`` (:func:`~wsishard.streaming.planner.budgets`).
        context_scales: context members decoded into ``batch["context"]`` (the build's K; 0: none, not read).
        context_size_px: width = height of every context patch, px (the manifests' ``context_size``).
        epoch_size: epoch mode with weights: draws per epoch over all ranks (None: the selected samples).
        bags: the shards are an embeddings output's: one slide per sample, batched as padded bags
            (:mod:`~wsishard.streaming.bags`).
        max_patches: with ``bags``: at most this many patches per bag per draw, a seeded random subset (None: all).
    """

    batch_size: int
    resampled: bool = True
    shuffle: int = 1000
    seed: int | None = None
    drop_last: bool = True
    on_error: ErrorMode = "raise"
    patch_size_px: int | None = None
    pad_last: bool = False
    context_scales: int = 0
    context_size_px: int | None = None
    epoch_size: int | None = None
    bags: bool = False
    max_patches: int | None = None

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
        check_context(self.context_scales, self.context_size_px)
        if self.pad_last and self.resampled:
            raise ValueError("pad_last=True needs resampled=False (an exact epoch); resampled streams never end")
        if self.max_patches is not None and (not self.bags or self.max_patches < 1):
            raise ValueError(f"max_patches={self.max_patches!r}: patches per bag, >= 1, for an embeddings output only")
        if self.epoch_size is not None and (self.resampled or isinstance(self.epoch_size, bool) or self.epoch_size < 1):
            raise ValueError(
                f"epoch_size={self.epoch_size!r}: an epoch's weighted draws, an integer >= 1 with resampled=False "
                "(resampled streams never end)"
            )
