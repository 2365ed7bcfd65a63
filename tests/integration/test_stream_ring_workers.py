"""Reused batch buffers through real DataLoader workers: batches the loop keeps are never overwritten, and buffers
the loop lets go of come back (the same shared memory, filled again) with the right pixels."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import shardmaker as sm

from wsishard.streaming.dataset import stream
from wsishard.streaming.loader import loader


def _check(batch: dict, out: sm.Output) -> None:
    for key, image in zip(batch["key"], batch["image"], strict=True):
        assert np.array_equal(image.numpy(), out.images[key]), key


def test_batches_kept_by_the_loop_stay_intact(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=False, seed=0, shuffle=4), num_workers=2)
    kept = list(dl)  # every batch still held when the later ones are made
    assert len(kept) == dl.dataset.batches_per_rank(num_workers=2) > 10
    assert len({b["image"].untyped_storage().data_ptr() for b in kept}) == len(kept)  # no buffer lent twice
    for batch in kept:
        _check(batch, png)
        assert "buffer" not in batch and "worker" not in batch


def test_buffers_the_loop_lets_go_of_are_filled_again(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=2)
    addresses = []
    for step, batch in enumerate(dl):
        _check(batch, png)
        addresses.append(batch["image"].untyped_storage().data_ptr())
        if step == 40:
            break
    # each worker's ring: a handful of buffers (one filled, the prefetched ones, the loop's), 40 batches
    assert len(set(addresses)) <= 2 * 5
