"""Labels end to end: what a ``--labels`` table may hold, what is reported about it, and what slides without a
label become (no ``.cls``, label -1 in the stream)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from buildtools import read_output, usage_error

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.orchestrate import build
from wsishard.manifest import Manifest
from wsishard.report import summary
from wsishard.testing.synthetic import make_slides


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``slide-000.svs``, ``slide-001.tif``, ``slide-002.svs``: 2048x2048 px. Read-only."""
    folder = tmp_path_factory.mktemp("label-slides")
    make_slides(folder, 3, seed=4, width=2048, height=2048)
    return folder


@pytest.mark.parametrize(
    ("table", "message"),
    [
        (
            "slide-000,1\nslide-001,tumor\nslide-002,2\n",
            "integer labels mixed with class names (use one or the other): line 2: slide-001,tumor",
        ),  # was silently renumbered 0, 2, 1
        ("slide,label\nslide-000,1\nslide-001,0\nslide-000,1\n", "'slide-000' is listed twice (lines 2 and 4)"),
        (
            "slide-000,1\nslide-001,99999999999999999999999\n",
            "label 99999999999999999999999 of 'slide-001' (line 2) is not in 0..2**63-1 "
            "(int64; negative labels are kept for unlabelled samples)",
        ),  # it built, then broke streams
    ],
)
def test_a_bad_label_table_is_a_usage_error_before_any_work(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], table: str, message: str
) -> None:
    (tmp_path / "labels.csv").write_text(table)
    out = tmp_path / "out"
    err = usage_error(capsys, str(slides), "-o", str(out), "--labels", str(tmp_path / "labels.csv"))
    assert err.startswith("wsishard build: error: argument --labels: --labels ") and err.endswith(message)
    assert not out.exists()


def test_require_labels_refuses_slides_without_one_before_any_work(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "labels.csv").write_text("slide-000,1\nslide-001,0\n")
    out = tmp_path / "out"
    err = usage_error(capsys, str(slides), "-o", str(out), "--labels", str(tmp_path / "labels.csv"), "--require-labels")
    assert err == "wsishard build: error: --require-labels: 1 of 3 slides have no label in --labels: slide-002.svs"
    assert not out.exists()
    err = usage_error(capsys, str(slides), "-o", str(out), "--require-labels")
    assert err == (
        "wsishard build: error: --require-labels: 3 of 3 slides have no label in --labels: "
        "slide-000.svs, slide-001.tif, slide-002.svs"
    )
    assert not out.exists()


def test_a_slide_labelled_under_two_names_is_an_error(slides: Path, tmp_path: Path) -> None:
    options = BuildOptions(labels={"slide-000": 1, "slide-000.svs": 1, "slide-001": 0})
    twice = r"--labels: slide-000\.svs is listed twice: as 'slide-000\.svs' and 'slide-000'"
    with pytest.raises(ValueError, match=twice):
        build([str(slides)], str(tmp_path / "out"), options)
    assert not (tmp_path / "out").exists()


@dataclass
class _Built:
    manifest: Manifest
    labels_by_slide: dict[str, set[int]]  # labels the stream gives each slide's samples
    cls_by_slide: dict[str, set[bytes | None]]  # each slide's samples' .cls members (None: no .cls)
    warnings: list[str]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def partly_labelled(slides: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Built]:
    """``slides`` built with labels for slide-000 (1) and slide-001 (7), none for slide-002, and one for a
    slide-009 that is not among the inputs; an --mpp-csv line names a slide that is not there either."""
    from wsishard.streaming.sources import stream

    out = tmp_path_factory.mktemp("partly-labelled") / "out"
    options = BuildOptions(
        labels={"slide-000.svs": 1, "slide-001": 7, "slide-009": 3},
        mpp_overrides={"slide-010.svs": 0.25},
        jobs=1,
        shard_samples=50,
        qc=False,
    )
    collect = _Collect()
    logging.getLogger("wsishard").addHandler(collect)
    try:
        manifest = build([str(slides)], str(out), options)
    finally:
        logging.getLogger("wsishard").removeHandler(collect)
    labels: dict[str, set[int]] = {}
    for batch in stream(str(out), batch_size=16, resampled=False, drop_last=False, shuffle=0, seed=0):
        for meta, label in zip(batch["meta"], batch["label"].tolist(), strict=True):
            labels.setdefault(meta["slide_id"], set()).add(label)
    cls: dict[str, set[bytes | None]] = {}
    for sample in read_output(str(out))[1]:
        cls.setdefault(sample.meta["slide_id"], set()).add(sample.members.get("cls"))
    yield _Built(manifest, labels, cls, collect.messages)


def test_integer_labels_stay_integers_and_unlabelled_slides_stream_as_minus_one(partly_labelled: _Built) -> None:
    assert partly_labelled.labels_by_slide == {"slide-000": {1}, "slide-001": {7}, "slide-002": {-1}}
    assert partly_labelled.cls_by_slide == {"slide-000": {b"1"}, "slide-001": {b"7"}, "slide-002": {None}}
    assert [s.label for s in partly_labelled.manifest.slides] == [1, 7, None]


def test_unknown_and_missing_slides_are_reported(partly_labelled: _Built) -> None:
    assert partly_labelled.warnings == [
        "--labels: 1 slide name matches no input slide: slide-009",
        "--labels: 1 of 3 slides have no label (no .cls; label -1 when streamed): slide-002.svs",
        "--mpp-csv: 1 slide name matches no input slide: slide-010.svs",
    ]


def test_the_summary_names_unlabelled_slides(partly_labelled: _Built) -> None:
    text = summary(partly_labelled.manifest)
    assert "  1 slide without a label (label -1 when streamed): slide-002.svs" in text.splitlines()
