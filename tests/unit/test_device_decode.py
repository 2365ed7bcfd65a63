"""loader(..., decode="device"): batches of JPEG bytes from the workers, decoded by GpuCollate on a CUDA GPU;
refused, with the reason, where there is no CUDA or no torchvision."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
import torch
from shardmaker import encode

from wsishard.errors import ShardError
from wsishard.streaming.decode import EncodedBatches, decode_mode


def _raw(i: int, size: int = 16, fmt: str = "jpg") -> dict:
    image = np.random.default_rng(i).integers(0, 255, (size, size, 3), dtype=np.uint8)
    meta = json.dumps({"slide_id": f"s{i % 2}", "label": i % 3}).encode()
    return {
        "key": f"s_x{i}_y0",
        "shard": "shard-000000.tar",
        "image_ext": fmt,
        "image": encode(image, fmt),
        "meta": meta,
        "label": None,
    }


def test_encoded_batches_carry_jpeg_bytes_labels_and_meta() -> None:
    raws = [_raw(i) for i in range(7)]
    batches = list(EncodedBatches(3, (16, 16), drop_last=False)(iter(raws)))
    assert [len(b["jpeg"]) for b in batches] == [3, 3, 1]
    assert batches[0]["jpeg"][1] == raws[1]["image"]
    assert batches[1]["label"].tolist() == [0, 1, 2]  # the .json's label
    assert batches[2]["meta"][0]["slide_id"] == "s0" and batches[2]["key"] == ["s_x6_y0"]
    assert len(list(EncodedBatches(3, (16, 16))(iter(raws)))) == 2  # drop_last


def test_a_sample_that_is_no_jpeg_of_the_patch_size_is_refused_or_skipped() -> None:
    raws = [_raw(0), _raw(1, fmt="png"), _raw(2, size=32), _raw(3)]
    with pytest.raises(ShardError, match="is no 16x16 JPEG"):
        list(EncodedBatches(2, (16, 16))(iter(raws)))
    kept = list(EncodedBatches(2, (16, 16), on_error="skip")(iter(raws)))
    assert [b["key"] for b in kept] == [["s_x0_y0", "s_x3_y0"]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_device_decode_is_refused_without_cuda() -> None:
    with pytest.raises(ValueError, match="decode='device' decodes JPEGs on a CUDA GPU, and torch sees none"):
        decode_mode("device")


def test_device_decode_is_refused_by_the_loader_without_cuda(stream_out) -> None:  # type: ignore[no-untyped-def]
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    ds = stream(stream_out.root, batch_size=4, seed=0)
    with pytest.raises(ValueError, match="CUDA GPU"):
        loader(ds, num_workers=0, decode="device")
    with pytest.raises(ValueError, match="decode must be 'worker' or 'device', got 'gpu'"):
        loader(ds, num_workers=0, decode="gpu")


def _both_decodes(root: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The first batch of ``root`` decoded in the loader and on the GPU, each through GpuCollate."""
    pytest.importorskip("torchvision")
    from wsishard.streaming.collate import GpuCollate
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    collate = GpuCollate("cuda")
    cpu = next(iter(loader(stream(root, batch_size=8, seed=0, resampled=False), num_workers=0)))
    gpu = next(iter(loader(stream(root, batch_size=8, seed=0, resampled=False), num_workers=0, decode="device")))
    assert "jpeg" in gpu and gpu["key"] == cpu["key"]
    return collate(cpu)["image"], collate(gpu)["image"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (and torchvision)")
def test_device_decode_of_full_chroma_jpegs_is_the_workers_decode(tmp_path: Path) -> None:
    """Without chroma subsampling nvjpeg and libjpeg-turbo give the same pixels (noise patches: any colour or
    position error shows)."""
    out = sm.make_output(str(tmp_path / "444"), (9, 7, 8), size_px=32, jpeg_subsampling=0)
    a, b = _both_decodes(out.root)
    assert torch.equal(a, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (and torchvision)")
def test_device_decode_of_a_real_build_is_near_the_workers_decode(tmp_path: Path) -> None:
    """A build's JPEGs are 4:2:0: nvjpeg upsamples their chroma without libjpeg-turbo's smoothing ("fancy
    upsampling"), so pixels differ a little on real tissue (1.9/255 on average on an H200), a lot on noise."""
    from cmu import cmu_path

    from wsishard import build

    build(cmu_path(), str(tmp_path / "out"), mpp=1.0, patch_size=128, jobs=1, qc=False)
    a, b = _both_decodes(str(tmp_path / "out"))
    assert (a - b).abs().mean() < 3 / 255
