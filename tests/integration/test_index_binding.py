"""The per-sample index bound to its shard (issue 42): the manifest records each ``.idx.npz``'s digest and the
summary's; a swapped, foreign or edited index is a named error at stream time and a problem in ``verify``, never
samples silently dropped; an output whose manifest binds nothing (built before) is still checked by counts and keys;
a re-run of a build writes a deleted index again."""

from __future__ import annotations

import dataclasses
import io
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardmaker as sm
from buildtools import SMALL_BUILD

from wsishard.builder.run.orchestrate import build
from wsishard.errors import IndexFileError, ShardError
from wsishard.shards.index import index_name, load_index
from wsishard.shards.summary import SUMMARY_NAME, Summary, index_build
from wsishard.shards.verify import verify
from wsishard.storage.opener import load_manifest
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World

COUNTS = (40, 40, 40, 31)  # shards 0-2 of the same length: their indexes can be swapped
LABELS = (0, 0, 0, 0, 1)
ONE = World(rank=0, world_size=1)


def _made(root: Path, prefix: str = "slide") -> sm.Output:
    out = sm.make_output(str(root), COUNTS, slides=5, slide_labels=LABELS, slide_prefix=prefix)
    index_build(out.root)
    return out


@pytest.fixture
def bound(tmp_path: Path) -> sm.Output:
    return _made(tmp_path / "out")


def _idx(out: sm.Output, s: int) -> Path:
    return Path(out.root) / index_name(out.manifest.shards[s].name)


def _rewrite_npz(path: Path, **arrays: np.ndarray) -> None:
    with np.load(path, allow_pickle=False) as npz:
        data = {name: npz[name] for name in npz.files}
    buf = io.BytesIO()
    np.savez_compressed(buf, **{**data, **arrays})
    path.write_bytes(buf.getvalue())


def _selected_epoch(root: str) -> list[Any]:
    ds = stream(root, batch_size=4, resampled=False, select=lambda t: t["label"] >= 0, pad_last=True, world=ONE)
    return list(ds)


def _weighted(root: str, batches: int = 40) -> list[Any]:
    return list(itertools.islice(stream(root, batch_size=4, weights="class", world=ONE), batches))


def _problems(root: str) -> str:
    report = verify(root)
    assert not report.ok
    return "\n".join(f"{name}: {reason}" for name, reason in report.problems)


def test_a_bound_output_streams_every_selected_sample_and_verifies(bound: sm.Output) -> None:
    manifest, _ = load_manifest(bound.root)
    assert all(len(rec.index_sha256) == 64 for rec in manifest.shards) and len(manifest.index_sha256) == 64
    batches = _selected_epoch(bound.root)
    assert sum(int(b["valid"].sum()) for b in batches) == sum(COUNTS)
    assert verify(bound.root).ok


def test_swapped_indexes_of_the_same_length_are_refused_by_the_stream_and_verify(bound: sm.Output) -> None:
    a, b = _idx(bound, 0), _idx(bound, 1)
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    with pytest.raises(IndexFileError, match=rf"^index .*{a.name}: is not the index the build wrote") as caught:
        _selected_epoch(bound.root)
    assert isinstance(caught.value, ShardError)
    with pytest.raises(IndexFileError, match=r"\.idx\.npz: is not the index the build wrote"):
        _weighted(bound.root)  # class weights read the indexes in the reader, not in a scan
    problems = _problems(bound.root)
    assert f"{bound.manifest.shards[0].name}: its index {a.name} is not the one the build wrote" in problems
    assert "lists other sample keys than the shard holds" in problems


def test_an_index_from_another_build_is_refused(bound: sm.Output, tmp_path: Path) -> None:
    other = _made(tmp_path / "other", prefix="case")  # the same counts, other slides
    shutil.copyfile(_idx(other, 2), _idx(bound, 2))
    with pytest.raises(IndexFileError, match=rf"{_idx(bound, 2).name}: is not the index the build wrote"):
        _selected_epoch(bound.root)
    assert "its index" in _problems(bound.root)


def test_edited_keys_are_refused(bound: sm.Output) -> None:
    path = _idx(bound, 3)
    with np.load(path, allow_pickle=False) as npz:
        keys = npz["key"].copy()
    keys[[0, 1]] = keys[[1, 0]]
    _rewrite_npz(path, key=keys)
    with pytest.raises(IndexFileError, match=rf"{path.name}: is not the index the build wrote"):
        _selected_epoch(bound.root)
    assert "lists other sample keys than the shard holds" in _problems(bound.root)


def test_edited_label_counts_of_the_summary_are_refused(bound: sm.Output) -> None:
    path = Path(bound.root) / SUMMARY_NAME
    summary = Summary.from_bytes(path.read_bytes())
    counts = summary.label_counts.copy()
    counts[0] = counts[0][::-1]  # the same total: 1273:7 in the issue
    assert not np.array_equal(counts, summary.label_counts)
    path.write_bytes(dataclasses.replace(summary, label_counts=counts).to_bytes())
    with pytest.raises(IndexFileError, match=rf"^index .*{SUMMARY_NAME}: is not the summary the build wrote"):
        _weighted(bound.root)
    problems = _problems(bound.root)
    assert f"{SUMMARY_NAME}: is not the summary the build wrote" in problems
    assert "label or slide counts differ" in problems


def _unbind(out: sm.Output) -> None:
    """The manifest as a wsishard before the binding wrote it: no digests."""
    path = Path(out.root) / "manifest.json"
    data = json.loads(path.read_text())
    data.pop("index_sha256", None)
    for rec in data["shards"]:
        rec.pop("index_sha256", None)
    path.write_text(json.dumps(data))


def test_an_unbound_manifest_streams_and_still_checks_counts_and_keys(bound: sm.Output) -> None:
    _unbind(bound)
    assert sum(int(b["valid"].sum()) for b in _selected_epoch(bound.root)) == sum(COUNTS)
    assert verify(bound.root).ok
    a, b = _idx(bound, 0), _idx(bound, 3)  # 40 and 31 samples
    a.write_bytes(b.read_bytes())
    with pytest.raises(IndexFileError, match=rf"{a.name}: indexes 31 samples, the manifest says its shard holds 40"):
        _selected_epoch(bound.root)
    path = Path(bound.root) / SUMMARY_NAME  # counts moved between shards, the same total
    summary = Summary.from_bytes(path.read_bytes())
    counts = summary.label_counts.copy()
    counts[0, 0] -= 1
    counts[1, 0] += 1
    path.write_bytes(dataclasses.replace(summary, label_counts=counts).to_bytes())
    with pytest.raises(IndexFileError, match=rf"{SUMMARY_NAME}: counts 39 samples in shard-\S+, the manifest 40"):
        _weighted(bound.root)
    problems = _problems(bound.root)
    assert "lists 31 samples, the manifest says 40" in problems and "counts other samples" in problems


def test_a_build_records_its_index_digests_and_a_rerun_writes_a_deleted_index_again(
    cohort: Path, cohort_build: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    shutil.copytree(cohort_build, out)
    manifest, _ = load_manifest(str(out))
    assert all(load_index((out / index_name(r.name)).read_bytes()).digest == r.index_sha256 for r in manifest.shards)
    assert Summary.from_bytes((out / SUMMARY_NAME).read_bytes()).digest() == manifest.index_sha256
    lost = out / index_name(manifest.shards[1].name)
    lost.unlink()
    assert "is missing" in _problems(str(out))
    with caplog.at_level("WARNING"):
        again = build([str(cohort)], str(out), dataclasses.replace(SMALL_BUILD, jobs=1))
    assert f"{manifest.shards[1].name} had no index" in caplog.text
    assert lost.exists() and load_index(lost.read_bytes()).digest == manifest.shards[1].index_sha256
    assert again.shards == manifest.shards and again.index_sha256 == manifest.index_sha256
    assert verify(str(out)).ok


def test_a_shard_replaced_under_its_index_is_an_error_not_a_silent_drop(bound: sm.Output, tmp_path: Path) -> None:
    """The same class of failure the other way round: the index intact, the shard another of the same count."""
    other = _made(tmp_path / "other", prefix="case")
    name = bound.manifest.shards[1].name
    shutil.copyfile(Path(other.root) / name, Path(bound.root) / name)
    with pytest.raises(ShardError, match=rf"{name}: lacks 40 sample\(s\) its index lists"):
        _selected_epoch(bound.root)
    assert "sha256 differs from the manifest" in _problems(bound.root)


def test_an_index_whose_label_column_disagrees_with_its_own_counts_is_refused(bound: sm.Output) -> None:
    """Without a digest (an older build) an edited label column still shows against the index's own counts."""
    _unbind(bound)
    path = _idx(bound, 0)
    with np.load(path, allow_pickle=False) as npz:
        labels = npz["label"].copy()
    labels[labels == 0] = 1
    _rewrite_npz(path, label=labels)
    with pytest.raises(IndexFileError, match=rf"{path.name}: its label counts differ from its label column"):
        _selected_epoch(bound.root)
    assert "its label counts differ from its label column" in _problems(bound.root)


def _split_scan(out: sm.Output, select: Any) -> list[str]:
    """``plan_sampling`` as 2 ranks of a split scan would run it, in 2 threads whose sum waits for both: what each
    raised."""
    import threading

    from wsishard.storage.opener import StreamOpener
    from wsishard.streaming.selection import Source, plan_sampling

    manifest, root = load_manifest(out.root, slides=False)
    barrier, parts, errors = threading.Barrier(2, timeout=30), [None, None], ["", ""]

    def rank(r: int) -> None:
        def total(a: np.ndarray) -> np.ndarray:
            parts[r] = a
            barrier.wait()
            return parts[0] + parts[1]  # type: ignore[operator]

        try:
            plan_sampling(
                [Source(root, manifest, root)],
                select=select,
                weights=None,
                proportions=None,
                storage_options=None,
                opener=StreamOpener(),
                share=(r, 2, total),
            )
        except Exception as exc:  # whatever a rank raises, the test names it
            errors[r] = f"{type(exc).__name__}: {exc}"

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hangs in the scan's sum"
    return errors


def test_a_select_failing_on_one_rank_of_a_split_scan_is_raised_on_both(bound: sm.Output) -> None:
    bad = bound.manifest.shards[1].name  # rank 1's

    def select(t: Any) -> np.ndarray:
        return t["label"] >= 0 if t["shard"][0] != bad else t["label"]  # int64 there: not a mask

    errors = _split_scan(bound, select)
    assert errors[1].startswith("ValueError: select= must return a bool array") and index_name(bad) in errors[1]
    assert errors[0] == (
        f"ValueError: rank 1 failed scanning {Path(bound.root) / index_name(bad)} (select= or weights=: its error "
        "says why)"
    )
    assert _split_scan(bound, lambda t: t["label"] >= 0) == ["", ""]


def test_any_error_of_a_select_on_one_rank_of_a_split_scan_reaches_both(bound: sm.Output) -> None:
    """Review of the merge: the scan carried only ShardError and ValueError to the other ranks; a select raising
    anything else (a KeyError for a misspelt column) left its rank before the sum and the other waited in it."""
    bad = bound.manifest.shards[1].name  # rank 1's

    def select(t: Any) -> np.ndarray:
        return t["label"] >= 0 if t["shard"][0] != bad else t["tisue"]  # misspelt: KeyError

    errors = _split_scan(bound, select)
    assert errors[1].startswith("KeyError: 'tisue'"), errors
    assert errors[0].startswith("ValueError: rank 1 failed scanning"), errors
