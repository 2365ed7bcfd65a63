"""Extraction below the shard: a one-shard build is cut into segments, byte-identical whatever --jobs."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from wsishard.builder.extract.extract import SEGMENT_PATCHES, SlideSource, segment_tasks
from wsishard.builder.extract.patches import EncodeOptions, SlideWork
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.plan.plan import make_plan
from wsishard.builder.run.orchestrate import build
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.scan.scan import ScanResult
from wsishard.testing.synthetic import make_slides

SMALL = PatchOptions(target_mpp=0.5, patch_size_px=64)


def test_a_one_shard_build_is_the_same_bytes_with_one_and_two_jobs(tmp_path: Path) -> None:
    make_slides(tmp_path / "in", 3, seed=2, width=3072, height=3072, mpp=0.2631)  # GT450: non-integer scale
    shas = []
    for jobs in (1, 2):
        manifest = build([str(tmp_path / "in")], str(tmp_path / f"out{jobs}"), BuildOptions(patch=SMALL, jobs=jobs))
        assert len(manifest.shards) == 1 and manifest.total_samples > 2 * SEGMENT_PATCHES  # several segments
        data = (tmp_path / f"out{jobs}" / manifest.shards[0].name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest.shards[0].sha256
        shas.append(manifest.shards[0].sha256)
        assert {s.patch_mpp for s in manifest.slides} == {0.5}  # exact resolution from a 0.2631 mpp scanner
    assert shas[0] == shas[1]


def test_segments_cover_a_shard_in_order_in_whole_blocks(cohort: Path, tmp_path: Path) -> None:
    from wsishard.builder.run.state import BuildState
    from wsishard.storage.output import Destination

    build([str(cohort)], str(tmp_path / "out"), BuildOptions(patch=SMALL, jobs=1, qc=False))
    store = BuildState(Destination(str(tmp_path / "out")), "").scans
    found = store.load_many(sorted(store.scanned()), 4)
    assert sorted(found) == list(range(len(found))) and found
    scans = [found[i] for i in range(len(found))]
    plan = make_plan([s.block_sizes for s in scans], samples_per_shard=2**31, group_slides=32, seed=0)
    sources = {i: SlideSource(_work(s)) for i, s in enumerate(scans) if s.cands is not None}
    for sp in plan.shards:
        tasks = segment_tasks(sp, sources, frozenset(), EncodeOptions())
        assert len(tasks) >= 2 and tasks[-1].last and not any(t.last for t in tasks[:-1])
        assert [b for t in tasks for b in t.blocks] == list(sp.blocks)  # every block once, in plan order
        sizes = [sum(len(sources[s].work.blocks[b].patches) for s, b in t.blocks) for t in tasks]
        assert all(SEGMENT_PATCHES <= n < SEGMENT_PATCHES + 16 for n in sizes[:-1])  # whole blocks of <= 16
        tapered = segment_tasks(sp, sources, frozenset(), EncodeOptions(), 128, taper=200)  # the end 4x finer
        assert [b for t in tapered for b in t.blocks] == list(sp.blocks) and tapered[-1].last
        sizes = [sum(len(sources[s].work.blocks[b].patches) for s, b in t.blocks) for t in tapered]
        ends = np.cumsum(sizes)
        head = [n for n, end in zip(sizes, ends, strict=True) if sp.patches - (end - n) > 200]
        tail = sizes[len(head) :]
        assert all(128 <= n < 128 + 16 for n in head[:-1]) and all(n < 32 + 16 for n in tail[:-1])
        assert sum(tail) >= 200 - (32 + 16) and len(tail) >= 3  # the zone starts at most one fine segment late


def _work(scan: ScanResult) -> SlideWork:
    assert scan.cands is not None
    r = scan.record
    return SlideWork(
        path=r.file,
        slide_id=r.slide_id,
        level=r.level or 0,
        patch_mpp=r.patch_mpp or 0,
        cands=scan.cands,
        blocks=scan.blocks,
        label=r.label,
    )
