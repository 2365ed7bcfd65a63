"""What a scan records for its slide's QC picture (:mod:`wsishard.builder.qc.qcrecord`): saved with the scan, read back
exactly, and drawn into the same picture as the one drawn from the scan's own objects."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

from wsishard.builder.qc.qc import QcLayers
from wsishard.builder.qc.qcrecord import QcRecord, picture_png, view_jpeg
from wsishard.builder.scan.grid import Candidates, blocks
from wsishard.builder.scan.scan import ScanResult
from wsishard.builder.scan.scanstate import decode_scan, encode_scan
from wsishard.manifest import SlideRecord


def _record() -> tuple[QcRecord, np.ndarray]:
    rng = np.random.default_rng(5)
    ramp = np.linspace(0, 1, 53)[None, :, None]  # a smooth view, pink on the left to violet on the right
    view = np.broadcast_to(np.array([230, 150, 190]) * (1 - ramp) + np.array([120, 60, 170]) * ramp, (37, 53, 3))
    view = view.astype(np.uint8)  # (h, w, 3): odd sizes, so the packed masks have bits left over
    tissue = rng.random((37, 53)) < 0.4
    ink = rng.random((37, 53)) < 0.05
    layers = QcLayers(tissue, 16.0, ink=ink, dark=None, roi=None, pigment=tissue & ~ink)
    legend = ("tissue contour (green): 1.00 mm2", "left out: min_tissue 3")
    return QcRecord(layers, 15.9, 0.5, legend, ((10.0, 20.0, 300.0),), view_jpeg(view)), view


def _cands() -> Candidates:
    return Candidates(
        col=np.array([0, 1, 3]),
        row=np.array([0, 2, 1]),
        tissue=np.array([0.5, 0.6, 0.9]),
        l0_per_o=2.0,
        stride=64,
        patch=64,
        total=9,
    )


def test_the_qc_record_is_saved_with_the_scan_and_read_back_exactly() -> None:
    qc, view = _record()
    cands = _cands()
    saved = ScanResult(SlideRecord(slide_id="a", file="/s/a.svs", status="ok"), cands, blocks(cands, 4), None, qc=qc)
    back = decode_scan(encode_scan(saved), 4, qc=True).qc
    assert back is not None
    for name in ("tissue", "ink", "pigment"):
        assert np.array_equal(getattr(back.layers, name), getattr(qc.layers, name))
        assert getattr(back.layers, name).dtype == bool
    assert back.layers.dark is None and back.layers.roi is None and back.layers.l0_per_m == 16.0
    assert (back.l0_per_t_asked, back.slide_mpp, back.legend, back.footprints) == (15.9, 0.5, qc.legend, qc.footprints)
    assert back.view_jpeg == qc.view_jpeg
    recorded = np.asarray(Image.open(io.BytesIO(back.view_jpeg)))
    assert recorded.shape == view.shape and np.abs(recorded.astype(int) - view).max() <= 4  # the view, in RGB order
    assert decode_scan(encode_scan(saved), 4).qc is None  # extraction does not unpack it
    failed = ScanResult(SlideRecord(slide_id="b", file="/s/b.svs", status="failed", reason="no tissue found"), qc=qc)
    assert decode_scan(encode_scan(failed), 4, qc=True).qc is not None  # a slide without patches has a picture too


def test_a_picture_drawn_from_the_saved_record_is_the_one_drawn_from_the_scan() -> None:
    qc, _ = _record()
    cands = _cands()
    saved = ScanResult(SlideRecord(slide_id="a", file="x", status="ok"), cands, qc=qc)
    back = decode_scan(encode_scan(saved), 4, qc=True)
    assert back.qc is not None
    drawn = picture_png(back.qc, back.cands, 400, None)
    assert drawn == picture_png(qc, cands, 400, None)
    with Image.open(io.BytesIO(drawn)) as picture:
        assert picture.width == 53 and picture.height > 37  # the recorded view (never scaled up), and the legend


def test_a_slide_id_that_no_build_gives_never_names_a_picture(tmp_path: Path) -> None:
    from wsishard.builder.qc.qcdraw import PictureTask, draw_picture
    from wsishard.storage.output import Destination

    qc, _ = _record()
    dest = Destination(str(tmp_path / "out"))
    for index, slide_id in enumerate(["../evil", "a"]):  # a tampered manifest's id, and a build's own
        saved = ScanResult(SlideRecord(slide_id=slide_id, file="/gone.svs", status="ok"), _cands(), qc=qc)
        dest.write_bytes(f".wsishard/scan/{index:07d}.npz", encode_scan(saved))
    assert draw_picture(PictureTask(index=0, slide_id="../evil", path="/gone.svs", dest=dest, size_px=200)) == "none"
    assert draw_picture(PictureTask(index=1, slide_id="a", path="/gone.svs", dest=dest, size_px=200)) == "record"
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*.png")) == ["out/qc/a.png"]
