"""GPU-side collate numerics, checked on CPU against a plain reference."""

from __future__ import annotations

import pytest
import torch

from wsishard.streaming.collate import GpuCollate, dihedral

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _batch(b: int = 16, h: int = 8, w: int = 8, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(0, 256, (b, h, w, 3), generator=g, dtype=torch.uint8)  # (b, h, w, 3)
    return {
        "image": image,
        "label": torch.arange(b),
        "meta": [{"i": i} for i in range(b)],
        "key": [f"k{i}" for i in range(b)],
    }


def _reference(image: torch.Tensor) -> torch.Tensor:
    x = image.permute(0, 3, 1, 2).float()  # (b, 3, h, w)
    return ((x / 255) - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)


def _variants(img: torch.Tensor) -> list[torch.Tensor]:
    """The 8 dihedral transforms of a (c, h, w) image, built from rot90 and flip."""
    rots = [torch.rot90(img, k, dims=(-2, -1)) for k in range(4)]
    return rots + [r.flip(-1) for r in rots]


def test_matches_the_plain_cpu_reference_exactly() -> None:
    batch = _batch()
    out = GpuCollate("cpu", mean=MEAN, std=STD)(batch)
    assert out["image"].shape == (16, 3, 8, 8) and out["image"].dtype == torch.float32
    assert out["image"].is_contiguous()
    assert torch.equal(out["image"], _reference(batch["image"]))
    assert torch.equal(out["label"], batch["label"])
    assert out["meta"] is batch["meta"] and out["key"] is batch["key"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_output_is_the_rounded_reference(dtype: torch.dtype) -> None:
    batch = _batch()
    out = GpuCollate("cpu", mean=MEAN, std=STD, dtype=dtype).images(batch["image"])
    assert out.dtype == dtype
    assert torch.equal(out, _reference(batch["image"]).to(dtype))


def test_channels_last_has_the_same_values() -> None:
    batch = _batch()
    out = GpuCollate("cpu", mean=MEAN, std=STD, channels_last=True).images(batch["image"])
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, _reference(batch["image"]))


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("augment", [False, True])
def test_a_strided_input_gives_the_same_values_in_the_asked_layout(channels_last: bool, augment: bool) -> None:
    g = torch.Generator().manual_seed(2)
    image = torch.randint(0, 256, (16, 3, 8, 8), generator=g, dtype=torch.uint8).permute(0, 2, 3, 1)  # a view
    assert not image.is_contiguous()
    out = GpuCollate("cpu", mean=MEAN, std=STD, channels_last=channels_last, augment=augment, seed=4).images(image)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    assert out.is_contiguous(memory_format=fmt)
    same = GpuCollate("cpu", mean=MEAN, std=STD, augment=augment, seed=4).images(image.contiguous())
    assert torch.equal(out, same)
    if not augment:
        assert torch.equal(out, _reference(image))


def test_dihedral_codes_give_the_eight_distinct_symmetries() -> None:
    img = torch.arange(3 * 4 * 4).view(1, 3, 4, 4)
    outs = [dihedral(img, torch.tensor([c]))[0] for c in range(8)]
    assert len({tuple(o.flatten().tolist()) for o in outs}) == 8
    assert {tuple(o.flatten().tolist()) for o in outs} == {tuple(v.flatten().tolist()) for v in _variants(img[0])}


def test_augment_applies_exactly_one_dihedral_transform_per_sample() -> None:
    batch = _batch(b=64, seed=1)
    collate = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=3)
    out = collate.images(batch["image"])
    ref = _reference(batch["image"])
    used = set()
    for i in range(64):
        matches = [k for k, v in enumerate(_variants(ref[i])) if torch.equal(out[i], v)]
        assert len(matches) == 1
        used.add(matches[0])
    assert used == set(range(8))  # all eight show up in a batch of 64 (fixed seed)


def test_augment_is_reproducible_with_a_seed_and_varies_between_batches() -> None:
    batch = _batch(b=32)
    a = GpuCollate("cpu", augment=True, seed=5)
    b = GpuCollate("cpu", augment=True, seed=5)
    first = a.images(batch["image"])
    assert torch.equal(first, b.images(batch["image"]))
    assert not torch.equal(first, a.images(batch["image"]))  # the next batch draws new codes


def test_non_square_images_get_flips_only() -> None:
    batch = _batch(b=32, h=4, w=6)
    out = GpuCollate("cpu", augment=True, seed=0).images(batch["image"])
    ref = GpuCollate("cpu").images(batch["image"])
    assert out.shape == (32, 3, 4, 6)
    for i in range(32):
        flips = [ref[i], ref[i].flip(-1), ref[i].flip(-2), ref[i].flip(-1).flip(-2)]
        assert any(torch.equal(out[i], f) for f in flips)


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [({"mean": (0.5, 0.5)}, "mean"), ({"std": (1.0, 0.0, 1.0)}, "0.0"), ({"dtype": torch.int32}, "int32")],
)
def test_bad_options_raise_value_error(kwargs: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        GpuCollate("cpu", **kwargs)


def test_wrong_input_is_rejected() -> None:
    collate = GpuCollate("cpu")
    with pytest.raises(ValueError, match="uint8"):
        collate.images(torch.zeros(2, 4, 4, 3))
    with pytest.raises(ValueError, match="uint8"):
        collate.images(torch.zeros(2, 3, 4, 4, dtype=torch.uint8))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = _batch()
    out = GpuCollate("cuda", mean=MEAN, std=STD)(batch)
    assert out["image"].device.type == "cuda"
    torch.testing.assert_close(out["image"].cpu(), _reference(batch["image"]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_cpu_augment_is_dihedral_of_the_reference_with_the_drawn_codes(dtype: torch.dtype, channels_last: bool) -> None:
    batch = _batch(b=24, h=6, w=6, seed=5)
    out = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=9, dtype=dtype, channels_last=channels_last)
    codes = GpuCollate("cpu", augment=True, seed=9).codes(24)  # the same generator, the same draw
    expected = dihedral(_reference(batch["image"]), codes).to(dtype)
    assert torch.equal(out.images(batch["image"]), expected)


def test_cpu_output_buffers_are_reused_only_once_let_go() -> None:
    collate = GpuCollate("cpu", mean=MEAN, std=STD)
    a, b = _batch(seed=1)["image"], _batch(seed=2)["image"]
    first = collate.images(a)
    view = first[3:]
    address = first.untyped_storage().data_ptr()
    del first
    second = collate.images(b)  # the first output is still seen through a view: a buffer of its own
    assert second.untyped_storage().data_ptr() != address
    assert torch.equal(view, _reference(a)[3:]) and torch.equal(second, _reference(b))
    del view
    third = collate.images(a)
    assert third.untyped_storage().data_ptr() == address  # let go: filled again
    assert torch.equal(third, _reference(a)) and torch.equal(second, _reference(b))


@pytest.mark.parametrize("channels_last", [False, True])
def test_full_size_patches_through_the_tables_equal_the_reference(channels_last: bool) -> None:
    # 256 px patches take OpenCV's vectorised paths (split, transpose, flip, table look-up) that 8 px ones do not
    image = _batch(b=8, h=256, w=256, seed=7)["image"]
    out = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=1, channels_last=channels_last).images(image)
    codes = GpuCollate("cpu", augment=True, seed=1).codes(8)
    assert sorted(set(codes.tolist())) != [0]  # at least one sample is moved
    assert torch.equal(out, dihedral(_reference(image), codes))


def test_float64_output_is_the_float32_reference_widened() -> None:
    image = _batch()["image"]
    out = GpuCollate("cpu", mean=MEAN, std=STD, dtype=torch.float64).images(image)
    assert out.dtype == torch.float64 and torch.equal(out, _reference(image).double())


def test_the_cpu_path_leaves_opencv_threads_as_it_found_them() -> None:
    import cv2

    before = cv2.getNumThreads()
    cv2.setNumThreads(2)
    try:
        GpuCollate("cpu", augment=True, seed=0).images(_batch()["image"])
        assert cv2.getNumThreads() == 2
    finally:
        cv2.setNumThreads(before)


def test_one_byte_float_output_is_the_rounded_reference() -> None:
    image = _batch()["image"]
    out = GpuCollate("cpu", mean=MEAN, std=STD, dtype=torch.float8_e4m3fn).images(image)
    assert out.dtype == torch.float8_e4m3fn
    assert torch.equal(out.view(torch.uint8), _reference(image).to(torch.float8_e4m3fn).view(torch.uint8))


def test_a_collate_whose_dtype_or_mean_changes_writes_the_new_values() -> None:
    image = _batch()["image"]
    collate = GpuCollate("cpu", mean=MEAN, std=STD)
    collate.images(image)  # tables made for float32 and MEAN
    collate.dtype = torch.float16
    assert torch.equal(collate.images(image), _reference(image).to(torch.float16))
    collate.dtype, collate.mean = torch.float32, torch.zeros(1, 3, 1, 1)
    expected = image.permute(0, 3, 1, 2).float() / 255 / torch.tensor(STD).view(1, 3, 1, 1)
    assert torch.equal(collate.images(image), expected)


def test_a_cpu_output_is_valid_until_the_next_call_and_its_buffer_then_taken_in_turn() -> None:
    collate = GpuCollate("cpu", mean=MEAN, std=STD)
    batches = [torch.full((2, 8, 8, 3), v, dtype=torch.uint8) for v in (10, 20, 30)]
    outs = [collate.images(b) for b in batches]
    ptrs = [o.untyped_storage().data_ptr() for o in outs]
    assert ptrs[0] != ptrs[1] and ptrs[2] == ptrs[0]  # two buffers in turn
    assert torch.equal(outs[1], _reference(batches[1]))  # the one before the last call: still intact


def test_without_reuse_every_cpu_output_is_memory_of_its_own() -> None:
    collate = GpuCollate("cpu", mean=MEAN, std=STD, reuse_output=False)
    batches = [torch.full((2, 8, 8, 3), v, dtype=torch.uint8) for v in (10, 20, 30)]
    outs = [collate.images(b) for b in batches]
    assert len({o.untyped_storage().data_ptr() for o in outs}) == 3
    assert all(torch.equal(o, _reference(b)) for o, b in zip(outs, batches, strict=True))
