"""Recorded stains that cannot normalise (issue 42): a zero, NaN or wrong-shaped matrix, a maximum concentration of
0, NaN or inf. A target is refused naming the field; a slide's record gets the reference H&E (as the build records a
slide it cannot fit) with one warning naming it, never a constant, white or NaN image or a torch error."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import shardmaker as sm
import torch

from wsishard.augment.stain import StainOptions, StainTable, StainTarget, macenko
from wsishard.augment.stainrecords import stain_problem
from wsishard.errors import OptionError
from wsishard.manifest import SlideRecord
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.decode import Metas

GOOD = ([[0.65, 0.18], [0.70, 0.85], [0.29, 0.49]], [2.1, 1.3])
REFERENCE = (StainTarget().matrix, StainTarget().max_conc)
NAN = math.nan
BROKEN = {  # slide id -> (matrix, max_conc) as a tampered slides.jsonl could hold them, and the field named
    "zeros": ([[0.0, 0.0]] * 3, GOOD[1], "matrix"),
    "nan-matrix": ([[NAN, NAN]] * 3, GOOD[1], "matrix"),
    "shape": ([[0.6, 0.2, 0.1], [0.7, 0.8, 0.1]], GOOD[1], "matrix"),
    "one-stain": ([[0.65, 0.65], [0.70, 0.70], [0.29, 0.29]], GOOD[1], "matrix"),
    "nan-conc": (GOOD[0], [NAN, 1.3], "max_conc"),
    "zero-conc": (GOOD[0], [0.0, 1.3], "max_conc"),
    "negative-conc": (GOOD[0], [2.1, -1.0], "max_conc"),
    "inf-conc": (GOOD[0], [math.inf, 1.3], "max_conc"),
}


def _record(slide_id: str, matrix: object, max_conc: object, source: str = "fitted") -> SlideRecord:
    stain = {"method": "macenko", "matrix": matrix, "max_conc": max_conc, "source": source, "reason": "", "pixels": 1}
    return SlideRecord(slide_id=slide_id, file=f"{slide_id}.svs", status="ok", stain=stain)


def _batch(slides: list[str], size: int = 16) -> dict:
    g = torch.Generator().manual_seed(0)
    image = torch.randint(40, 240, (len(slides), size, size, 3), dtype=torch.uint8, generator=g)
    meta = Metas(json.dumps({"slide_id": s}).encode() for s in slides)
    return {"image": image, "label": torch.full((len(slides),), -1), "meta": meta, "key": slides}


@pytest.mark.parametrize(
    ("matrix", "max_conc", "field"),
    [
        (REFERENCE[0], (math.inf, 1.0), "max_conc"),
        (REFERENCE[0], (NAN, 1.0), "max_conc"),
        (REFERENCE[0], (0.0, 1.0), "max_conc"),
        (((0.0, 0.0),) * 3, REFERENCE[1], "matrix"),
        (((NAN, 0.2),) * 3, REFERENCE[1], "matrix"),
        (((0.6, 0.2, 0.1),) * 3, REFERENCE[1], "matrix"),
        (((0.6, 0.6), (0.8, 0.8), (0.0, 0.0)), REFERENCE[1], "matrix"),
    ],
)
def test_a_target_that_cannot_normalise_is_refused_naming_the_field(
    matrix: object, max_conc: object, field: str
) -> None:
    with pytest.raises(OptionError) as info:
        StainTarget(matrix, max_conc)  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith(f"invalid StainTarget: {field} is ") and "\n" not in message
    assert isinstance(info.value, ValueError)


def test_the_checks_take_what_real_builds_record() -> None:
    assert stain_problem(*REFERENCE) is None and stain_problem(*GOOD) is None
    assert stain_problem(torch.tensor(GOOD[0]).numpy(), torch.tensor(GOOD[1]).numpy()) is None
    for matrix in ("abc", None, [[True, False]] * 3, [["0.6", "0.2"]] * 3, {"a": 1}, [[10**400, 0.2]] * 3):
        assert "matrix" in (stain_problem(matrix, GOOD[1]) or "")


def test_a_slide_whose_stain_cannot_normalise_gets_the_reference_with_one_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    records = [_record("good", *GOOD)] + [_record(s, m, c) for s, (m, c, _) in BROKEN.items()]
    records.append(SlideRecord(slide_id="not-a-dict", file="x.svs", status="ok", stain=["matrix"]))  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        table = StainTable(records)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "9 of 10 slides" in warnings[0] and "'zeros': matrix is" in warnings[0]
    assert set(table.unusable) == {*BROKEN, "not-a-dict"}
    for slide, (_, _, field) in BROKEN.items():
        assert table.unusable[slide].startswith(f"{field} is ")
    slides = ["good", *BROKEN, "not-a-dict"]
    batch = _batch(slides)
    out = GpuCollate("cpu", stain=StainOptions(normalize="macenko", slides=table))(batch)["image"]
    x = batch["image"].permute(0, 3, 1, 2).float() / 255
    as_reference = macenko(
        x, torch.tensor([REFERENCE[0]] * len(slides)), torch.tensor([REFERENCE[1]] * len(slides)), StainTarget()
    )
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out[1:], as_reference[1:], atol=1e-5, rtol=1e-5)
    assert (out.flatten(1).std(dim=1) > 0.05).all()  # no constant image
    good = macenko(x[:1], torch.tensor([GOOD[0]]), torch.tensor([GOOD[1]]), StainTarget())
    torch.testing.assert_close(out[:1], good, atol=1e-5, rtol=1e-5)


def test_a_slide_record_that_cannot_be_a_target_names_the_slide_and_field() -> None:
    with pytest.raises(ValueError, match=r"slide 'zeros'.* matrix is "):
        StainTarget.of_record(_record("zeros", *BROKEN["zeros"][:2]))
    with pytest.raises(ValueError, match=r"slide 'inf-conc'.* max_conc is "):
        StainTarget.of_record(_record("inf-conc", *BROKEN["inf-conc"][:2]))


def test_the_build_median_leaves_out_stains_that_cannot_normalise(caplog: pytest.LogCaptureFixture) -> None:
    records = [_record("good", *GOOD), *(_record(s, m, c) for s, (m, c, _) in BROKEN.items())]
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        target = StainTarget.of_build(records)
    assert target.max_conc == pytest.approx(GOOD[1])
    assert any("left out" in r.getMessage() and "'zeros'" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match="has a fitted stain that can normalise"):
        StainTarget.of_build(records[1:])


def test_from_build_reads_a_tampered_slides_file_into_a_usable_table(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4,), slides=2)
    slides = [
        SlideRecord(**{**vars(out.manifest.slides[0]), "stain": _record("x", *GOOD).stain}),
        SlideRecord(**{**vars(out.manifest.slides[1]), "stain": _record("x", *BROKEN["nan-matrix"][:2]).stain}),
    ]
    out.manifest = type(out.manifest)(**{**vars(out.manifest), "slides": slides})
    sm.write_manifest(out)
    table = StainTable.from_build(out.root)
    assert list(table.unusable) == ["slide1"] and torch.isfinite(table.pinv).all()
