"""Cluster builds whose parts read only their own slides, scan state saved slide by slide, and the version-2
manifest (shard index in ``manifest.json``, slide records in ``slides.jsonl``)."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest
from buildtools import SMALL_BUILD, read_output

from wsishard.builder.inputs.sources import find_slides
from wsishard.builder.options.buildopts import BuildProgress
from wsishard.builder.plan.plan import make_groups, part_groups
from wsishard.builder.qc.qcdraw import draw_pictures
from wsishard.builder.run.merge import merge
from wsishard.builder.run.orchestrate import build
from wsishard.errors import ManifestError
from wsishard.format import MANIFEST_NAME, SLIDES_NAME, unique_slide_ids
from wsishard.manifest import Manifest, parse_slide_lines
from wsishard.shards.summary import SUMMARY_NAME, Summary
from wsishard.storage.opener import load_manifest
from wsishard.testing.synthetic import make_slides

OPTS = dataclasses.replace(SMALL_BUILD, jobs=1)


def _scanned(out: Path) -> list[int]:
    return sorted(int(n.split(".")[0]) for n in os.listdir(out / ".wsishard" / "scan") if not n.startswith("."))


def _same(a: Path, b: Path) -> None:
    ma, sa = read_output(str(a))
    mb, sb = read_output(str(b))
    assert [(s.name, s.sha256, s.samples, s.bytes) for s in ma.shards] == [
        (s.name, s.sha256, s.samples, s.bytes) for s in mb.shards
    ]
    assert ma.slides == mb.slides and [s.key for s in sa] == [s.key for s in sb]
    assert (a / SLIDES_NAME).read_bytes() == (b / SLIDES_NAME).read_bytes()
    sum_a, sum_b = (Summary.from_bytes((out / SUMMARY_NAME).read_bytes()) for out in (a, b))  # the index summary too
    assert all(
        np.array_equal(getattr(sum_a, f), getattr(sum_b, f))
        for f in ("shards", "label_counts", "slides", "slide_ptr", "slide_index", "slide_count")
    )


def test_a_part_scans_only_its_own_slides_and_two_parts_merge_to_the_one_machine_build(
    cohort: Path, cohort_build: Path, tmp_path: Path
) -> None:
    paths = find_slides([str(cohort)])
    groups = make_groups(len(paths), OPTS.group_slides, OPTS.seed)
    sizes = [os.path.getsize(p) for p in paths]
    out = tmp_path / "out"
    first = build([str(cohort)], str(out), OPTS, part=(1, 2))
    mine = sorted(s for g in part_groups(groups, sizes, (1, 2)) for s in groups[g])
    assert 0 < len(mine) < len(paths)
    assert _scanned(out) == mine  # part 1 scanned its slides, none of part 2's
    ids = unique_slide_ids(paths)
    assert not (out / "qc").exists()  # drawn on demand: a part's own pictures, and no review page (issue 33)
    assert draw_pictures(first, str(out), jobs=1).from_slides == len(mine)
    assert sorted(os.listdir(out / "qc")) == sorted(f"{ids[i]}.png" for i in mine)
    assert [s.slide_id for s in first.slides] == [ids[i] for i in mine]
    assert first.extra["slide_indices"] == mine
    build([str(cohort)], str(out), OPTS, part=(2, 2))
    assert _scanned(out) == list(range(len(paths)))
    merged = merge(str(out))
    assert len(merged.slides) == len(paths)
    _same(out, cohort_build)


def test_a_build_stopped_mid_scan_rescans_only_the_slides_not_saved(
    cohort: Path, cohort_build: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"

    class Stop(Exception):
        pass

    def stop_after_three(event: BuildProgress) -> None:
        if event.stage == "scan" and event.done == 3:
            raise Stop

    with pytest.raises(Stop):
        build([str(cohort)], str(out), OPTS, progress=stop_after_three)
    saved = {n: (out / ".wsishard" / "scan" / n).stat().st_mtime_ns for n in os.listdir(out / ".wsishard" / "scan")}
    assert len(saved) == 3 and not (out / MANIFEST_NAME).exists()
    events: list[BuildProgress] = []
    build([str(cohort)], str(out), OPTS, progress=events.append)
    scans = [e for e in events if e.stage == "scan"]
    assert (scans[0].done, scans[-1].done, len(scans)) == (3, 8, 6)  # 3 found saved, 5 scanned now
    assert {n: (out / ".wsishard" / "scan" / n).stat().st_mtime_ns for n in saved} == saved  # not scanned again
    _same(out, cohort_build)


def test_the_manifest_holds_the_shard_index_and_the_slide_records_lie_beside_it(cohort_build: Path) -> None:
    head = json.loads((cohort_build / MANIFEST_NAME).read_text())
    assert (head["format"], head["version"], head["slides_file"]) == ("wsishard", 3, SLIDES_NAME)
    assert "slides" not in head and head["totals"]["slides"] == 8
    assert set(head["shards"][0]) == {"name", "samples", "bytes", "sha256", "slides", "index_sha256"}
    records = parse_slide_lines((cohort_build / SLIDES_NAME).read_text())
    assert len(records) == len((cohort_build / SLIDES_NAME).read_text().splitlines()) == 8
    index, _ = load_manifest(str(cohort_build), slides=False)  # what a stream reads at start-up
    full, _ = load_manifest(str(cohort_build))
    assert index.slides == [] and index.shards == full.shards and full.slides == records


def test_a_version_1_output_is_still_read(cohort_build: Path, tmp_path: Path) -> None:
    full, _ = load_manifest(str(cohort_build))
    v1 = Manifest(options=full.options, shards=full.shards, slides=full.slides, version=1).to_dict()
    assert "slides" in v1 and v1["version"] == 1  # records inline, as version 1 wrote them
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(v1))
    back, root = load_manifest(str(tmp_path))
    assert (back.version, back.shards, back.slides, root) == (1, full.shards, full.slides, str(tmp_path))
    v1.pop("slides")
    (tmp_path / MANIFEST_NAME).write_text(json.dumps(v1))
    with pytest.raises(ManifestError, match="malformed"):
        load_manifest(str(tmp_path))


def test_a_part_that_gets_no_group_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    make_slides(tmp_path / "in", 2, seed=4, width=1024, height=1024)
    opts = dataclasses.replace(OPTS, group_slides=64)
    with caplog.at_level("WARNING", logger="wsishard"):
        manifest = build([str(tmp_path / "in")], str(tmp_path / "out"), opts, part=(2, 2))
    assert manifest.slides == [] and manifest.shards == []
    assert (
        "part 2/2 got no group of slides, so it builds nothing: the 2 slides make 1 group of at most "
        "--group-slides 64 slides"
    ) in caplog.text
    assert "--group-slides 1 gives each of 2 parts a group" in caplog.text
