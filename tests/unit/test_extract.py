"""Shard extraction (:mod:`wsishard.builder.extract.extract`) in one process, on two small generated slides.

A shard's plan is cut into segments (:func:`segment_tasks`), each segment is read and encoded
(:func:`extract_segment`), and the segments are written in plan order (:func:`assemble_shards`). The reference
for a shard's content is :func:`~wsishard.builder.extract.patches.block_samples` of each planned block, read straight
from the slide: a shard must hold exactly those samples, in plan order, whatever the segmentation, and nothing of an
excluded slide; a slide that fails mid-shard drops the shard without leaving any file behind.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tifffile

from wsishard.builder.extract import extract
from wsishard.builder.extract.extract import (
    ShardDone,
    ShardOutcome,
    SlideFailed,
    SlideSource,
    WorkerDied,
    assemble_shards,
    extract_segment,
    segment_tasks,
)
from wsishard.builder.extract.patches import EncodeOptions, SlideWork, block_samples
from wsishard.builder.inputs.staging import stage_scanned
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.plan.plan import ShardPlan
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.scan.scan import ScanTask, scan_slide
from wsishard.format import shard_name
from wsishard.shards.index import index_name
from wsishard.shards.reader import group_members
from wsishard.slide import open_slide
from wsishard.slide.cache import close_readers
from wsishard.storage.output import Destination
from wsishard.testing.synthetic import make_slide

PATCH = PatchOptions(target_mpp=0.5, patch_size_px=64, min_tissue=0.25, block_patches=2)
ENCODE = EncodeOptions()
SCAN = BuildOptions(patch=PATCH, shard_size_bytes=None, qc=False)  # its .encode is ENCODE
Blocks = tuple[tuple[int, int], ...]  # (slide, block) in write order


def _scan(path: Path, slide_id: str, label: int, index: int) -> SlideWork:
    task = ScanTask(
        index=index, path=str(path), slide_id=slide_id, options=SCAN, label=label, dest=Destination(str(path.parent))
    )
    scan = scan_slide(task)
    record = scan.record
    assert record.status == "ok" and scan.cands is not None, record.reason
    return SlideWork(
        path=str(path),
        slide_id=slide_id,
        level=record.level or 0,
        patch_mpp=record.patch_mpp or 0,
        cands=scan.cands,
        blocks=scan.blocks,
        label=label,
    )


@pytest.fixture(scope="module")
def works(tmp_path_factory: pytest.TempPathFactory) -> list[SlideWork]:
    """Two scanned 1536x1536 slides (an svs and a tif), each with at least three blocks. Read-only."""
    folder = tmp_path_factory.mktemp("extract-slides")
    make_slide(folder / "a.svs", width=1536, height=1536, seed=1)  # at 1024 px, seed 1 shows no tissue at 8 um/px
    make_slide(folder / "b.tif", width=1536, height=1536, seed=2)
    works = [_scan(folder / "a.svs", "a", 3, 0), _scan(folder / "b.tif", "b", 5, 1)]
    assert all(len(w.blocks) >= 3 for w in works)
    return works


@pytest.fixture(autouse=True)
def _fresh_readers() -> Iterator[None]:
    """Extraction keeps slide handles per process: start and end every test without any."""
    close_readers()
    yield
    close_readers()


def _plan(index: int, works: list[SlideWork], blocks: Blocks) -> ShardPlan:
    return ShardPlan(
        index=index, group=0, blocks=blocks, patches=sum(len(works[s].blocks[b].patches) for s, b in blocks)
    )


def _extract(
    out: Path, works: list[SlideWork], plans: list[ShardPlan], excluded: frozenset[int] = frozenset()
) -> tuple[list[ShardOutcome], list[int]]:
    """Run the shards' segments in plan order; the shard outcomes and the ``written`` reports."""
    sources = {i: SlideSource(w) for i, w in enumerate(works)}
    tasks = [t for sp in plans for t in segment_tasks(sp, sources, excluded, ENCODE)]
    written: list[int] = []
    outcomes = list(assemble_shards((extract_segment(t) for t in tasks), Destination(str(out)), written.append))
    return outcomes, written


def _expected(works: list[SlideWork], blocks: Blocks) -> list[tuple[str, dict[str, bytes]]]:
    samples = []
    for slide, block in blocks:
        with open_slide(works[slide].path) as reader:
            samples += block_samples(reader, works[slide], works[slide].blocks[block], ENCODE)
    return samples


def _shard(path: Path) -> list[tuple[str, dict[str, bytes]]]:
    with tarfile.open(path) as tar:
        return list(group_members((m.name, tar.extractfile(m).read()) for m in tar))  # type: ignore[union-attr]


PLAN: Blocks = ((1, 2), (0, 0), (1, 0), (0, 2), (0, 1))  # interleaved, not sorted


@pytest.mark.parametrize("segment_patches", [10_000, 1], ids=["one-segment", "a-segment-per-block"])
def test_a_shard_holds_the_planned_samples_in_plan_order(
    tmp_path: Path, works: list[SlideWork], monkeypatch: pytest.MonkeyPatch, segment_patches: int
) -> None:
    monkeypatch.setattr(extract, "SEGMENT_PATCHES", segment_patches)
    sp = _plan(7, works, PLAN)
    assert len(segment_tasks(sp, {i: SlideSource(w) for i, w in enumerate(works)}, frozenset(), ENCODE)) == (
        1 if segment_patches > sp.patches else len(PLAN)
    )
    (outcome,), written = _extract(tmp_path, works, [sp])
    expected = _expected(works, PLAN)
    assert isinstance(outcome, ShardDone) and outcome.record is not None
    assert _shard(tmp_path / shard_name(7)) == expected  # keys, order and every member's bytes
    sizes = {s: sum(len(works[s].blocks[b].patches) for t, b in PLAN if t == s) for s in (0, 1)}
    assert outcome.patches_by_slide == sizes and sum(written) == len(expected) == sp.patches
    data = (tmp_path / shard_name(7)).read_bytes()
    record = outcome.record
    assert (record.name, record.samples, record.slides) == (shard_name(7), len(expected), 2)
    assert (record.bytes, record.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert sorted(os.listdir(tmp_path)) == [index_name(shard_name(7)), shard_name(7)]  # no temporary file left


def test_segmentation_never_changes_a_shards_bytes(
    tmp_path: Path, works: list[SlideWork], monkeypatch: pytest.MonkeyPatch
) -> None:
    shas = []
    for segment_patches in (10_000, 1, 7):
        monkeypatch.setattr(extract, "SEGMENT_PATCHES", segment_patches)
        (outcome,), _ = _extract(tmp_path / str(segment_patches), works, [_plan(7, works, PLAN)])
        assert outcome.record is not None
        shas.append(outcome.record.sha256)
    assert len(set(shas)) == 1


def test_an_excluded_slides_blocks_are_skipped_and_never_opened(tmp_path: Path, works: list[SlideWork]) -> None:
    gone = dataclasses.replace(works[1], path=str(tmp_path / "gone.tif"))  # opening it would fail
    (outcome,), written = _extract(tmp_path / "out", [works[0], gone], [_plan(7, works, PLAN)], frozenset({1}))
    kept = tuple(sb for sb in PLAN if sb[0] == 0)
    assert isinstance(outcome, ShardDone) and outcome.record is not None and outcome.record.slides == 1
    assert _shard(tmp_path / "out" / shard_name(7)) == _expected(works, kept)
    assert outcome.patches_by_slide == {0: sum(len(works[0].blocks[b].patches) for _, b in kept)}
    assert sum(written) == outcome.record.samples


def test_a_shard_of_excluded_slides_only_is_empty_and_not_written(tmp_path: Path, works: list[SlideWork]) -> None:
    outcomes, written = _extract(tmp_path, works, [_plan(7, works, PLAN)], frozenset({0, 1}))
    assert outcomes == [ShardDone(7)]
    assert os.listdir(tmp_path) == [] and sum(written) == 0


def _missing(src: str, dst: Path) -> None:
    del src, dst  # nothing at the path


def _truncated(src: str, dst: Path) -> None:
    shutil.copy(src, dst)
    with open(dst, "r+b") as fh:
        fh.truncate(os.path.getsize(dst) // 3)


def _garbage(src: str, dst: Path) -> None:
    del src
    dst.write_bytes(b"not a slide at all " * 100)


def _zeroed_tiles(src: str, dst: Path) -> None:
    """It opens, but no level-0 tile decodes: the failure comes while a block is read."""
    shutil.copy(src, dst)
    with tifffile.TiffFile(dst) as tif:
        page = tif.pages[0]
        tiles = [(o, n) for o, n in zip(page.dataoffsets, page.databytecounts, strict=True) if n > 0]
    with open(dst, "r+b") as fh:
        for offset, nbytes in tiles:
            fh.seek(offset)
            fh.write(b"\0" * nbytes)


@pytest.mark.parametrize(
    "damage", [_missing, _truncated, _garbage, _zeroed_tiles], ids=["missing", "truncated", "garbage", "zeroed-tiles"]
)
@pytest.mark.parametrize("segment_patches", [10_000, 1], ids=["one-segment", "a-segment-per-block"])
def test_a_failing_slide_drops_its_shard_names_the_slide_and_leaves_no_file(
    tmp_path: Path,
    works: list[SlideWork],
    monkeypatch: pytest.MonkeyPatch,
    segment_patches: int,
    damage: Callable[[str, Path], None],
) -> None:
    monkeypatch.setattr(extract, "SEGMENT_PATCHES", segment_patches)
    broken_path = tmp_path / "broken.tif"
    damage(works[1].path, broken_path)
    slides = [works[0], dataclasses.replace(works[1], path=str(broken_path))]
    out = tmp_path / "out"
    failing = _plan(7, works, ((0, 0), (0, 1), (1, 0), (0, 2)))  # slide 0's samples come before slide 1 breaks
    after = _plan(8, works, ((0, 2), (0, 0)))  # the next shard does not need the broken slide
    (dropped, kept), written = _extract(out, slides, [failing, after])
    assert isinstance(dropped, SlideFailed) and (dropped.index, dropped.slide) == (7, 1)
    assert dropped.reason and "\n" not in dropped.reason
    assert isinstance(kept, ShardDone) and kept.index == 8
    assert kept.record is not None and kept.record.samples == after.patches
    assert sorted(os.listdir(out)) == [index_name(shard_name(8)), shard_name(8)]  # nothing of shard 7, no temp file
    assert sum(written) == after.patches  # what shard 7 had written was taken back


def test_a_crashed_segment_drops_its_shard(
    tmp_path: Path, works: list[SlideWork], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(extract, "SEGMENT_PATCHES", 1)
    sources = {i: SlideSource(w) for i, w in enumerate(works)}
    tasks = segment_tasks(_plan(7, works, PLAN), sources, frozenset(), ENCODE)
    outcomes = [extract_segment(t) for t in tasks]
    outcomes[2] = extract.crashed_segment(tasks[2])  # its worker process died
    written: list[int] = []
    (outcome,) = assemble_shards(iter(outcomes), Destination(str(tmp_path)), written.append)
    assert isinstance(outcome, WorkerDied) and outcome.index == 7
    assert "died" in outcome.reason
    assert os.listdir(tmp_path) == [] and sum(written) == 0


def test_a_scanned_copy_stages_its_blocks_samples_or_nothing_at_all(tmp_path: Path, works: list[SlideWork]) -> None:
    """A slide copied from object storage to be scanned is staged from that copy: each block's samples as reading
    the slide gives them; a copy that cannot be staged leaves no staging file (extraction stages it again)."""
    scratch, url = tmp_path / "scratch", "s3://bucket/slides/b.tif"
    staged = stage_scanned(works[1].path, works[1], 1, url, str(scratch), ENCODE)
    assert staged is not None and len(staged.blocks) == len(works[1].blocks)
    assert all(staged.read(b) == _expected(works, ((1, b),)) for b in range(len(works[1].blocks)))
    broken = tmp_path / "broken.tif"
    _zeroed_tiles(works[1].path, broken)
    assert stage_scanned(str(broken), works[1], 2, url, str(scratch), ENCODE) is None
    assert stage_scanned(str(broken), None, 3, url, str(scratch), ENCODE) is None  # no patches: nothing to stage
    assert os.listdir(scratch / "staging") == [os.path.basename(staged.path)]
