"""MultiCrop: random-resized multi-crop views of every image, made by GpuCollate(crops=...) on the device."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import wsishard
from wsishard.augment.multicrop import MultiCrop, crop_boxes, crop_codes
from wsishard.augment.stain import StainOptions, StainTable
from wsishard.manifest import SlideRecord
from wsishard.streaming.collate import GpuCollate, dihedral
from wsishard.streaming.decode import Metas

A = [[0.65, 0.18], [0.70, 0.85], [0.29, 0.49]]
B = [[0.55, 0.25], [0.75, 0.80], [0.37, 0.55]]
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _images(b: int = 4, size: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, 256, (b, size, size, 3), dtype=np.uint8))


def _ramp(b: int = 3, size: int = 256) -> torch.Tensor:
    """Channel 0 is the row, channel 1 the column (0..255), channel 2 zero."""
    r = torch.arange(size, dtype=torch.uint8)
    img = torch.zeros((b, size, size, 3), dtype=torch.uint8)
    img[..., 0] = r.view(-1, 1)
    img[..., 1] = r.view(1, -1)
    return img


def _batch(image: torch.Tensor) -> dict:
    b = image.shape[0]
    return {"image": image, "label": torch.full((b,), -1), "meta": [{}] * b, "key": [f"k{i}" for i in range(b)]}


def test_the_collate_gives_global_and_local_views_of_the_asked_shapes_and_dtype() -> None:
    crops = wsishard.MultiCrop(local_crops=6)
    collate = GpuCollate("cpu", mean=MEAN, std=STD, dtype=torch.bfloat16, augment=True, seed=1, crops=crops)
    out = collate(_batch(_images(b=5)))
    assert out["global"].shape == (2, 5, 3, 224, 224) and out["global"].dtype == torch.bfloat16
    assert out["local"].shape == (6, 5, 3, 96, 96) and out["local"].dtype == torch.bfloat16
    assert "image" not in out and out["key"] == [f"k{i}" for i in range(5)]
    assert collate.batches == 1


def test_channels_last_lays_out_each_view_channels_last() -> None:
    collate = GpuCollate("cpu", channels_last=True, seed=1, crops=MultiCrop(local_crops=2))
    out = collate.views(_images(b=2))
    assert out["local"][0].is_contiguous(memory_format=torch.channels_last)
    assert out["global"][1].is_contiguous(memory_format=torch.channels_last)


def test_a_constant_image_gives_the_constant_normalised_value_in_every_crop() -> None:
    image = torch.empty((3, 200, 240, 3), dtype=torch.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 30, 140, 250
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=5, crops=MultiCrop(local_crops=4))
    out = collate.views(image)
    want = (torch.tensor([30, 140, 250]) / 255 - torch.tensor(MEAN)) / torch.tensor(STD)
    for name in ("global", "local"):
        got = out[name].permute(2, 0, 1, 3, 4).reshape(3, -1)  # channel by every pixel of every view
        assert torch.allclose(got, want.view(3, 1).expand_as(got), atol=1e-5), name


@pytest.mark.parametrize("kind", ["global", "local"])
def test_each_view_comes_from_a_region_of_the_scale_and_aspect_ranges(kind: str) -> None:
    crops = MultiCrop(local_crops=8)
    _, size, (low, high) = crops.kind(kind)
    out = GpuCollate("cpu", augment=True, seed=11, crops=crops).views(_ramp())[kind]  # (n, b, 3, s, s) in [0, 1]
    coords = out[:, :, :2] * 255  # (n, b, 2, s, s): each output pixel's (row, column) in the image
    lo, hi = coords.amin(dim=(-1, -2)), coords.amax(dim=(-1, -2))  # (n, b, 2)
    # pixel centres of the first and last output pixels lie half an output pixel inside the region
    extent = (hi - lo) * size / (size - 1)  # (n, b, 2) the region's height and width, to about a pixel
    area = extent[..., 0] * extent[..., 1] / 256**2
    aspect = extent[..., 1] / extent[..., 0]
    assert ((area > low * 0.93) & (area < high * 1.02)).all(), area
    assert ((aspect > 0.75 * 0.97) & (aspect < 4 / 3 * 1.03)).all(), aspect
    assert area.std() > 0.02  # regions of many sizes, not one


def test_the_boxes_follow_random_resized_crop_rules_exactly() -> None:
    boxes = crop_boxes(7, 3, 1, 50, 64, 256, 300, (0.05, 0.32))  # (n, b, 4)
    top, left, h, w = boxes[..., 0], boxes[..., 1], boxes[..., 2], boxes[..., 3]
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 256).all() and (left + w <= 300).all()
    area = h * w / (256 * 300)
    # rounding each side moves the area by at most a side's length
    assert (area >= 0.05 - (h + w + 1) / (256 * 300)).all() and (area <= 0.32 + (h + w + 1) / (256 * 300)).all()
    ratio = w / h
    assert (ratio >= 0.75 - 1 / h).all() and (ratio <= 4 / 3 + 1 / h).all()
    assert len({(int(a), int(b)) for a, b in zip(top.ravel(), left.ravel(), strict=True)}) > 3000  # placed anywhere


def test_the_centre_crop_is_the_fallback_when_no_try_fits() -> None:
    # a 4 x 400 image: no box of area >= 0.5 with aspect in (3/4, 4/3) fits; torchvision takes the centre crop of
    # width round(4 * 4/3) = 5
    boxes = crop_boxes(0, 0, 0, 3, 2, 4, 400, (0.5, 1.0))
    assert (boxes == np.array([0, (400 - 5) // 2, 4, 5])).all()


def _reference(image: torch.Tensor, collate: GpuCollate, batch: int) -> dict[str, torch.Tensor]:
    """A plain per-image, per-view loop: crop, interpolate(antialias=True), dihedral, normalise."""
    crops = collate.crops
    assert crops is not None
    x = image.permute(0, 3, 1, 2).float() / 255  # (b, 3, h, w)
    b, _, h, w = x.shape
    out = {}
    for kind, name in enumerate(("global", "local")):
        n, size, scale = crops.kind(name)
        boxes = crop_boxes(collate.seed, batch, kind, n, b, h, w, scale)
        codes = crop_codes(collate.seed, batch, kind, n, b)
        views = torch.empty((n, b, 3, size, size))
        for v in range(n):
            for i in range(b):
                t, left, ch, cw = (int(k) for k in boxes[v, i])
                crop = x[i : i + 1, :, t : t + ch, left : left + cw]
                r = F.interpolate(crop, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
                views[v, i] = dihedral(r, torch.tensor([int(codes[v, i])]))[0]
        out[name] = (views - collate.mean) / collate.std
    return out


def test_the_views_equal_a_plain_per_image_interpolate_reference() -> None:
    image = _images(b=3, size=160, seed=4)
    image = torch.cat([image[:, :, :120], image[:, :, :120]], dim=0)  # 6 images of 160 x 120
    crops = MultiCrop(global_size=96, local_crops=5, local_size=40)
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=9, crops=crops)
    collate.views(_images(b=6, size=8))  # batch 0: the reference below is of batch 1
    got = collate.views(image)
    want = _reference(image, collate, batch=1)
    for name in ("global", "local"):
        # the same weights, float32 products summed in another order: within 1e-4 of normalised units (std ~0.22)
        assert torch.allclose(got[name], want[name], atol=1e-4, rtol=0), (got[name] - want[name]).abs().max()


def test_the_same_seed_and_batch_give_the_same_views_and_a_resume_goes_on_alike() -> None:
    crops = MultiCrop(global_size=64, local_crops=3, local_size=32)
    a = GpuCollate("cpu", augment=True, seed=21, crops=crops)
    first, second = a.views(_ramp()), a.views(_ramp())
    b = GpuCollate("cpu", augment=True, seed=21, crops=crops)
    b.load_state_dict({"seed": 21, "batches": 1})
    again = b.views(_ramp())
    other = GpuCollate("cpu", augment=True, seed=22, crops=crops).views(_ramp())
    for name in ("global", "local"):
        assert torch.equal(again[name], second[name])
        assert not torch.equal(first[name], second[name])
        assert not torch.equal(first[name], other[name])


def test_views_of_the_same_image_and_the_same_view_of_different_images_differ() -> None:
    crops = MultiCrop(global_size=64, local_crops=4, local_size=32)
    out = GpuCollate("cpu", seed=3, crops=crops).views(_ramp(b=4))  # every image the same ramp
    for name in ("global", "local"):
        v = out[name].flatten(2)  # (n, b, pixels)
        n, b = v.shape[:2]
        distinct = {tuple(v[i, j, ::97].tolist()) for i in range(n) for j in range(b)}
        assert len(distinct) == n * b, name  # every (view, image) its own crop


def test_each_view_has_its_own_dihedral_transform() -> None:
    crops = MultiCrop(global_crops=4, global_size=48, local_crops=8, local_size=24)
    plain = GpuCollate("cpu", seed=13, crops=crops).views(_ramp(b=5))
    turned = GpuCollate("cpu", augment=True, seed=13, crops=crops).views(_ramp(b=5))
    for kind, name in enumerate(("global", "local")):
        n = crops.kind(name)[0]
        codes = torch.from_numpy(crop_codes(13, 0, kind, n, 5))  # (n, b)
        assert torch.equal(turned[name].flatten(0, 1), dihedral(plain[name].flatten(0, 1), codes.flatten()))
        assert all(len(set(codes[:, i].tolist())) > 1 for i in range(5))  # an image's views are turned unalike
        assert len(set(codes.flatten().tolist())) >= 6 and not torch.equal(turned[name], plain[name])


def test_each_view_gets_its_own_colour_jitter_and_keeps_its_own_image_colour() -> None:
    image = torch.empty((2, 64, 64, 3), dtype=torch.uint8)
    image[0], image[1] = torch.tensor([200, 60, 90]), torch.tensor([60, 200, 90])  # a red and a green image
    crops = MultiCrop(global_size=32, local_crops=6, local_size=16)
    collate = GpuCollate("cpu", seed=2, stain=StainOptions(brightness=0.3), crops=crops)
    out = collate.views(image)
    for name in ("global", "local"):
        mean = out[name].mean(dim=(-1, -2))  # (n, b, 3): each view's colour
        assert (mean[:, 0, 0] > mean[:, 0, 1]).all() and (mean[:, 1, 1] > mean[:, 1, 0]).all()
        brightness = mean[:, 0, 0] / (200 / 255)  # each view's factor (no clipping at this level)
        assert len(set(brightness.round(decimals=4).tolist())) == brightness.numel()
        assert ((brightness > 0.69) & (brightness < 1.31)).all()


def test_reinhard_normalises_each_image_once_before_cropping() -> None:
    image = _images(b=2, size=64, seed=8)
    crops = MultiCrop(global_crops=1, global_scale=(1.0, 1.0), global_size=64, local_crops=0)
    out = GpuCollate("cpu", seed=2, stain=StainOptions(normalize="reinhard"), crops=crops).views(image)
    whole = GpuCollate("cpu", seed=2, stain=StainOptions(normalize="reinhard")).images(image)
    assert out["global"].shape == (1, 2, 3, 64, 64) and out["local"].shape == (0, 2, 3, 96, 96)
    assert torch.allclose(out["global"][0], whole, atol=1e-4)  # a whole-image view: the whole image's colours


def test_macenko_normalises_each_image_by_its_own_slide_when_called_on_a_batch() -> None:
    stain = {"method": "macenko", "source": "fitted", "reason": "", "pixels": 1}
    records = [
        SlideRecord(slide_id="a", file="a.svs", status="ok", stain={**stain, "matrix": A, "max_conc": [2.1, 1.3]}),
        SlideRecord(slide_id="b", file="b.svs", status="ok", stain={**stain, "matrix": B, "max_conc": [1.6, 0.9]}),
    ]
    options = StainOptions(normalize="macenko", slides=StainTable(records))
    image = torch.from_numpy(np.random.default_rng(3).integers(40, 240, (4, 48, 48, 3), dtype=np.uint8))
    meta = Metas(json.dumps({"slide_id": "ab"[i % 2]}).encode() for i in range(4))
    batch = {**_batch(image), "meta": meta}
    crops = MultiCrop(global_crops=1, global_scale=(1.0, 1.0), global_size=48, local_crops=2, local_size=16)
    out = GpuCollate("cpu", seed=4, stain=options, crops=crops)(batch)
    whole = GpuCollate("cpu", seed=4, stain=options).images(image, ["a", "b", "a", "b"])
    assert torch.allclose(out["global"][0], whole, atol=1e-4)  # a whole-image view: its own slide's colours
    assert out["local"].shape == (2, 4, 3, 16, 16)
    with pytest.raises(ValueError, match="needs each sample's slide id"):
        GpuCollate("cpu", seed=4, stain=options, crops=crops).views(image)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("global_crops", 0),
        ("global_crops", 1.5),
        ("local_crops", -1),
        ("local_crops", True),
        ("global_size", 0),
        ("local_size", "96"),
        ("global_scale", (0.0, 1.0)),
        ("global_scale", (0.5, 0.4)),
        ("local_scale", (0.05, 1.2)),
        ("local_scale", (0.05, math.nan)),
        ("local_scale", (0.1,)),
    ],
)
def test_a_bad_field_is_one_value_error_naming_it(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"MultiCrop {field} must be .* got {re.escape(repr(value))}$"):
        MultiCrop(**{field: value})  # type: ignore[arg-type]


def test_views_refuse_a_batch_that_is_not_uint8_rgb() -> None:
    collate = GpuCollate("cpu", seed=1, crops=MultiCrop())
    with pytest.raises(ValueError, match="uint8 \\(b, h, w, 3\\)"):
        collate.views(torch.zeros((2, 32, 32, 3)))
