"""GpuCollate(stain=...): per-sample seeded parameters that a resumed run draws again, Macenko by each sample's
slide, and the options' errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from wsishard.augment.stain import StainOptions, StainTable, StainTarget, hed_jitter, macenko
from wsishard.manifest import SlideRecord
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.decode import Metas

MEAN, STD = (0.7, 0.6, 0.75), (0.15, 0.2, 0.1)
JITTER = StainOptions(hed_scale=0.2, hed_shift=0.02, brightness=0.1, contrast=0.1, saturation=0.1, hue=0.05)


def _batch(b: int = 8, size: int = 16, seed: int = 0, slides: tuple[str, ...] = ("a", "b")) -> dict:
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(40, 240, (b, size, size, 3), dtype=torch.uint8, generator=g)
    meta = Metas(json.dumps({"slide_id": slides[i % len(slides)]}).encode() for i in range(b))
    return {"image": image, "label": torch.full((b,), -1), "meta": meta, "key": [f"k{i}" for i in range(b)]}


def _record(slide_id: str, matrix: list[list[float]], max_conc: list[float]) -> SlideRecord:
    stain = {"method": "macenko", "matrix": matrix, "max_conc": max_conc, "source": "fitted", "reason": "", "pixels": 1}
    return SlideRecord(slide_id=slide_id, file=f"{slide_id}.svs", status="ok", stain=stain)


TABLE_RECORDS = [
    _record("a", [[0.65, 0.18], [0.70, 0.85], [0.29, 0.49]], [2.1, 1.3]),
    _record("b", [[0.55, 0.25], [0.75, 0.80], [0.37, 0.55]], [1.6, 0.9]),
    SlideRecord(slide_id="failed", file="failed.svs", status="failed"),  # no stain: not in the table
]


def test_the_same_seed_augments_the_same_and_batches_differ() -> None:
    batch = _batch()
    a = GpuCollate("cpu", mean=MEAN, std=STD, seed=3, stain=JITTER)
    b = GpuCollate("cpu", mean=MEAN, std=STD, seed=3, stain=JITTER)
    first = a(batch)["image"]
    assert torch.equal(first, b(batch)["image"])
    assert not torch.equal(first, a(batch)["image"])  # the next batch number: other parameters
    assert not torch.equal(first, GpuCollate("cpu", mean=MEAN, std=STD, seed=4, stain=JITTER)(batch)["image"])


def test_each_sample_has_its_own_parameters() -> None:
    one = _batch(b=1)
    same = {k: (v.expand(6, -1, -1, -1) if k == "image" else v) for k, v in one.items()}
    same["key"], same["label"] = [f"k{i}" for i in range(6)], torch.full((6,), -1)
    same["meta"] = Metas([json.dumps({"slide_id": "a"}).encode()] * 6)
    out = GpuCollate("cpu", seed=1, stain=JITTER)(same)["image"]  # six copies of one image
    assert len({tuple(out[i].mean(dim=(1, 2)).tolist()) for i in range(6)}) == 6


def test_a_resumed_collate_augments_as_the_uninterrupted_one() -> None:
    batches = [_batch(seed=i) for i in range(5)]
    straight = GpuCollate("cpu", seed=7, stain=JITTER, augment=True)
    expected = [straight(b)["image"] for b in batches]
    first = GpuCollate("cpu", seed=7, stain=JITTER, augment=True)
    for b in batches[:3]:
        first(b)
    state = json.loads(json.dumps(first.state_dict()))  # plain JSON, saved with a checkpoint
    assert state == {"seed": 7, "batches": 3}
    resumed = GpuCollate("cpu", seed=99, stain=JITTER, augment=True)  # another seed: the state's wins
    resumed.load_state_dict(state)
    for b, want in zip(batches[3:], expected[3:], strict=True):
        assert torch.equal(resumed(b)["image"], want)  # the same stain jitter and the same flips/rotations


def test_dihedral_codes_resume_without_stain_too() -> None:
    image = _batch(b=32, seed=1)["image"]
    straight = GpuCollate("cpu", augment=True, seed=2)
    expected = [straight.images(image) for _ in range(3)]
    resumed = GpuCollate("cpu", augment=True, seed=2)
    resumed.load_state_dict({"seed": 2, "batches": 2})
    assert torch.equal(resumed.images(image), expected[2])
    assert not torch.equal(expected[1], expected[2])


def test_the_stain_runs_before_mean_and_std_in_float32() -> None:
    batch = _batch()
    out = GpuCollate("cpu", mean=MEAN, std=STD, seed=5, stain=StainOptions(hed_scale=0.3))(batch)["image"]
    u = np.random.default_rng((5, 0, 0x4ED)).uniform(-1.0, 1.0, (8, 2, 3))  # the collate's draw for batch 0
    x = batch["image"].permute(0, 3, 1, 2).float() / 255
    ref = hed_jitter(x, torch.from_numpy(1 + 0.3 * u[:, 0]).float(), torch.zeros(8, 3))
    ref = (ref - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_macenko_uses_each_samples_slide_matrix() -> None:
    batch = _batch(slides=("a", "b", "b", "a"))
    table = StainTable(TABLE_RECORDS)
    out = GpuCollate("cpu", stain=StainOptions(normalize="macenko", slides=table))(batch)["image"]
    x = batch["image"].permute(0, 3, 1, 2).float() / 255
    rows = {"a": 0, "b": 1}
    for i in range(8):
        r = rows[["a", "b", "b", "a"][i % 4]]
        rec = TABLE_RECORDS[r].stain
        one = macenko(x[i : i + 1], torch.tensor([rec["matrix"]]), torch.tensor([rec["max_conc"]]), StainTarget())
        torch.testing.assert_close(out[i : i + 1], one, atol=1e-5, rtol=1e-5)


def test_a_sample_of_an_unknown_slide_is_a_clear_error() -> None:
    collate = GpuCollate("cpu", stain=StainOptions(normalize="macenko", slides=StainTable(TABLE_RECORDS)))
    with pytest.raises(KeyError, match="slide 'failed' has no stain matrix"):
        collate(_batch(slides=("a", "failed")))
    with pytest.raises(ValueError, match="needs each sample's slide id"):
        collate.images(_batch()["image"])


def test_targets_of_a_record_and_of_a_build() -> None:
    assert StainTarget.of_record(TABLE_RECORDS[0]).max_conc == (2.1, 1.3)
    median = StainTarget.of_build(TABLE_RECORDS)
    np.testing.assert_allclose(np.linalg.norm(np.array(median.matrix), axis=0), 1.0)
    np.testing.assert_allclose(median.max_conc, (1.85, 1.1))
    with pytest.raises(ValueError, match="no stain in its record"):
        StainTarget.of_record(TABLE_RECORDS[2])
    with pytest.raises(ValueError, match="none of the 1 slides has a fitted stain"):
        StainTarget.of_build(TABLE_RECORDS[2:])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"normalize": "vahadane"}, "normalize must be"),
        ({"normalize": "macenko"}, "needs slides="),
        ({"hed_scale": 1.5}, "hed_scale must be in"),
        ({"brightness": -0.1}, "brightness must be in"),
        ({"hue": 0.7}, "hue must be in"),
        ({"reinhard_target": ((50, 0, 0), (10, 0, 5))}, "3 positive stds"),
    ],
)
def test_bad_options_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StainOptions(**kwargs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu() -> None:
    batch = _batch(slides=("a", "b"))
    options = StainOptions(normalize="macenko", slides=StainTable(TABLE_RECORDS), hed_scale=0.2, hue=0.05)
    cpu = GpuCollate("cpu", mean=MEAN, std=STD, seed=2, stain=options)(batch)["image"]
    gpu = GpuCollate("cuda", mean=MEAN, std=STD, seed=2, stain=options)(batch)["image"]
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-4, rtol=1e-4)
