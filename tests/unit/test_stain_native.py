"""The stain operations on a CPU device in one C pass (``stain_apply`` of wsishard/_native.c, through
wsishard/augment/stain_cpu.py) against the torch path of GpuCollate(stain=...) (augment/stain.py) and the numpy
references, on real tissue: within float32 rounding (TOL, in [0, 1] units: 0.0026 of a grey level; measured
about 3e-6), for every dihedral code and both layouts, with the torch path's seeded per-sample parameters."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
import torch
from cmu import cmu_rgb
from skimage import color
from stainref import jitter_reference, torchstain_normalize

from wsishard._native import stain_apply
from wsishard.augment import stain as stain_ops
from wsishard.augment.stain import StainOptions, StainTable, StainTarget
from wsishard.augment.stain_cpu import fusable, stain_pass
from wsishard.manifest import SlideRecord
from wsishard.streaming.collate import GpuCollate, dihedral
from wsishard.streaming.decode import Metas

TOL = 1e-5  # in [0, 1] units, after the stain and before mean / std
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
REFERENCE = np.array(StainTarget().matrix)


def _records(n: int = 4) -> list[SlideRecord]:
    rng = np.random.default_rng(0)
    records = []
    for i in range(n):
        m = np.abs(REFERENCE + rng.normal(0, 0.05, REFERENCE.shape))
        m /= np.linalg.norm(m, axis=0)
        stain = {
            "method": "macenko",
            "matrix": m.tolist(),
            "max_conc": rng.uniform(0.8, 2.2, 2).tolist(),
            "source": "fitted",
            "reason": "",
            "pixels": 1,
        }
        records.append(SlideRecord(slide_id=f"s{i}", file=f"s{i}.svs", status="ok", stain=stain))
    return records


TABLE = StainTable(_records())
CONFIGS = {
    "macenko": StainOptions(normalize="macenko", slides=TABLE),
    "hed": StainOptions(hed_scale=0.2, hed_shift=0.02),
    "colour": StainOptions(brightness=0.3, contrast=0.3, saturation=0.3),
    "all": StainOptions(
        normalize="macenko", slides=TABLE, hed_scale=0.2, hed_shift=0.02, brightness=0.2, contrast=0.2, saturation=0.2
    ),
}


@pytest.fixture(scope="module")
def tissue() -> torch.Tensor:
    """(16, 64, 64, 3) uint8 patches of real H&E (CMU-1), tissue and glass."""
    img = cmu_rgb()
    rng = np.random.default_rng(1)
    ys, xs = rng.integers(0, img.shape[0] - 64, 16), rng.integers(0, img.shape[1] - 64, 16)
    return torch.from_numpy(np.stack([img[y : y + 64, x : x + 64] for y, x in zip(ys, xs, strict=True)]))


def _batch(image: torch.Tensor) -> dict[str, Any]:
    b = image.shape[0]
    meta = Metas(json.dumps({"slide_id": f"s{i % 4}"}).encode() for i in range(b))
    return {"image": image, "label": torch.full((b,), -1), "meta": meta, "key": [str(i) for i in range(b)]}


def _torch_path(image: torch.Tensor, options: StainOptions, seed: int, batch: int, augment: bool) -> torch.Tensor:
    """What the torch path of a collate seeded ``seed`` gives batch number ``batch``, in [0, 1] units."""
    b = image.shape[0]
    x = image.permute(0, 3, 1, 2)
    if augment:
        codes = np.random.default_rng((seed, batch, 0xD1)).integers(0, 8, b)  # the collate's dihedral draw
        x = dihedral(x, torch.from_numpy(codes))
    rows = TABLE.rows([f"s{i % 4}" for i in range(b)]) if options.normalize else None
    return stain_ops.apply(x.contiguous().float() / 255, options, seed=seed, batch=batch, slide_rows=rows)


def _unit(x: torch.Tensor) -> torch.Tensor:
    """A collate's output back in [0, 1] units."""
    return x.float() * torch.tensor(STD).view(1, 3, 1, 1) + torch.tensor(MEAN).view(1, 3, 1, 1)


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_c_pass_is_the_torch_path(tissue: torch.Tensor, name: str, channels_last: bool) -> None:
    options = CONFIGS[name]
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=3, stain=options, channels_last=channels_last)
    for n in range(3):  # three batches: each its own parameters, every dihedral code among them
        got = collate(_batch(tissue))["image"]
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        assert got.dtype == torch.float32 and got.is_contiguous(memory_format=fmt)
        want = _torch_path(tissue, options, seed=3, batch=n, augment=True)
        assert (_unit(got) - want).abs().max().item() < TOL


def test_the_collate_runs_the_c_pass_where_it_covers_the_options(tissue: torch.Tensor) -> None:
    batch = _batch(tissue)
    for options in CONFIGS.values():
        assert fusable(options)
        got = GpuCollate("cpu", mean=MEAN, std=STD, seed=5, stain=options)(batch)["image"]
        out = torch.empty(tissue.shape[0], 3, 64, 64)
        rows = TABLE.rows([f"s{i % 4}" for i in range(tissue.shape[0])])
        stain_pass(
            tissue,
            out,
            options,
            seed=5,
            batch=0,
            slide_rows=rows,
            codes=[0] * tissue.shape[0],
            mean=MEAN,
            std=STD,
            channels_last=False,
        )
        assert torch.equal(got, out)
    for options in (StainOptions(normalize="reinhard"), StainOptions(brightness=0.1, hue=0.02)):
        assert not fusable(options)  # CIELAB statistics and hue: the torch path


@pytest.mark.parametrize("cl", [False, True])  # channels_last
def test_odd_sizes_and_a_pixel(tissue: torch.Tensor, cl: bool) -> None:
    options = CONFIGS["all"]
    # not square: no transpose; square: every code. Samples of 3 h w floats: the interleaved output's runs of 64
    # pixels end in a part run and start unaligned
    for h, w in ((1, 1), (3, 7), (13, 5), (9, 9)):
        image = tissue[:, :h, :w].contiguous()
        collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=2, stain=options, channels_last=cl)
        got = collate(_batch(image))["image"]
        want = _torch_path(image, options, seed=2, batch=0, augment=True)
        assert got.shape == (16, 3, h, w) and (_unit(got) - want).abs().max().item() < TOL


def test_other_dtypes_are_the_float32_output_rounded(tissue: torch.Tensor) -> None:
    options = CONFIGS["all"]
    f32 = GpuCollate("cpu", mean=MEAN, std=STD, seed=4, stain=options)(_batch(tissue))["image"]
    for dtype in (torch.bfloat16, torch.float16):
        got = GpuCollate("cpu", mean=MEAN, std=STD, seed=4, stain=options, dtype=dtype)(_batch(tissue))["image"]
        assert got.dtype == dtype and torch.equal(got, f32.to(dtype))


def test_a_resumed_collate_augments_as_the_uninterrupted_one(tissue: torch.Tensor) -> None:
    batches = [_batch(tissue.roll(i, dims=0)) for i in range(4)]
    straight = GpuCollate("cpu", seed=7, stain=CONFIGS["all"], augment=True)
    expected = [straight(b)["image"].clone() for b in batches]
    resumed = GpuCollate("cpu", seed=99, stain=CONFIGS["all"], augment=True)
    resumed.load_state_dict({"seed": 7, "batches": 2})
    for b, want in zip(batches[2:], expected[2:], strict=True):
        assert torch.equal(resumed(b)["image"], want)
    assert not torch.equal(expected[0], expected[1])


def _alone(tissue: torch.Tensor, options: StainOptions, rows: list[int] | None = None) -> np.ndarray:
    """The C pass on the tiles, mean 0 and std 1, no dihedral move: (b, h, w, 3) float64 in [0, 1]."""
    b, h, w, _ = tissue.shape
    out = torch.empty(b, 3, h, w)
    slide_rows = torch.tensor(rows) if rows is not None else None
    stain_pass(
        tissue,
        out,
        options,
        seed=0,
        batch=0,
        slide_rows=slide_rows,
        codes=[0] * b,
        mean=(0, 0, 0),
        std=(1, 1, 1),
        channels_last=False,
    )
    return out.permute(0, 2, 3, 1).double().numpy()


def test_macenko_is_torchstains_normalization(tissue: torch.Tensor) -> None:
    rows = [i % 4 for i in range(tissue.shape[0])]
    out = _alone(tissue, CONFIGS["macenko"], rows) * 255
    for i, tile in enumerate(tissue.numpy()):
        rec = TABLE.matrix[rows[i]].double().numpy(), TABLE.max_conc[rows[i]].double().numpy()
        ref = torchstain_normalize(tile, rec[0], rec[1], StainTarget())
        np.testing.assert_allclose(out[i], ref, atol=0.05)  # float32 against float64, in 0..255 units


def test_hed_jitter_and_colour_are_scikit_image_and_torchvision(tissue: torch.Tensor) -> None:
    b = tissue.shape[0]
    options = StainOptions(hed_scale=0.2, hed_shift=0.02)
    scale, shift = stain_ops.hed_draws(options, 0, 0, b)
    out = _alone(tissue, options)
    for i, tile in enumerate(tissue.numpy()):
        hed = (np.log(np.maximum(tile / 255.0, 1e-6)) / np.log(1e-6)) @ color.hed_from_rgb  # unclipped rgb2hed
        np.testing.assert_allclose(out[i], color.hed2rgb(hed * scale[i] + shift[i]), atol=TOL)
    options = StainOptions(brightness=0.3, contrast=0.3, saturation=0.3)
    factors = stain_ops.colour_draws(options, 0, 0, b)
    out = _alone(tissue, options)
    for i, tile in enumerate(tissue.numpy()):
        np.testing.assert_allclose(out[i], jitter_reference(tile / 255.0, factors[i]), atol=TOL)


def _args(**change: Any) -> list[Any]:
    b, h, w = 2, 4, 4
    args = {
        "src": np.zeros((b, h, w, 3), np.uint8),
        "dst": np.zeros((b, 3, h, w), np.float32),
        "table": np.zeros(256, np.float32),
        "params": np.zeros((b, 27), np.float32),
        "codes": bytes(b),
        "norm": np.ones(6, np.float32),
        "b": b,
        "h": h,
        "w": w,
        "logs": True,
        "lo": -87.0,
        "channels_last": False,
    }
    args.update(change)
    return list(args.values())


@pytest.mark.parametrize(
    "change",
    [
        {"h": 5},
        {"dst": np.zeros((2, 3, 4, 4), np.float64)},
        {"table": np.zeros(255, np.float32)},
        {"params": np.zeros((2, 26), np.float32)},
        {"codes": bytes(3)},
        {"norm": np.ones(5, np.float32)},
    ],
)
def test_bad_arguments_are_refused(change: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="stain_apply: buffers not of the sizes"):
        stain_apply(*_args(**change))


def test_a_bad_code_is_refused_and_good_arguments_pass() -> None:
    stain_apply(*_args())
    with pytest.raises(ValueError, match="dihedral code outside"):
        stain_apply(*_args(codes=bytes([0, 8])))
