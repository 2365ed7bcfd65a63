"""Context patches (``--context-mpp``), the build side: each sample's context patches show what its main patch shows,
centred on it, at each context mpp; what runs off the slide is white and recorded; the samples, keys and main patches
are those of the build without context; resume, parts + merge and object storage give the single build."""

from __future__ import annotations

import dataclasses
import io
import json
import tarfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
from buildtools import Sample, read_output, usage_error
from cmu import cmu_path
from PIL import Image
from scipy import ndimage as ndi

from wsishard.builder.inputs.roi import RoiOptions
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.merge import merge
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.errors import OptionError
from wsishard.report import details
from wsishard.shards.index import index_name, load_index
from wsishard.shards.verify import verify
from wsishard.shards.writer import sample_records
from wsishard.storage.opener import load_manifest
from wsishard.testing.synthetic import make_slide

if TYPE_CHECKING:
    from servers import S3Server

pytest_plugins = ("servers",)

PLAIN = BuildOptions(
    patch=PatchOptions(patch_size_px=128),
    shard_size_bytes=None,
    shard_samples=32,
    group_slides=2,
    seed=3,
    jobs=1,
    qc=False,
)
CONTEXT = dataclasses.replace(PLAIN, context_mpp=(8.0, 2.0))  # kept ascending: ctx0 is 2.0, ctx1 is 8.0


def _rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # (h, w, 3) uint8


def _area(rgb: np.ndarray, side: int) -> np.ndarray:
    """(side, side, 3) float: ``rgb`` reduced by area averaging."""
    return np.asarray(Image.fromarray(rgb).resize((side, side), Image.Resampling.BOX), dtype=np.float64)


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a - b) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def _mpp0(root: Path) -> dict[str, float]:
    manifest, _ = read_output(str(root))
    return {s.slide_id: float(s.slide_mpp or 0) for s in manifest.slides}


def _check_context(root: Path, min_samples: int) -> list[float]:
    """Every sample's context patches against its main patch: the field centred within half a context px, and the
    context's centre (the main patch's field) equal to the main patch downsampled to match, both then reduced 4x the
    same way (35 dB PSNR or better: at the context's own px, bicubic resampling at other sub-pixel phases than the
    main patch's and JPEG's chroma subsampling leave 26-31 dB on sharp nuclei, lossless or not). Returns the PSNRs."""
    mpp0 = _mpp0(root)
    _, samples = read_output(str(root))
    assert len(samples) >= min_samples
    scores = []
    for s in samples:
        meta, main = s.meta, s.image()
        m0 = mpp0[meta["slide_id"]]
        for i, ctx in enumerate(meta["context"]):
            l0_per_c = ctx["mpp"] / m0
            gap = np.hypot(
                ctx["x"] + ctx["size"] * l0_per_c / 2 - (meta["x"] + meta["extent"] / 2),
                ctx["y"] + ctx["size"] * l0_per_c / 2 - (meta["y"] + meta["extent"] / 2),
            )
            assert gap <= 0.5 * l0_per_c, (s.key, i, gap, l0_per_c)
            image = _rgb(s.members[f"ctx{i}.jpg"])
            assert image.shape == (ctx["size"], ctx["size"], 3)
            inner = round(meta["patch_size"] * meta["patch_mpp"] / ctx["mpp"])  # context px the main patch spans
            lo = (ctx["size"] - inner) // 2
            centre = image[lo : lo + inner, lo : lo + inner]
            scores.append(_psnr(_area(centre, inner // 4), _area(main, inner // 4)))
    assert min(scores) >= 35.0, sorted(scores)[:5]
    return scores


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two generated slides at real scanners' level-0 mpp (0.2520 svs, 0.2631 tif)."""
    folder = tmp_path_factory.mktemp("context-slides")
    make_slide(folder / "a.svs", width=2600, height=2200, mpp=0.2520, seed=4, tissue_fraction=0.5)
    make_slide(folder / "b.tif", width=2400, height=2000, mpp=0.2631, seed=5, tissue_fraction=0.5)
    return folder


@pytest.fixture(scope="module")
def builds(slides: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The slides built without and with context (2.0 and 8.0 mpp around 0.5 mpp patches)."""
    root = tmp_path_factory.mktemp("context-builds")
    build([str(slides)], str(root / "plain"), PLAIN)
    build([str(slides)], str(root / "context"), CONTEXT)
    return root / "plain", root / "context"


def test_members_json_and_manifest_record_the_context(builds: tuple[Path, Path]) -> None:
    plain, context = builds
    manifest, samples = read_output(str(context))
    assert manifest.options["context_mpp"] == [2.0, 8.0] and manifest.options["context_size"] == 128
    plain_manifest, plain_samples = read_output(str(plain))
    assert plain_manifest.options["context_mpp"] == [] and plain_manifest.options["context_size"] == 128
    assert all("context" not in s.meta and not any(e.startswith("ctx") for e in s.members) for s in plain_samples)
    shard = context / manifest.shards[0].name
    with tarfile.open(shard) as tar:
        first = [m.name.split(".", 1)[1] for m in tar.getmembers()[:4]]
    assert first == ["jpg", "ctx0.jpg", "ctx1.jpg", "json"]  # main image, context ascending, then the rest
    for s in samples:
        assert [c["mpp"] for c in s.meta["context"]] == [2.0, 8.0]
        assert all(c["size"] == 128 and 0.0 <= c["padded"] < 1.0 for c in s.meta["context"])


def test_inspect_names_the_context(builds: tuple[Path, Path]) -> None:
    context, plain = (details(load_manifest(str(root))[0]) for root in (builds[1], builds[0]))
    assert "context: 2.0, 8.0 mpp at 128 px (members ctx0, ctx1)" in context.splitlines()
    assert "context:" not in plain


def test_context_centres_and_pixels_match_the_main_patch_on_generated_slides(builds: tuple[Path, Path]) -> None:
    _check_context(builds[1], min_samples=40)


def test_context_centres_and_pixels_match_the_main_patch_on_real_tissue(tmp_path: Path) -> None:
    options = dataclasses.replace(CONTEXT, context_mpp=(1.0, 2.0))
    build([cmu_path()], str(tmp_path / "out"), options)  # CMU-1's region: 0.499 mpp, one level
    _check_context(tmp_path / "out", min_samples=20)


def test_lossless_context_matches_the_main_patch_at_its_own_pixels_unshifted(slides: Path, tmp_path: Path) -> None:
    """PNG patches (no JPEG loss on either side), compared at the context's own pixels: the context's centre equals
    the main patch area-reduced 4x within 35 dB, and moving the context by a quarter of its pixel makes it worse."""
    import cv2

    opts = dataclasses.replace(PLAIN, context_mpp=(2.0,), image_format="png")
    build([str(slides / "a.svs")], str(tmp_path / "out"), opts)
    _, samples = read_output(str(tmp_path / "out"))
    inner, lo = 32, (128 - 32) // 2  # 128 px at 0.5 mpp span 32 px at 2.0 mpp
    at: dict[tuple[float, float], list[float]] = {}
    for s in samples[:40]:
        ctx, main = (np.asarray(_rgb(s.members[m]), dtype=np.float64) for m in ("ctx0.png", "png"))
        reduced = cv2.resize(main, (inner, inner), interpolation=cv2.INTER_AREA)
        for shift in ((0.0, 0.0), (0.25, 0.0), (-0.25, 0.0), (0.0, 0.25), (0.0, -0.25)):
            moved = cv2.warpAffine(
                ctx,
                np.float32([[1, 0, -shift[0]], [0, 1, -shift[1]]]),
                (128, 128),
                flags=cv2.INTER_CUBIC,
                borderMode=cv2.BORDER_REPLICATE,
            )
            at.setdefault(shift, []).append(_psnr(moved[lo : lo + inner, lo : lo + inner], reduced))
    assert len(at[(0.0, 0.0)]) >= 20 and min(at[(0.0, 0.0)]) >= 35.0, sorted(at[(0.0, 0.0)])[:5]
    centred = float(np.median(at[(0.0, 0.0)]))
    assert all(centred > float(np.median(v)) + 1.0 for k, v in at.items() if k != (0.0, 0.0)), {
        k: float(np.median(v)) for k, v in at.items()
    }


def test_context_through_openslide_matches_the_main_patch_too(slides: Path, tmp_path: Path) -> None:
    build([str(slides)], str(tmp_path / "out"), dataclasses.replace(CONTEXT, fast_path=False))
    _check_context(tmp_path / "out", min_samples=40)


def test_the_per_sample_index_spans_each_whole_sample_with_its_context(builds: tuple[Path, Path]) -> None:
    manifest, samples = read_output(str(builds[1]))
    by_key = {s.key: s for s in samples}
    for shard in manifest.shards:
        index = load_index((builds[1] / index_name(shard.name)).read_bytes())
        data = (builds[1] / shard.name).read_bytes()
        assert len(index) == shard.samples
        for key, offset, size in zip(index.key, index.columns["offset"], index.columns["size"], strict=True):
            with tarfile.open(fileobj=io.BytesIO(data[offset : offset + size] + bytes(1024))) as tar:
                members = {m.name.split(".", 1)[1]: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
            assert members == by_key[key.decode()].members  # image, both context patches, json: all of it


def test_padding_at_the_slide_edge_is_white_and_recorded(builds: tuple[Path, Path], slides: Path) -> None:
    mpp0 = _mpp0(builds[1])
    dims = {"a": (2600, 2200), "b": (2400, 2000)}
    _, samples = read_output(str(builds[1]))
    edge = [s for s in samples if s.meta["context"][0]["padded"] > 0.05]
    assert edge, "no sample near the edge"
    far_px = 0
    for s in edge:
        ctx = s.meta["context"][0]
        l0_per_c, (w, h) = ctx["mpp"] / mpp0[s.meta["slide_id"]], dims[s.meta["slide_id"]]
        centres = (np.arange(ctx["size"]) + 0.5) * l0_per_c
        on_x = (ctx["x"] + centres >= 0) & (ctx["x"] + centres < w)
        on_y = (ctx["y"] + centres >= 0) & (ctx["y"] + centres < h)
        off = ~(on_y[:, None] & on_x[None, :])  # (size, size) px whose centres lie off the slide
        assert abs(off.mean() - ctx["padded"]) <= 2.0 / ctx["size"], (s.key, off.mean(), ctx["padded"])
        image = _rgb(s.members["ctx0.jpg"])
        far = ndi.binary_erosion(off, iterations=16, border_value=1)  # a JPEG MCU away from the slide: no ringing
        assert image[off].min() >= 235 and image[off].mean() >= 252 and image[far].min(initial=255) >= 252  # glass
        far_px += int(far.sum())
        assert image[~off].mean() < 250  # the slide's part holds tissue, not glass only
    assert far_px >= 500


def test_keys_main_patches_and_shards_without_context_are_unchanged(builds: tuple[Path, Path]) -> None:
    plain, context = builds
    plain_manifest, plain_samples = read_output(str(plain))
    manifest, samples = read_output(str(context))
    assert [(s.name, s.samples) for s in manifest.shards] == [(s.name, s.samples) for s in plain_manifest.shards]
    assert [s.key for s in samples] == [s.key for s in plain_samples]
    for shard in plain_manifest.shards:  # the context build's samples less their context: the plain shard's bytes
        records = b""
        for s in (s for s in samples if s.shard == shard.name):
            meta = {k: v for k, v in s.meta.items() if k != "context"}
            members = {e: d for e, d in s.members.items() if not e.startswith("ctx")}
            members["json"] = json.dumps(meta, sort_keys=True).encode()
            records += sample_records(s.key, members)
        data = (plain / shard.name).read_bytes()
        assert data.startswith(records) and not data[len(records) :].strip(b"\0")


def test_verify_accepts_context_and_names_a_wrong_context_member(builds: tuple[Path, Path], tmp_path: Path) -> None:
    assert verify(str(builds[1])).ok
    from wsishard.shards.samplerules import SampleRules, sample_problems

    manifest, samples = read_output(str(builds[1]))
    rules = SampleRules.of(manifest, str(builds[1]))
    s: Sample = samples[0]
    assert sample_problems(s.key, s.members, rules) == []
    small = io.BytesIO()
    Image.new("RGB", (64, 64), "white").save(small, "JPEG")
    wrong = {**s.members, "ctx1.jpg": small.getvalue()}
    assert any("128x128" in p for p, _ in sample_problems(s.key, wrong, rules))
    missing = {e: d for e, d in s.members.items() if e != "ctx0.jpg"}
    assert any("ctx0.jpg" in p for p, _ in sample_problems(s.key, missing, rules))


def test_resume_and_parts_merge_with_context_give_the_single_build(
    slides: Path, builds: tuple[Path, Path], tmp_path: Path
) -> None:
    single, _ = read_output(str(builds[1]))
    out = tmp_path / "resumed"
    build([str(slides)], str(out), CONTEXT)
    (out / single.shards[0].name).unlink()  # as if killed before it: the rerun writes it again
    resumed = build([str(slides)], str(out), CONTEXT)
    assert [(s.name, s.sha256) for s in resumed.shards] == [(s.name, s.sha256) for s in single.shards]
    with pytest.raises(OptionError):  # other context options: refused without overwrite
        build([str(slides)], str(out), dataclasses.replace(CONTEXT, context_mpp=(2.0,)))
    parts = tmp_path / "parts"
    for i in (1, 2):
        build([str(slides)], str(parts), dataclasses.replace(CONTEXT, group_slides=1), part=(i, 2))
    merged = merge(str(parts))
    reference = build([str(slides)], str(tmp_path / "one"), dataclasses.replace(CONTEXT, group_slides=1))
    assert [(s.name, s.sha256) for s in merged.shards] == [(s.name, s.sha256) for s in reference.shards]
    assert merged.options["context_mpp"] == [2.0, 8.0] and merged.options["context_size"] == 128


def test_context_with_labels_and_a_context_size(slides: Path, tmp_path: Path) -> None:
    options = dataclasses.replace(CONTEXT, context_mpp=(0.5, 1.0), context_size=64, labels={"a": 3, "b": 1})
    manifest = build([str(slides)], str(tmp_path / "out"), options)  # 0.5 at 64 px is no repeat of the 128 px patch
    assert manifest.options["context_size"] == 64
    _, samples = read_output(str(tmp_path / "out"))
    for s in samples:
        assert s.members["cls"] == str(s.meta["label"]).encode()
        assert _rgb(s.members["ctx0.jpg"]).shape == _rgb(s.members["ctx1.jpg"]).shape == (64, 64, 3)
        # the 0.5 mpp context is the main patch's centre quarter
        assert _psnr(_area(_rgb(s.members["ctx0.jpg"]), 16), _area(s.image()[32:96, 32:96], 16)) >= 35.0


def test_context_with_annotation_regions_and_their_classes(slides: Path, tmp_path: Path) -> None:
    folder = tmp_path / "roi"
    folder.mkdir()
    for stem in ("a", "b"):
        square = [[[200, 200], [1800, 200], [1800, 1600], [200, 1600], [200, 200]]]
        feature = {
            "type": "Feature",
            "geometry": {"type": "Polygon", "coordinates": square},
            "properties": {"classification": {"name": "Tumor"}},
        }
        (folder / f"{stem}.geojson").write_text(json.dumps({"type": "FeatureCollection", "features": [feature]}))
    roi = RoiOptions(path=str(folder), labels=("Tumor",))
    build([str(slides)], str(tmp_path / "plain"), dataclasses.replace(PLAIN, roi=roi))
    build([str(slides)], str(tmp_path / "context"), dataclasses.replace(CONTEXT, roi=roi))
    _, plain = read_output(str(tmp_path / "plain"))
    _, samples = read_output(str(tmp_path / "context"))
    assert [s.key for s in samples] == [s.key for s in plain] and len(samples) >= 20
    assert all(s.members["cls"] == b"0" and s.meta["label_name"] == "Tumor" for s in samples)
    for a, b in zip(samples, plain, strict=True):
        assert a.members["jpg"] == b.members["jpg"] and "ctx1.jpg" in a.members


def test_a_context_finer_than_level_0_fails_the_slide_with_a_reason_unless_upsampling_is_allowed(
    slides: Path, tmp_path: Path
) -> None:
    manifest = build([str(slides)], str(tmp_path / "out"), dataclasses.replace(CONTEXT, context_mpp=(0.1,)))
    assert len(manifest.failed_slides) == 2 and manifest.total_samples == 0
    assert all("context target 0.1 mpp" in s.reason and "--allow-upsample" in s.reason for s in manifest.failed_slides)
    patch = dataclasses.replace(CONTEXT.patch, allow_upsample=True)
    manifest = build([str(slides)], str(tmp_path / "up"), dataclasses.replace(CONTEXT, context_mpp=(0.2,), patch=patch))
    assert not manifest.failed_slides and manifest.total_samples >= 40  # 0.2 mpp: level 0 upsampled 1.26x / 1.32x


def test_build_from_and_to_s3_with_context_equals_the_local_build(
    s3: S3Server, s3_bucket: str, slides: Path, builds: tuple[Path, Path]
) -> None:
    s3.upload(str(slides), f"s3://{s3_bucket}/context/slides")
    url = f"s3://{s3_bucket}/context/out"
    manifest = build([f"s3://{s3_bucket}/context/slides/"], url, CONTEXT, storage_options=s3.storage_options)
    local, _ = read_output(str(builds[1]))
    assert [(s.name, s.sha256) for s in manifest.shards] == [(s.name, s.sha256) for s in local.shards]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--context-mpp", "0"], "invalid context_mpp: 0.0"),
        (["--context-mpp", "2,2"], "2.0 is given twice"),
        (["--context-mpp", "two"], "invalid context_mpp: 'two'"),
        (["--context-mpp", "0.5"], "the patch's own mpp at the same size"),
        (["--context-mpp", "2", "--context-size", "4"], "invalid context_size: 4"),
    ],
)
def test_the_cli_refuses_bad_context_values_in_one_line(
    args: list[str], says: str, slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = usage_error(capsys, str(slides), "-o", str(tmp_path / "out"), *args)
    assert says in err
    assert not (tmp_path / "out").exists()  # nothing written


def test_a_context_mpp_equal_to_the_patch_mpp_is_fine_at_another_mpp_or_size() -> None:
    assert BuildOptions(patch=PatchOptions(target_mpp=1.0), context_mpp=(0.5,)).context_mpp == (0.5,)
    assert BuildOptions(context_mpp=(0.5,), context_size=512).context_size_px == 512
    with pytest.raises(OptionError, match="patch's own mpp"):
        BuildOptions(context_mpp=(0.5, 2.0))


def test_the_fast_path_reads_aperio_rgb_jpeg_tiles_reduced_in_their_own_colours(tmp_path: Path) -> None:
    """CMU-1's tiles are RGB JPEG without a JFIF marker: libjpeg's DCT-scaled decode (a 1.0 mpp patch or context
    read 2x reduced) took them for YCbCr; read through OpenSlide they are the reference."""
    options = dataclasses.replace(PLAIN, patch=PatchOptions(target_mpp=1.0, patch_size_px=128))
    build([cmu_path()], str(tmp_path / "fast"), options)
    build([cmu_path()], str(tmp_path / "openslide"), dataclasses.replace(options, fast_path=False))
    _, fast = read_output(str(tmp_path / "fast"))
    _, slow = read_output(str(tmp_path / "openslide"))
    assert [s.key for s in fast] == [s.key for s in slow] and len(fast) >= 10
    gaps = [np.abs(a.image().astype(float) - b.image()).mean() for a, b in zip(fast, slow, strict=True)]
    assert max(gaps) < 4.0, max(gaps)  # DCT scaling against a box filter: a few levels; swapped colours: 40+


def test_the_qc_picture_outlines_one_samples_context_fields() -> None:
    from wsishard.builder.qc.qc import CONTEXT_RGB, QcLayers, qc_picture

    view = np.full((200, 300, 3), 255, np.uint8)  # a 3000 x 2000 px slide seen at 10 level-0 px per px
    layers = QcLayers(tissue=np.zeros((200, 300), bool), l0_per_m=10.0)
    xs, ys = np.array([1400]), np.array([900])
    plain = np.asarray(qc_picture(view, 10.0, layers, xs, ys, 200))
    drawn = np.asarray(qc_picture(view, 10.0, layers, xs, ys, 200, footprints=[(1000.0, 500.0, 1000.0)]))
    red = np.all(drawn == CONTEXT_RGB, axis=2)
    assert not np.all(plain == CONTEXT_RGB, axis=2).any()
    assert red[50, 100:200].all() and red[150, 100:200].all() and red[50:150, 100].all()  # the square's sides
    assert not red[60:140, 110:190].any()  # an outline: the patch inside stays visible


# ---- issue 42: a context field far larger than the slide --------------------------------------------------------


@pytest.mark.parametrize("mpp", [300.0, 999.0])
def test_a_context_field_far_larger_than_the_slide_reads_only_the_slide(tmp_path: Path, mpp: float) -> None:
    """``--context-mpp 300`` on an 8192 px slide took 2.85 GB for 2 patches (999: a 12.5 GiB allocation): stage 1
    read the whole field at the level's px, glass and all. Now only the part on the slide is read, in chunks."""
    import tracemalloc

    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "small.svs", width=2048, height=2048, mpp=0.25, seed=21)
    patch = dataclasses.replace(PLAIN.patch, max_patches_per_slide=2)
    options = dataclasses.replace(PLAIN, patch=patch, context_mpp=(mpp,), context_size=64)
    tracemalloc.start()
    try:
        manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), options)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"{peak / 2**20:.0f} MiB traced"  # 2.5 MiB; the whole field read: 1,480 MiB at 300
    (record,) = manifest.slides
    assert record.status == "ok" and record.patches == 2
    _, samples = read_output(str(tmp_path / "out"))
    for sample in samples:
        (meta,) = sample.meta["context"]
        assert meta["mpp"] == mpp and meta["padded"] > 0.99  # the slide is a speck in the field
        ctx = _rgb(sample.members["ctx0.jpg"])  # (64, 64, 3)
        assert ctx.shape == (64, 64, 3)
        assert (ctx.min(axis=2) < 250).any() == (mpp == 300.0)  # 1.7 px of slide in it; at 999 no px centre on it
