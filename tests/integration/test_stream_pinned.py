"""Pinned batches through real DataLoader workers: the workers' buffers page-locked in place (pinning.py).

With stand-in CUDA calls (any machine): each buffer registered once, whatever the number of batches, and every
one unregistered when the loop is done. With CUDA: the images are pinned, and copies queued from them read the
batch they were queued from even while the device is busy and the workers go on filling buffers."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardmaker as sm
import torch
from streamtools import FakeCuda

from wsishard.streaming import loader as loader_module
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.loader import loader
from wsishard.streaming.ring import RING_SLOTS
from wsishard.streaming.sources import stream

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _check(keys: list[str], images: Any, out: sm.Output) -> None:
    for key, image in zip(keys, images, strict=True):
        assert np.array_equal(np.asarray(image), out.images[key]), key


def test_each_buffer_is_registered_once_and_unregistered_at_the_end(tmp_path: Path, monkeypatch: Any) -> None:
    fake = FakeCuda()
    fake.done = 10**9  # every queued copy finished at once
    monkeypatch.setattr(loader_module, "cuda_runtime", fake.cuda)
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=2, pin_memory=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        batches = iter(dl)
        for step, batch in enumerate(batches):
            _check(batch["key"], batch["image"].numpy(), png)
            if step == 60:
                break
    assert not [w for w in seen if "pin_memory" in str(w.message)]  # DataLoader's pin thread was never asked
    registered = [c[1] for c in fake.calls if c[0] == "register"]
    assert 2 <= len(registered) <= 2 * RING_SLOTS and len(set(registered)) == len(registered)
    assert not any(c[0] == "unregister" for c in fake.calls)
    del batch
    batches.close()  # the loop is done with the loader's iterator
    assert sorted(c[1] for c in fake.calls if c[0] == "unregister") == sorted(registered)
    assert fake.calls.index(("sync",)) < min(i for i, c in enumerate(fake.calls) if c[0] == "unregister")


def test_batches_of_their_own_are_pinned_by_dataloader(tmp_path: Path, monkeypatch: Any) -> None:
    """Without reuse every batch is new memory: registering each would pin memory that is soon unmapped."""
    fake = FakeCuda()
    monkeypatch.setattr(loader_module, "cuda_runtime", fake.cuda)
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    ds = stream(png.root, batch_size=2, resampled=False, seed=0, shuffle=4)
    dl = loader(ds, num_workers=2, pin_memory=True, reuse_buffers=False)
    if torch.cuda.is_available():
        batches = list(dl)
        assert all(b["image"].is_pinned() for b in batches)  # pinned by DataLoader's thread
    else:
        with pytest.warns(UserWarning, match="pin_memory"):  # DataLoader's pin thread asked for, without CUDA
            batches = list(dl)
    assert len(batches) == ds.batches_per_rank(num_workers=2)
    for batch in batches:
        _check(batch["key"], batch["image"].numpy(), png)
    assert fake.calls == []


@needs_cuda
def test_making_a_loader_does_not_start_cuda(tmp_path: Path) -> None:
    """Code that makes a loader, then forks processes that use CUDA, must not find CUDA started in the parent."""
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    code = (
        "import torch; from wsishard import loader, stream; "
        f"dl = loader(stream({png.root!r}, batch_size=2, resampled=True, seed=0), num_workers=2); "
        "print(dl._cuda is not None, torch.cuda.is_initialized())"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]


@needs_cuda
def test_copies_queued_from_pinned_batches_read_the_batch_they_were_queued_from(tmp_path: Path) -> None:
    png = sm.make_output(str(tmp_path / "png"), (9, 7, 8, 6, 9, 7), image_format="png")
    dl = loader(stream(png.root, batch_size=2, resampled=True, seed=0, shuffle=4), num_workers=2)  # pinned: CUDA
    copies, pinned = [], []
    for step, batch in enumerate(dl):
        pinned.append(batch["image"].is_pinned())
        torch.cuda._sleep(20_000_000)  # the device busy: the copy below runs well after the loop moved on
        copies.append((list(batch["key"]), batch["image"].to("cuda", non_blocking=True)))
        if step == 40:
            break
    torch.cuda.synchronize()
    for keys, images in copies:
        _check(keys, images.cpu().numpy(), png)
    # the rings' buffers, until every one waits for its copy; then fresh batches (unpinned: a copy from them is
    # made before .to() returns)
    assert all(pinned[:6]) and sum(pinned) >= 6, pinned


@needs_cuda
def test_gpu_collate_of_a_pinned_batch_is_the_cpu_reference(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "jpg"), (9, 7, 8, 6, 9, 7), size_px=64)
    dl = loader(stream(out.root, batch_size=4, resampled=True, seed=0, shuffle=4), num_workers=2)
    on_gpu, on_cpu = (
        GpuCollate("cuda", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4)),
        GpuCollate("cpu", mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.4)),
    )
    for step, batch in enumerate(dl):
        assert batch["image"].is_pinned()
        got = on_gpu(batch)["image"]
        want = on_cpu({**batch, "image": batch["image"].clone()})["image"]
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=1e-6)
        if step == 10:
            break
