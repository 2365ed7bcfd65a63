"""Annotation regions: GeoJSON parsing (QuPath's shapes), rasterization (holes, MultiPolygon, outside the slide),
broken files as the slide's failure, matching files to slides, label assignment."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wsishard.builder.inputs.roi import (
    Region,
    RoiOptions,
    label_patches,
    load_regions,
    match_annotations,
    parse_names,
    rasterize,
    slide_roi,
)
from wsishard.builder.scan.grid import PatchOptions, candidates
from wsishard.errors import OptionError, SlideError

SQUARE = [[0, 0], [400, 0], [400, 400], [0, 400], [0, 0]]  # level-0 px


def _square(x: float, y: float, side: float) -> list[list[float]]:
    return [[x, y], [x + side, y], [x + side, y + side], [x, y + side], [x, y]]


def _feature(geometry: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    props: dict[str, Any] = {"objectType": "annotation"}
    if name is not None:
        props["classification"] = {"name": name, "color": [255, 0, 0]}  # QuPath's shape
    return {"type": "Feature", "geometry": geometry, "properties": props}


def _write(tmp_path: Path, data: Any, name: str = "slide.geojson") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def _mask(
    tmp_path: Path,
    data: Any,
    shape: tuple[int, int] = (100, 100),
    l0_per_m: float = 10.0,
    exclude: tuple[str, ...] = (),
) -> np.ndarray:
    return rasterize(load_regions(_write(tmp_path, data)), shape, l0_per_m, exclude).mask


# ------------------------------------------------------------------------------------------- geometry


def test_polygon_fills_its_pixels(tmp_path: Path) -> None:
    mask = _mask(tmp_path, {"type": "Polygon", "coordinates": [_square(100, 200, 300)]})
    expected = np.zeros((100, 100), dtype=bool)
    expected[20:50, 10:40] = True  # 10 level-0 px per mask px: x 100..400 -> columns 10..39
    assert np.array_equal(mask, expected)


def test_hole_is_left_out(tmp_path: Path) -> None:
    polygon = {"type": "Polygon", "coordinates": [_square(0, 0, 600), _square(200, 200, 200)]}
    mask = _mask(tmp_path, _feature(polygon, "Tumor"))
    assert mask[0:60, 0:60].sum() == 60 * 60 - 20 * 20
    assert not mask[20:40, 20:40].any() and mask[10, 10] and mask[45, 45]


def test_multipolygon_with_a_hole_in_one_part(tmp_path: Path) -> None:
    geometry = {
        "type": "MultiPolygon",
        "coordinates": [[_square(0, 0, 200)], [_square(500, 500, 400), _square(600, 600, 100)]],
    }
    mask = _mask(tmp_path, {"type": "FeatureCollection", "features": [_feature(geometry)]})
    assert mask[0:20, 0:20].all()
    assert mask[50:90, 50:90].sum() == 40 * 40 - 10 * 10 and not mask[60:70, 60:70].any()
    assert mask.sum() == 20 * 20 + 40 * 40 - 10 * 10


def test_polygon_partly_outside_the_slide_is_cut(tmp_path: Path) -> None:
    mask = _mask(tmp_path, {"type": "Polygon", "coordinates": [_square(-500, 800, 700)]})
    assert mask[80:100, 0:20].all() and mask.sum() == 20 * 20


def test_polygon_wholly_outside_gives_an_empty_region(tmp_path: Path) -> None:
    assert not _mask(tmp_path, {"type": "Polygon", "coordinates": [_square(5000, 5000, 100)]}).any()


def test_a_list_of_features_as_qupath_writes_without_a_collection(tmp_path: Path) -> None:
    data = [
        _feature({"type": "Polygon", "coordinates": [_square(0, 0, 100)]}, "Tumor"),
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [5, 5]}, "properties": {}},
        _feature({"type": "LineString", "coordinates": [[0, 0], [50, 50]]}),
    ]
    regions = load_regions(_write(tmp_path, data))
    assert [r.name for r in regions] == ["Tumor"]  # points and lines are not regions


def test_excluded_classes_remove_their_regions(tmp_path: Path) -> None:
    data = {
        "type": "FeatureCollection",
        "features": [
            _feature({"type": "Polygon", "coordinates": [_square(0, 0, 600)]}, "Tumor"),
            _feature({"type": "Polygon", "coordinates": [_square(0, 0, 300)]}, "Necrosis"),
        ],
    }
    mask = _mask(tmp_path, data, exclude=("Necrosis",))
    assert mask.sum() == 60 * 60 - 30 * 30 and not mask[0:30, 0:30].any()
    only_excluded = _mask(
        tmp_path, {"type": "FeatureCollection", "features": data["features"][1:]}, exclude=("Necrosis",)
    )
    assert only_excluded.sum() == 100 * 100 - 30 * 30  # the rest of the slide


# ------------------------------------------------------------------------------------------- broken files


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("", "not JSON"),
        ("{not json", "not JSON"),
        ({"type": "FeatureCollection", "features": []}, "no Polygon"),
        ([], "no Polygon"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [1, 1]]]}, "malformed"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [10, "a"], [5, 5]]]}, "malformed"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [10, 0], [5]]]}, "malformed"),
        ({"type": "Polygon", "coordinates": [[[0, 0], [10, 0], [5, float("nan")]]]}, "malformed"),
        ({"type": "Polygon"}, "malformed"),
        ({"type": "Circle", "coordinates": [0, 0]}, "malformed"),
        ({"type": "Feature", "geometry": {"type": "Point", "coordinates": [1, 2]}}, "no Polygon"),
        ("42", "malformed"),
    ],
)
def test_broken_annotation_file_is_a_slide_error_with_its_reason(tmp_path: Path, content: Any, reason: str) -> None:
    path = _write(tmp_path, content)
    with pytest.raises(SlideError, match=reason) as info:
        load_regions(path)
    assert isinstance(info.value, OSError) and info.value.path == path


def test_missing_annotation_file_is_a_slide_error(tmp_path: Path) -> None:
    with pytest.raises(SlideError, match="unreadable"):
        load_regions(str(tmp_path / "gone.geojson"))


# ------------------------------------------------------------------------------------------- matching


def test_annotations_are_matched_by_slide_name(tmp_path: Path) -> None:
    folder = tmp_path / "roi"
    folder.mkdir()
    for name in ("a.geojson", "b.svs.geojson", "c.json", "zz.geojson"):
        (folder / name).write_text("{}")
    slides = ["/s/a.svs", "/s/b.svs", "/s/c.tif", "/s/d.svs"]
    found = match_annotations(str(folder), slides)
    assert found == [str(folder / "a.geojson"), str(folder / "b.svs.geojson"), str(folder / "c.json"), None]
    assert match_annotations(str(folder / "a.geojson"), slides) == [str(folder / "a.geojson"), None, None, None]
    assert match_annotations(str(folder / "zz.geojson"), ["/s/only.svs"]) == [str(folder / "zz.geojson")]
    assert match_annotations(None, slides) == [None] * 4
    with pytest.raises(OptionError, match="no such file"):
        match_annotations(str(tmp_path / "nowhere"), slides)


def test_one_slide_given_a_file_named_for_another_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "other.geojson").write_text("{}")
    (tmp_path / "only.geojson").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        assert match_annotations(str(tmp_path / "other.geojson"), ["/s/only.svs"]) == [str(tmp_path / "other.geojson")]
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "other.geojson" in message and "only.svs" in message and "only.geojson expected" in message
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        match_annotations(str(tmp_path / "only.geojson"), ["/s/only.svs"])  # its own: no word
    assert not caplog.records


# ------------------------------------------------------------------------------------------- labels and patches


def test_patches_are_kept_by_coverage_and_labelled_by_their_main_class(tmp_path: Path) -> None:
    data = {
        "type": "FeatureCollection",
        "features": [
            _feature({"type": "Polygon", "coordinates": [_square(0, 0, 320)]}, "Tumor"),
            _feature({"type": "Polygon", "coordinates": [_square(320, 0, 320)]}, "Stroma"),
            _feature({"type": "Polygon", "coordinates": [_square(640, 0, 320)]}, "Other"),
        ],
    }
    options = RoiOptions(path=str(tmp_path), labels=("Stroma", "Tumor"), min_roi_coverage=0.5)
    roi = slide_roi(options, _write(tmp_path, data), (64, 64), 16.0)  # a 1024 px slide, 16 px per mask px
    assert roi is not None
    tissue = np.ones((64, 64), dtype=bool)
    patch = PatchOptions(target_mpp=1.0, patch_size_px=160, max_artefact=1.0)  # 160 level-0 px at mpp 1
    cands = candidates((1024, 1024), 1.0, tissue, 16.0, patch, roi=roi.mask, min_roi_coverage=0.5)
    assert sorted(zip(cands.col.tolist(), cands.row.tolist(), strict=True)) == [
        (c, r) for c in range(6) for r in range(2)
    ]  # 6 columns of 160 px in 960 annotated px, 2 rows in 320
    assert cands.dropped_roi == 6 * 6 - 12  # a 6 x 6 grid of tissue: every cell outside the regions
    labelled = label_patches(cands, roi, options.labels, 16.0)
    by_col = dict(zip(labelled.col.tolist(), labelled.label.tolist(), strict=True))  # type: ignore[union-attr]
    assert by_col == {0: 1, 1: 1, 2: 0, 3: 0}  # Tumor is label 1, Stroma label 0; "Other" is not listed
    assert labelled.label_names == ("Stroma", "Tumor") and labelled.dropped_class == 4


def test_no_annotation_file_gives_no_region() -> None:
    assert slide_roi(RoiOptions(path="/x"), None, (10, 10), 1.0) is None


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"min_roi_coverage": 1.5}, "min_roi_coverage"),
        ({"missing": "maybe"}, "missing"),
        ({"labels": ("A", "A")}, "twice"),
        ({"labels": ("A",), "exclude": ("A",)}, "excluded"),
    ],
)
def test_options_are_validated(kw: dict[str, Any], match: str) -> None:
    with pytest.raises(OptionError, match=match):
        RoiOptions(**kw)


def test_parse_names() -> None:
    assert parse_names(" Tumor, Stroma ,,") == ("Tumor", "Stroma")


def test_per_patch_labels_survive_the_resume_state(tmp_path: Path) -> None:
    import io

    from wsishard.builder.scan.grid import Candidates

    cands = Candidates(
        col=np.array([1, 2]),
        row=np.array([0, 0]),
        tissue=np.array([0.5, 1.0], dtype=np.float32),
        l0_per_o=2.0,
        stride=64,
        patch=64,
        total=3,
        label=np.array([1, 0]),
        label_names=("Stroma", "Tumor"),
    )
    buf = io.BytesIO()
    np.savez(buf, **cands.arrays())  # type: ignore[arg-type]
    loaded = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)  # as the resume state reads them
    back = Candidates.from_arrays({k: loaded[k] for k in loaded.files}, l0_per_o=2.0, stride=64, patch=64, total=3)
    assert back.label is not None and back.label.tolist() == [1, 0] and back.label_names == ("Stroma", "Tumor")
    plain = Candidates.from_arrays(
        {k: v for k, v in cands.arrays().items() if not k.startswith("label")},
        l0_per_o=2.0,
        stride=64,
        patch=64,
        total=3,
    )
    assert plain.label is None and plain.label_names == ()


# ---- issue 42: huge coordinates, many vertices, huge files ----------------------------------------------------


@pytest.mark.parametrize("far", [1e12, 1e17, 1e300, np.finfo(np.float64).max / 2])
def test_a_region_at_huge_coordinates_covering_the_slide_covers_it(tmp_path: Path, far: float) -> None:
    """+/-1e300 left every px outside (every patch "outside the region"); +/-1e12 worked."""
    mask = _mask(tmp_path, {"type": "Polygon", "coordinates": [_square(-far, -far, 2 * far)]})
    assert mask.all()
    mask = _mask(tmp_path, {"type": "Polygon", "coordinates": [[[-far, -far], [500, -far], [500, far], [-far, far]]]})
    expected = np.zeros((100, 100), dtype=bool)
    expected[:, :50] = True  # its right edge at x = 500 level-0 px, the rest far away
    assert np.array_equal(mask, expected)


def test_a_region_of_a_million_vertices_fills_as_its_few_vertex_outline_does(tmp_path: Path) -> None:
    """The fill's work grows with vertices plus px (a 1e6-vertex ROI took 28 s, 10,000 vertices 10 s on 500 x 500):
    each side of a square cut into 250,000 collinear points gives the square's own mask."""
    side = np.linspace(0.0, 1.0, 250_000, endpoint=False)[:, None]  # (n, 1)
    a, b, c, d = (np.array(p, dtype=float) for p in ([105, 195], [405, 195], [405, 505], [105, 505]))
    ring = np.concatenate([a + side * (b - a), b + side * (c - b), c + side * (d - c), d + side * (a - d), [a]])
    assert len(ring) == 1_000_001
    many = rasterize([Region((ring,), "")], (100, 100), 10.0).mask
    few = rasterize([Region((np.array([a, b, c, d, a]),), "")], (100, 100), 10.0).mask
    expected = np.zeros((100, 100), dtype=bool)
    expected[19:50, 10:40] = True  # centres (i + 0.5) * 10 inside x 105..405, y 195..505
    assert np.array_equal(few, expected) and np.array_equal(many, expected)


def test_the_fill_matches_scikit_image_on_random_self_crossing_polygons() -> None:
    from skimage.draw import polygon as fill_polygon

    rng = np.random.default_rng(0)
    for _ in range(100):
        ring = rng.uniform(-200, 1800, (int(rng.integers(3, 25)), 2))  # level-0 (x, y), partly off the slide
        expected = np.zeros((90, 110), dtype=bool)
        rr, cc = fill_polygon(ring[:, 1] / 16 - 0.5, ring[:, 0] / 16 - 0.5, (90, 110))
        expected[rr, cc] = True
        assert np.array_equal(rasterize([Region((ring,), "")], (90, 110), 16.0).mask, expected)


def test_an_annotation_file_over_the_size_cap_is_a_slide_error_naming_its_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wsishard.builder.inputs.roi as roi

    path = _write(tmp_path, {"type": "Polygon", "coordinates": [SQUARE]})
    monkeypatch.setattr(roi, "MAX_ROI_BYTES", 16)  # the real cap is 256 MiB: the same check, a smaller file
    with pytest.raises(
        SlideError, match=r"annotation file is \d\d bytes, over the 16 an annotation file may have \(it is read whole\)"
    ):
        load_regions(path)
