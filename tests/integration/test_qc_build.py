"""QC output of a build: pictures at ``--qc-size``, ``qc/index.html`` written by the build with ``--qc``, ``inspect
--html``; a default build's pictures drawn later by ``inspect --qc`` from what it recorded."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from PIL import Image

from wsishard.cli import main
from wsishard.testing.synthetic import make_slide

ARGS = ("--mpp", "1", "--patch-size", "128", "--qc-size", "800", "--jobs", "1", "-q")


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("qc-slides")
    make_slide(folder / "inked.svs", width=4096, height=4096, mpp=1.0, seed=3, artefacts=("ink", "dots", "edge"))
    make_slide(folder / "blank.tif", width=1024, height=1024, tissue=False)
    return folder


@pytest.fixture(scope="module")
def built(slides: Path) -> Path:
    out = slides.parent / (slides.name + "-out")
    assert main(["build", str(slides), "-o", str(out), *ARGS, "--qc"]) == 1  # the blank slide has no tissue
    return out


def test_a_default_build_draws_no_picture_and_inspect_qc_draws_the_same_ones_later(
    slides: Path, built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["build", str(slides), "-o", str(out), *ARGS]) == 1
    said = capsys.readouterr().out
    assert not (out / "qc").exists()
    assert f"QC review: wsishard inspect {out} --qc draws the pictures and {out}/qc/index.html" in said
    assert main(["inspect", str(out), "--qc"]) == 0
    assert f"2 QC pictures drawn; review page {out}/qc/index.html" in capsys.readouterr().out
    for name in ("inked.png", "blank.png", "index.html"):  # the pictures and the page the build draws with --qc
        assert (out / "qc" / name).read_bytes() == (built / "qc" / name).read_bytes(), name
    assert main(["inspect", str(out), "--qc"]) == 0  # drawn once: a second call keeps them
    assert "0 QC pictures drawn; 2 already there" in capsys.readouterr().out


def test_pictures_of_slides_moved_since_are_drawn_on_the_recorded_view(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moved = tmp_path / "slides"
    shutil.copytree(slides, moved)
    out = tmp_path / "out"
    assert main(["build", str(moved), "-o", str(out), *ARGS]) == 1
    shutil.rmtree(moved)
    capsys.readouterr()
    assert main(["inspect", str(out), "--qc", "--html", str(tmp_path / "review.html")]) == 0
    said = capsys.readouterr().out
    assert "2 QC pictures drawn; 2 of them on the scan's recorded view (slide not readable here: blank, inked)" in said
    with Image.open(out / "qc" / "inked.png") as picture:  # the detection view: 4096 px at 8 um/px (mpp 1)
        assert picture.width == 512 and picture.height > 512
    page = (tmp_path / "review.html").read_text()
    assert 'src="out/qc/inked.png"' in page


def test_inspect_html_without_qc_says_how_to_draw_the_missing_pictures(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["build", str(slides), "-o", str(out), *ARGS]) == 1
    capsys.readouterr()
    assert main(["inspect", str(out), "--html", str(tmp_path / "review.html")]) == 0
    assert "pictures missing from OUT/qc/ are drawn by inspect --qc" in capsys.readouterr().out
    assert not (out / "qc").exists()  # --html alone writes nothing into the build


def test_pictures_are_at_the_qc_size_with_a_legend(built: Path) -> None:
    with Image.open(built / "qc" / "inked.png") as picture:
        assert picture.width == 800 and picture.height > 800  # 4096 px square slide, plus the legend band


def test_the_build_writes_the_qc_page_failed_first(built: Path) -> None:
    page = (built / "qc" / "index.html").read_text()
    assert page.index('id="blank"') < page.index('id="inked"')
    assert "no tissue found" in page and 'src="inked.png"' in page


def test_inspect_html_links_pictures_from_the_page(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page_path = tmp_path / "review" / "qc.html"
    page_path.parent.mkdir()
    assert main(["inspect", str(built), "--html", str(page_path)]) == 0
    assert "2 slides, failed first" in capsys.readouterr().out
    page = page_path.read_text()
    src = page.split('src="', 2)[2].split('"', 1)[0]  # the second slide's picture (the first has none)
    assert src.endswith("inked.png") and (page_path.parent / src).resolve() == (built / "qc" / "inked.png").resolve()


def test_inspect_html_never_writes_over_a_file_of_the_build(built: Path, capsys: pytest.CaptureFixture[str]) -> None:
    own = [
        "manifest.json",
        "slides.jsonl",
        "qc/inked.png",
        ".wsishard/build.json",
        next(p.name for p in built.glob("shard-*.tar")),
    ]
    for name in own:
        before = (built / name).read_bytes()
        assert main(["inspect", str(built), "--html", str(built / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"that is the build's own {name}" in err and len(err.splitlines()) == 1, err
        assert (built / name).read_bytes() == before
    before = (built / "manifest.json").read_bytes()
    assert main(["inspect", str(built / "manifest.json"), "--html", str(built / "qc" / ".." / "manifest.json")]) == 2
    assert (built / "manifest.json").read_bytes() == before and "own manifest.json" in capsys.readouterr().err
    assert main(["inspect", str(built), "--html", str(built / "qc" / "index.html")]) == 0  # its own page: rewritten
    assert main(["inspect", str(built), "--html", str(built / "qc")]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_inspect_html_never_writes_over_an_index_nor_through_a_link(
    built: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 42: ``--html`` at a shard's ``.idx.npz`` or ``index.npz`` (also through a symlink or a hard link from
    outside the output) replaced it with HTML, exit 0."""
    index = next(p.name for p in built.glob("shard-*.idx.npz"))
    for name in (index, "index.npz"):
        before = (built / name).read_bytes()
        assert main(["inspect", str(built), "--html", str(built / name)]) == 2
        err = capsys.readouterr().err.strip()
        assert f"that is the build's own {name}" in err and len(err.splitlines()) == 1, err
        soft, hard = tmp_path / f"soft-{name}.html", tmp_path / f"hard-{name}.html"
        soft.symlink_to(built / name)
        os.link(built / name, hard)
        for link in (soft, hard):
            assert main(["inspect", str(built), "--html", str(link)]) == 2
            err = capsys.readouterr().err.strip()
            assert f"the build's own {name}" in err and len(err.splitlines()) == 1, err
        assert (built / name).read_bytes() == before
    shard = next(built.glob("shard-*.tar"))
    os.link(shard, tmp_path / "shard-copy.html")
    assert main(["inspect", str(built), "--html", str(tmp_path / "shard-copy.html")]) == 2
    assert f"the build's own {shard.name}" in capsys.readouterr().err
    os.link(built / "manifest.json", built / "review.html")  # inside the output, under a name of no build file
    assert main(["inspect", str(built), "--html", str(built / "review.html")]) == 2
    assert "the build's own manifest.json" in capsys.readouterr().err
    os.unlink(built / "review.html")
    assert main(["inspect", str(built), "--html", str(tmp_path / "fresh.html")]) == 0  # a new file outside: written
    assert (tmp_path / "fresh.html").read_text().startswith("<!")


def test_inspect_qc_names_slides_whose_scan_records_are_gone(
    slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An output copied without its hidden state folder: its slides were fine, and the line says so and what to do."""
    out = tmp_path / "out"
    assert main(["build", str(slides), "-o", str(out), *ARGS]) == 1
    shutil.rmtree(out / ".wsishard" / "scan")
    capsys.readouterr()
    assert main(["inspect", str(out), "--qc"]) == 0
    said = capsys.readouterr().out
    assert "0 QC pictures drawn; 2 slides without a scan record (.wsishard/scan removed or not copied" in said
    assert "failed before tissue detection" not in said
