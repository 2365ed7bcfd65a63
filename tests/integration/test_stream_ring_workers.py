"""Reused batch buffers through real DataLoader workers: a batch is intact until the loop takes the next, buffers come
back (the same shared memory, filled again) with the right pixels, and ``reuse_buffers=False`` gives batches the loop
may keep."""

from __future__ import annotations

import gc
import os
import time
from multiprocessing import resource_sharer
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardmaker as sm
import torch

from wsishard.streaming.loader import loader
from wsishard.streaming.ring import RING_SLOTS
from wsishard.streaming.sources import stream


def _check(batch: dict, out: sm.Output) -> None:
    for key, image in zip(batch["key"], batch["image"], strict=True):
        assert np.array_equal(image.numpy(), out.images[key]), key


@pytest.mark.parametrize("drop_last", [True, False])
def test_without_reuse_batches_kept_by_the_loop_stay_intact(tmp_path: Path, drop_last: bool) -> None:
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    ds = stream(png.root, batch_size=4, resampled=False, seed=0, shuffle=4, drop_last=drop_last)
    dl = loader(ds, num_workers=2, reuse_buffers=False)
    kept = list(dl)  # every batch still held when the later ones are made
    assert len(kept) == dl.dataset.batches_per_rank(num_workers=2) > 8
    assert drop_last == all(len(b["key"]) == 4 for b in kept)  # without drop_last: a short last batch per worker
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


def test_under_the_loader_a_buffer_crosses_to_this_process_once(tmp_path: Path, monkeypatch: Any) -> None:
    """Batches after a buffer's first only name it: few file descriptors come over, however many batches."""
    received: list[int] = []
    detach = resource_sharer.DupFd.detach

    def counted(self: Any) -> int:  # a file descriptor received from a worker
        received.append(1)
        return detach(self)

    monkeypatch.setattr(resource_sharer.DupFd, "detach", counted)
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=2, pin_memory=False)
    for step, batch in enumerate(dl):
        _check(batch, png)
        assert batch["label"].dtype == torch.int64 and batch["label"].shape == (2,)
        if step == 60:
            break
    assert 2 <= len(received) <= 2 * (RING_SLOTS + 1)  # each worker: its buffers and its ring's flags, once


def _in_the_worker(batch: dict) -> dict:
    """A collate_fn of the user's: it needs the batch's image tensor, in the worker."""
    batch["seen"] = int(batch["image"].shape[0])
    return batch


def test_a_collate_fn_of_the_users_gets_the_image_tensor(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    ds = stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4)
    for step, batch in enumerate(loader(ds, num_workers=2, collate_fn=_in_the_worker)):
        _check(batch, png)
        assert batch["seen"] == 2
        if step == 20:
            break


def test_a_batch_is_intact_until_the_next_is_taken(tmp_path: Path) -> None:
    """The workers run ahead (prefetch) while the loop holds a batch: they never fill the buffer it holds."""
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=2, prefetch_factor=4)
    for step, batch in enumerate(dl):
        time.sleep(0.02)  # the workers fill every buffer they may meanwhile
        _check(batch, png)
        if step == 30:
            break


def test_the_loader_leaves_the_dataset_as_it_was(tmp_path: Path) -> None:
    """The loader's lending goes to its workers only: a plain DataLoader over the same stream, while the loader's
    iterator runs, gets batches that carry images of their own."""
    from torch.utils.data import DataLoader

    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6), image_format="png")
    ds = stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4)
    started = iter(loader(ds, num_workers=2))
    plain = next(iter(DataLoader(ds, batch_size=None, num_workers=2, collate_fn=lambda b: b)))
    assert "buffer" not in plain and "worker" not in plain  # no key of the loader's own in a user's DataLoader
    _check({"key": plain["key"], "image": plain["image"]}, png)  # an image of its own, not a reference
    _check(next(started), png)  # the loader's own workers lend by reference
    del started


def test_every_pass_of_a_loader_lends_by_reference(tmp_path: Path, monkeypatch: Any) -> None:
    """Each pass starts new workers, and each lends its buffers by reference: few file descriptors come over per
    pass however many batches."""
    received: list[int] = []
    detach = resource_sharer.DupFd.detach
    monkeypatch.setattr(resource_sharer.DupFd, "detach", lambda self: received.append(1) or detach(self))
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7, 8, 6), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=False, seed=0, shuffle=4), num_workers=2, pin_memory=False)
    for _ in range(2):
        received.clear()
        batches = 0
        for batch in dl:
            _check(batch, png)
            batches += 1
        assert batches > 2 * (RING_SLOTS + 1) >= len(received) >= 2


class _Cycle:
    """Garbage that says where it was collected: ``marker`` is written when a process other than ``parent`` frees it."""

    def __init__(self, marker: Path, parent: int) -> None:
        self.me, self.marker, self.parent = self, marker, parent

    def __del__(self) -> None:
        if os.getpid() != self.parent:
            self.marker.write_text(str(os.getpid()))


def _collect(_worker: int) -> None:
    gc.collect()


def test_workers_never_collect_what_the_parent_left(tmp_path: Path) -> None:
    """A worker forked while the training process holds cyclic garbage must not free it: a CUDA tensor freed in a
    forked worker aborts the worker (seen on an H200: a failed test's traceback held CUDA tensors in a cycle)."""
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    marker = tmp_path / "collected-in-a-worker"
    frozen = gc.get_freeze_count()  # some Python builds freeze their start-up objects (375 on the GPU machine)
    gc.disable()  # the cycle stays uncollected until the workers have started
    try:
        _Cycle(marker, os.getpid())
        dl = loader(stream(png.root, batch_size=4, resampled=False, seed=0), num_workers=2, worker_init_fn=_collect)
        batches = list(dl)
    finally:
        gc.enable()
    gc.collect()  # here, in the parent: not marked
    assert batches and not marker.exists(), f"a worker (pid {marker.read_text()}) collected the parent's garbage"
    assert gc.isenabled() and gc.get_freeze_count() == frozen  # this process's collector as it was


def test_a_worker_hands_its_batches_over_with_no_key_of_the_loaders_own(tmp_path: Path) -> None:
    """What a worker sends the loader: the batch's keys only; its buffer ticket and worker travel as attributes
    (:class:`~wsishard.streaming.ring.Handed`), so no stage between the reader and the user sees a hidden key."""
    from torch.utils.data import DataLoader

    from wsishard.streaming.loader import _Pass, as_is
    from wsishard.streaming.ring import Handed, Lending, Lent

    png = sm.make_output(str(tmp_path / "png"), (9, 7), image_format="png")
    ds = stream(png.root, batch_size=4, resampled=False, seed=0, shuffle=4, pad_last=True)
    lending = Lending(reuse=True, by_reference=True, prefill=2)
    sent = list(DataLoader(_Pass(ds, 0, None, lending), batch_size=None, num_workers=1, collate_fn=as_is))
    assert len(sent) == ds.batches_per_rank(num_workers=1) > 2
    for item in sent:
        assert isinstance(item, Handed) and isinstance(item.ticket, Lent) and item.worker == 0
        assert set(item) == {"label", "meta", "key", "valid"}  # by reference: the image is in the buffer
    got = list(loader(ds, num_workers=1))
    assert all(type(b) is dict and set(b) == {"image", "label", "meta", "key", "valid"} for b in got)
