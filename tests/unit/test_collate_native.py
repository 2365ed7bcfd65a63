"""GpuCollate's CPU pass in C (wsishard/streaming/_lut.c) against the OpenCV pass it replaces: the same bits for
every dihedral code, element size, layout, odd and tiny sizes, and strided input; bad arguments refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from wsishard.streaming import collate as collate_module
from wsishard.streaming.collate import GpuCollate

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.float8_e4m3fn]


def test_the_c_pass_is_built() -> None:
    """The package builds it (``pip install -e .`` with a C compiler): CI must test the C path."""
    assert collate_module._lut_apply is not None, ("wsishard.streaming._lut was not built (no C compiler or Python "
                                                   "headers when pip installed the package?): GpuCollate on a CPU "
                                                   "gives the same bits without it, slower")  # fmt: skip


def _both(image: torch.Tensor, monkeypatch: Any, **options: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The same batch through the C pass and through the OpenCV pass, each with a collate seeded alike."""
    got = GpuCollate("cpu", mean=MEAN, std=STD, seed=3, **options).images(image).clone()
    with monkeypatch.context() as m:
        m.setattr(collate_module, "_lut_apply", None)
        want = GpuCollate("cpu", mean=MEAN, std=STD, seed=3, **options).images(image).clone()
    return got, want


def _bits(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous().view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("hw", [(1, 1), (2, 2), (3, 2), (5, 5), (13, 17), (33, 33), (64, 40)])
def test_the_c_pass_gives_the_opencv_pass_bits(monkeypatch: Any, dtype: torch.dtype, channels_last: bool,
                                               hw: tuple[int, int]) -> None:  # fmt: skip
    g = torch.Generator().manual_seed(hw[0] * 100 + hw[1])
    image = torch.randint(0, 256, (24, *hw, 3), generator=g, dtype=torch.uint8)  # 24 samples: every code, thrice
    got, want = _both(image, monkeypatch, dtype=dtype, augment=True, channels_last=channels_last)
    assert got.dtype == want.dtype == dtype and got.shape == want.shape == (24, 3, *hw)
    assert got.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert torch.equal(_bits(got), _bits(want))


def test_every_code_moves_a_square_sample_as_the_opencv_pass_does(monkeypatch: Any) -> None:
    image = torch.arange(8 * 6 * 6 * 3, dtype=torch.int64).remainder(251).to(torch.uint8).view(8, 6, 6, 3)
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=0)
    codes = torch.arange(8)
    monkeypatch.setattr(collate, "codes", lambda b: codes[:b])  # each of the 8 codes once
    got = collate.images(image).clone()
    monkeypatch.setattr(collate_module, "_lut_apply", None)
    assert torch.equal(got, collate.images(image))
    assert len({tuple(got[i].flatten().tolist()) for i in range(8)}) == 8  # eight different moves


def test_a_strided_batch_gives_the_same_bits(monkeypatch: Any) -> None:
    g = torch.Generator().manual_seed(1)
    wide = torch.randint(0, 256, (10, 16, 40, 3), generator=g, dtype=torch.uint8)
    image = wide[::2, :, 4:36]  # every other sample, a window of columns: not contiguous
    assert not image.is_contiguous()
    got, want = _both(image, monkeypatch, augment=True)
    assert torch.equal(got, want)


def test_full_size_batches_give_the_same_bits(monkeypatch: Any) -> None:
    g = torch.Generator().manual_seed(2)
    image = torch.randint(0, 256, (16, 256, 256, 3), generator=g, dtype=torch.uint8)
    for channels_last in (False, True):
        got, want = _both(image, monkeypatch, augment=True, channels_last=channels_last)
        assert torch.equal(got, want)


def _args(**change: Any) -> list[Any]:
    b, h, w = 2, 4, 4
    args = {"src": np.zeros((b, h, w, 3), np.uint8), "dst": np.zeros((b, 3, h, w), np.float32),
            "table": np.zeros((3, 256), np.float32), "codes": bytes(b), "b": b, "h": h, "w": w, "itemsize": 4,
            "channels_last": False}  # fmt: skip
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
    if collate_module._lut_apply is None:
        pytest.skip("the C pass is not built")
    with pytest.raises((ValueError, BufferError, TypeError), match=message):
        collate_module._lut_apply(*_args(**change))


def test_a_read_only_output_is_refused() -> None:
    if collate_module._lut_apply is None:
        pytest.skip("the C pass is not built")
    dst = np.zeros((2, 3, 4, 4), np.float32)
    dst.flags.writeable = False
    with pytest.raises((ValueError, BufferError, TypeError)):
        collate_module._lut_apply(*_args(dst=dst))
