"""What the steps of a build share (:mod:`wsishard.builder.run.buildcontext`): the record of failed slides, and the scan
tasks made from the build's options (:func:`wsishard.builder.scan.scan.scan_tasks`)."""

from __future__ import annotations

import pickle
from pathlib import Path

from wsishard.builder.inputs.staging import Scratch
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.run.buildcontext import Failures
from wsishard.builder.run.state import BuildState
from wsishard.builder.scan.scan import scan_tasks
from wsishard.format import qc_picture_name
from wsishard.storage.output import Destination


def _state(out: Path) -> BuildState:
    return BuildState(Destination(str(out)), "digest")


def test_failures_are_saved_as_they_are_added_and_a_slide_keeps_its_first_reason(tmp_path: Path) -> None:
    failures = Failures(_state(tmp_path / "out"))
    failures.add({})
    assert not (tmp_path / "out" / ".wsishard" / "failed.json").exists()  # nothing new: nothing saved
    failures.add({4: "extraction: broken tile", 2: "cannot be copied to scratch (OSError)"})
    failures.add({4: "the worker process reading it died twice", 9: "truncated"})
    assert failures.reason(4) == "extraction: broken tile" and failures.reason(3) is None
    assert failures.slides == {2, 4, 9} and failures.among([1, 2, 3, 9]) == {2, 9}
    resumed = Failures(_state(tmp_path / "out"))  # a build run again on the same output
    assert resumed.slides == {2, 4, 9} and resumed.reason(4) == "extraction: broken tile"


def test_scan_tasks_carry_each_slides_table_entries_not_the_tables(tmp_path: Path) -> None:
    """The per-slide tables of a large cohort are looked up in the build's process: pickled with every task (for a
    worker process), 30,000 slides' tables would cost about 1.4 MB a task."""
    names = [f"TCGA-{i:05d}" for i in range(30_000)]
    paths = [f"/slides/{name}.svs" for name in names]
    labels = {name: i % 3 for i, name in enumerate(names)}  # by stem
    mpps = {f"{name}.svs": 0.2520 for name in names[::2]}  # by file name; odd slides report their own
    options = BuildOptions(labels=labels, mpp_overrides=mpps, seed=7, qc=True)  # pictures drawn while building
    annotations: list[str | None] = [None] * len(paths)
    annotations[6] = "/annotations/TCGA-00006.geojson"
    dest, scratch = Destination(str(tmp_path)), Scratch(str(tmp_path / "scratch"), {"anon": True}, True)
    five, six = scan_tasks(options, paths, [5, 6], annotations, dest, scratch)
    assert (five.index, five.path, five.slide_id, five.label, five.mpp_override, five.roi_file) == (
        5,
        paths[5],
        "TCGA-00005",
        2,
        None,
        None,
    )
    assert (six.label, six.mpp_override, six.roi_file) == (0, 0.2520, annotations[6])
    assert six.qc_name == qc_picture_name("TCGA-00006") and six.scratch == scratch and six.dest is dest
    assert six.options.seed == 7 and six.options.encode == options.encode and six.options.patch == options.patch
    assert max(len(pickle.dumps(task)) for task in (five, six)) < 20_000
