"""Bags: an embeddings output (``wsishard embed``) streamed one slide per sample, through the same planner, reader
and budgets as patches; only this batching stage differs (the reader's decode hook: npy members, not JPEGs).

A batch of B slides holds ``features`` (B, Nmax, D) float32 zero-padded past each slide's patches, ``mask`` (B, Nmax)
bool (True: a patch), ``coords`` (B, Nmax, 2) int64 level-0 x, y, ``label`` (B,) int64 (-1: unlabelled), ``key`` the
slide ids and ``meta`` each slide's ``.json``. With ``max_patches=K`` each draw of a slide keeps a random subset of at
most K of its patches (in their stored order), seeded by (seed, epoch, slide id): the same draw again on a resume.
npy members are parsed with ``np.load(allow_pickle=False)`` only.
"""

from __future__ import annotations

import io
import logging
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from wsishard.errors import ShardError
from wsishard.streaming.decode import Metas, checked_label
from wsishard.streaming.stages import ErrorMode, RawSample

logger = logging.getLogger(__name__)

__all__ = ["BagBatches", "decode_bag"]


def _npy(data: bytes, what: str, raw: RawSample) -> np.ndarray:
    try:
        return np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:  # a pickled object array, or not an npy file
        raise ShardError(raw["shard"], f"sample {raw['key']}: {what} is not a plain npy array ({exc})") from exc


def decode_bag(raw: RawSample, max_patches: int | None, seed: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """A bag's features (n, D) float32 and coords (n, 2) int64, cut to a seeded subset of ``max_patches``.

    Raises:
        ShardError: a member that is not a plain npy array, or shapes that do not agree.
    """
    features = _npy(raw["image"], "features.npy", raw)
    coords = _npy(raw.get("coords", b""), "coords.npy", raw)
    n = features.shape[0] if features.ndim == 2 else -1
    if n < 0 or coords.shape != (n, 2) or not np.issubdtype(features.dtype, np.floating):
        shapes = f"features {features.shape} {features.dtype}, coords {coords.shape}"
        raise ShardError(raw["shard"], f"sample {raw['key']}: {shapes} (want (N, D) float and (N, 2))")
    if max_patches is not None and n > max_patches:
        word = zlib.crc32(raw["key"].encode())
        keep = np.sort(np.random.default_rng((*seed, word)).choice(n, max_patches, replace=False))
        features, coords = features[keep], coords[keep]
    return features.astype(np.float32), coords.astype(np.int64)


@dataclass
class BagBatches:
    """Raw bag samples -> batches of padded bags (module docstring).

    Args:
        batch_size: slides per batch.
        drop_last: drop a last incomplete batch.
        on_error: ``"skip"`` leaves a broken bag out (logged); ``"raise"`` raises its ShardError.
        max_patches: at most this many patches per bag per draw (None: all).
        seed: (seed, epoch) of the draws' subsets.
    """

    batch_size: int
    drop_last: bool
    on_error: ErrorMode = "raise"
    max_patches: int | None = None
    seed: tuple[int, ...] = (0, 0)

    def __call__(self, src: Iterator[RawSample]) -> Iterator[dict[str, Any]]:
        bags: list[tuple[RawSample, np.ndarray, np.ndarray, int]] = []
        for raw in src:
            try:
                features, coords = decode_bag(raw, self.max_patches, self.seed)
                label = checked_label(raw)
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                logger.warning("skipping %s", exc)
                continue
            bags.append((raw, features, coords, label))
            if len(bags) == self.batch_size:
                yield _batch(bags)
                bags = []
        if bags and not self.drop_last:
            yield _batch(bags)


def _batch(bags: list[tuple[RawSample, np.ndarray, np.ndarray, int]]) -> dict[str, Any]:
    dims = {f.shape[1] for _, f, _, _ in bags}
    if len(dims) > 1:
        raise ShardError(bags[0][0]["shard"], f"bags of different feature sizes {sorted(dims)} in one stream")
    nmax, dim = max(f.shape[0] for _, f, _, _ in bags), dims.pop()
    features = torch.zeros(len(bags), nmax, dim)  # (B, Nmax, D) float32
    coords = torch.zeros(len(bags), nmax, 2, dtype=torch.int64)  # (B, Nmax, 2)
    mask = torch.zeros(len(bags), nmax, dtype=torch.bool)  # (B, Nmax)
    for i, (_, f, c, _) in enumerate(bags):
        features[i, : len(f)] = torch.from_numpy(f)
        coords[i, : len(c)] = torch.from_numpy(c)
        mask[i, : len(f)] = True
    return {
        "features": features,
        "mask": mask,
        "coords": coords,
        "label": torch.tensor([b[3] for b in bags], dtype=torch.int64),
        "key": [b[0]["key"] for b in bags],
        "meta": Metas(b[0]["meta"] for b in bags),
    }
