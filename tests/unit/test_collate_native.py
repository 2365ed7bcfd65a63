"""GpuCollate's CPU pass in C (``lut_apply`` of wsishard/_native.c) against the plain torch reference (dihedral move,
then ``((x / 255) - mean) / std`` in float32, then the dtype): the same bits for every dihedral code, element size,
layout, odd and tiny sizes, and strided input; bad arguments refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from wsishard._native import lut_apply
from wsishard.streaming.collate import GpuCollate, dihedral

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn]


def _reference(
    image: torch.Tensor, codes: torch.Tensor | None, dtype: torch.dtype = torch.float32, channels_last: bool = False
) -> torch.Tensor:
    x = image.permute(0, 3, 1, 2)  # (b, 3, h, w) uint8
    if codes is not None:
        x = dihedral(x, codes)
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    y = (((x.float() / 255) - mean) / std).to(dtype)
    return y.contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


def _both(image: torch.Tensor, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch through the C pass, and through the reference with the codes a collate seeded alike draws."""
    got = GpuCollate("cpu", mean=MEAN, std=STD, seed=3, **options).images(image).clone()
    codes = GpuCollate("cpu", seed=3).codes(image.shape[0]) if options.get("augment") else None
    want = _reference(image, codes, options.get("dtype", torch.float32), options.get("channels_last", False))
    return got, want


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("hw", [(1, 1), (2, 2), (3, 2), (5, 5), (13, 17), (33, 33), (64, 40)])
def test_the_c_pass_gives_the_reference_bits(dtype: torch.dtype, channels_last: bool, hw: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(hw[0] * 100 + hw[1])
    image = torch.randint(0, 256, (24, *hw, 3), generator=g, dtype=torch.uint8)  # 24 samples: every code, thrice
    got, want = _both(image, dtype=dtype, augment=True, channels_last=channels_last)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == (24, 3, *hw)
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(_bits(got), _bits(want))


def test_every_code_moves_a_square_sample_as_the_reference_does(monkeypatch: Any) -> None:
    image = torch.arange(8 * 6 * 6 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).view(8, 6, 6, 3)
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=0)
    codes = torch.arange(8)
    monkeypatch.setattr(collate, "codes", lambda b: codes[:b])  # each of the 8 codes once
    got = collate.images(image).clone()
    assert torch.equal(got, _reference(image, codes))
    assert len({tuple(got[i].flatten().tolist()) for i in range(8)}) == 8  # eight different moves


def test_a_strided_batch_gives_the_same_bits() -> None:
    g = torch.Generator().manual_seed(1)
    wide = torch.randint(0, 256, (10, 16, 40, 3), generator=g, dtype=torch.uint8)
    image = wide[::2, :, 4:36]  # every other sample, a window of columns: not contiguous
    assert not image.is_contiguous()
    got, want = _both(image, augment=True)
    assert torch.equal(got, want)


def test_full_size_batches_give_the_same_bits() -> None:
    g = torch.Generator().manual_seed(2)
    image = torch.randint(0, 256, (16, 256, 256, 3), generator=g, dtype=torch.uint8)
    for channels_last in (False, True):
        got, want = _both(image, augment=True, channels_last=channels_last)
        assert torch.equal(got, want)


def _args(**change: Any) -> list[Any]:
    b, h, w = 2, 4, 4
    args = {
        "src": np.zeros((b, h, w, 3), np.uint8),
        "dst": np.zeros((b, 3, h, w), np.float32),
        "table": np.zeros((3, 256), np.float32),
        "codes": bytes(b),
        "b": b,
        "h": h,
        "w": w,
        "itemsize": 4,
        "channels_last": False,
    }
    return list({**args, **change}.values())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"dst": np.zeros((2, 3, 4, 3), np.float32)}, "sizes"),
        ({"table": np.zeros((3, 255), np.float32)}, "sizes"),
        ({"codes": bytes(3)}, "sizes"),
        ({"codes": bytes([0, 8])}, "dihedral code"),
        ({"itemsize": 3}, "itemsize"),
        ({"b": 0}, "positive"),
        ({"dst": np.zeros((2, 3, 4, 8), np.float32)[..., ::2]}, "contiguous|bytes-like"),
    ],
)
def test_bad_arguments_are_refused(change: dict, message: str) -> None:
    with pytest.raises((ValueError, BufferError, TypeError), match=message):
        lut_apply(*_args(**change))


def test_a_read_only_output_is_refused() -> None:
    dst = np.zeros((2, 3, 4, 4), np.float32)
    dst.flags.writeable = False
    with pytest.raises((ValueError, BufferError, TypeError)):
        lut_apply(*_args(dst=dst))
