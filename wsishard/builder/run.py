"""Orchestration: find slides, scan them, plan, extract shards in a process pool, write the manifest last.

``build()`` is the one catch-all boundary of wsishard: a slide's failure anywhere (open, mpp, tissue, a corrupt
tile deep in level 0) is recorded with its reason and every other slide is still built. A slide that fails
during extraction is dropped from every shard it touched (those shards are rewritten), so nothing of a failed
slide is left in the output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wsishard import __version__
from wsishard.builder.extract import (
    SegmentTask,
    ShardOutcome,
    SlideSource,
    assemble_shards,
    crashed_segment,
    extract_segment,
    segment_size,
    segment_tasks,
)
from wsishard.builder.inputs import check_tables, find_slides, lookup
from wsishard.builder.options import BuildOptions, BuildProgress
from wsishard.builder.patches import SlideWork
from wsishard.builder.plan import Plan, ShardPlan, assign_parts, make_plan
from wsishard.builder.pool import WorkerPool
from wsishard.builder.qc_html import INDEX_NAME, qc_index
from wsishard.builder.roi import match_annotations
from wsishard.builder.scan import ScanResult, ScanTask, crashed_scan, scan_slide
from wsishard.builder.staging import StagedSlide, StageTask, crashed_stage, remove_staging, stage_slide
from wsishard.builder.state import BuildState, fingerprint, input_stamps
from wsishard.errors import OptionError
from wsishard.format import Manifest, ShardRecord, SlideRecord, manifest_name, shard_name, temp_target, unique_slide_ids
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions, is_url

logger = logging.getLogger(__name__)

_TAR_BYTES_PER_MEMBER = 512 + 256  # header + mean padding
Extracted = tuple[dict[int, ShardOutcome], dict[int, str]]  # shard outcomes by index, failed slides' reasons


def build(inputs: Sequence[str], output: str, options: BuildOptions | None = None, *,
          progress: ProgressCallback[BuildProgress] = ignore_progress,
          storage_options: StorageOptions | None = None,
          part: tuple[int, int] | None = None, overwrite: bool = False,
          scratch: str | None = None) -> Manifest:  # fmt: skip
    """Build mixed tissue-patch shards from slides into ``output`` and return the manifest it wrote.

    Re-running the same build on the same output resumes it: finished shards are kept, the rest is written.

    Args:
        inputs: slide folders, slide files, or text files listing slides.
        output: local folder or fsspec URL prefix (``s3://bucket/prefix``).
        options: every build option (defaults: :class:`BuildOptions`).
        progress: called after each slide scanned and each shard written.
        storage_options: fsspec options for an URL output (endpoint, credentials); never logged or stored.
        part: ``(i, n)``, 1-based: build only part ``i`` of ``n`` (whole groups, balanced by patches) and write
            a part manifest; :func:`wsishard.merge.merge` joins the parts.
        overwrite: replace a build with other inputs or options (or slides changed since) found in ``output``
            instead of refusing; only that build's own files are removed, never anything else there.
        scratch: local folder for copies of slides given as URLs (default: a temporary folder); it holds at most
            one slide per worker, plus one group's staged patches.

    Raises:
        OptionError: bad inputs (nothing found, a missing path), a bad ``part``, or ``output`` holding another
            build, slides changed since its build began, files that are not a build's, or being written by
            another build right now. Bad slides never raise: they are failed records.
        OutputError: ``output`` cannot be written (permissions, a full disk): the build stops.
    """
    options = options or BuildOptions()
    if part is not None and not 1 <= part[0] <= part[1]:
        raise OptionError(f"invalid part {part[0]}/{part[1]}: need 1 <= i <= n")
    paths = find_slides(inputs, storage_options)
    check_tables(paths, options)  # warnings logged; an OptionError before anything is written
    dest = Destination(output, storage_options)
    dest.makedirs()
    state = BuildState(dest, fingerprint(paths, _options_dict(options, for_fingerprint=True)), part)
    jobs = options.jobs or os.cpu_count() or 1
    with state.lock():  # one build (or the parts of one) at a time; released on errors and interrupts too
        state.claim(overwrite=overwrite, stamps=input_stamps(paths, storage_options))
        with _scratch_for(paths, scratch, storage_options) as remote, WorkerPool(jobs) as pool:
            scans = state.load_scans(options.patch.block_patches)
            if scans is None:
                scans = _scan_all(pool, paths, dest, options, state.refreshing(progress), remote)
                state.save_scans(scans)
            plan = make_plan([s.block_sizes for s in scans], samples_per_shard=_samples_per_shard(options, scans),
                             group_slides=options.group_slides, seed=options.seed)  # fmt: skip
            groups = _part_groups(plan, part)
            shards = [sp for sp in plan.shards if sp.group in groups]
            _remove_leftovers(dest, {shard_name(sp.index) for sp in shards})
            tally = _Tally(progress, len(shards), sum(sp.patches for sp in shards))
            if remote.from_urls:
                outcomes, failed = _extract_staged(pool, shards, scans, dest, options, tally, state, remote)
            else:
                outcomes, failed = _extract_all(pool, shards, scans, dest, options, tally, state)
        slides = _slides_of_part(plan, groups, len(scans), part)
        manifest = _manifest(inputs, options, scans, outcomes, failed, state.digest, slides, part)
        dest.write_bytes(manifest_name(part), manifest.to_json().encode())
        if options.qc and part is None:  # a cluster build's parts would overwrite each other's: inspect --html
            dest.write_bytes(INDEX_NAME, qc_index(manifest).encode())
    return manifest


def _part_groups(plan: Plan, part: tuple[int, int] | None) -> set[int]:
    if part is None:
        return set(range(len(plan.groups)))
    patches = [sum(sp.patches for sp in plan.shards if sp.group == g) for g in range(len(plan.groups))]
    return {g for g, p in enumerate(assign_parts(patches, part[1])) if p == part[0] - 1}


def _slides_of_part(plan: Plan, groups: set[int], n_slides: int, part: tuple[int, int] | None) -> list[int]:
    """Slides a (part) manifest lists: its groups' slides; part 1 also lists slides in no group (failed)."""
    grouped = {s for g in plan.groups for s in g}
    mine = {s for g in groups for s in plan.groups[g]}
    if part is None or part[0] == 1:
        mine |= set(range(n_slides)) - grouped
    return sorted(mine)


@dataclass(frozen=True)
class _Scratch:
    """Where slides given as URLs are copied and staged, and the options to fetch them."""

    scratch: str
    storage_options: dict[str, Any]
    from_urls: bool  # some slides are URLs: they are copied to scratch and staged


@contextlib.contextmanager
def _scratch_for(paths: list[str], scratch: str | None, storage_options: StorageOptions | None) -> Iterator[_Scratch]:
    """The scratch space of a build: ``scratch``, or a temporary folder (removed after) when slides are URLs."""
    from_urls = any(is_url(p) for p in paths)
    made = tempfile.mkdtemp(prefix="wsishard-scratch-") if from_urls and scratch is None else None
    try:
        yield _Scratch(made or scratch or "", dict(storage_options or {}), from_urls)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def _scan_all(pool: WorkerPool, paths: list[str], dest: Destination, options: BuildOptions,
              progress: ProgressCallback[BuildProgress], remote: _Scratch) -> list[ScanResult]:  # fmt: skip
    ids = unique_slide_ids(paths)
    annotations = match_annotations(options.roi.path, paths)
    if options.qc:
        dest.makedirs("qc")
    tasks = [
        ScanTask(index=i, path=p, slide_id=sid, patch=options.patch, tissue=options.tissue, encode=options.encode,
                 measure=options.shard_size_bytes is not None, mpp_override=lookup(options.mpp_overrides, p),
                 default_mpp=options.default_mpp, label=lookup(options.labels, p), seed=options.seed, dest=dest,
                 qc_name=f"qc/{sid}.png" if options.qc else None, qc_size_px=options.qc_size_px, scratch=remote.scratch,
                 storage_options=remote.storage_options, roi=options.roi, roi_file=annotations[i])
        for i, (p, sid) in enumerate(zip(paths, ids, strict=True))
    ]  # fmt: skip
    scans = []
    for result in pool.imap(scan_slide, tasks, on_crash=crashed_scan):
        scans.append(result)
        progress(BuildProgress("scan", len(scans), len(tasks)))
    return scans


def _samples_per_shard(options: BuildOptions, scans: list[ScanResult]) -> int:
    limits = [options.shard_samples] if options.shard_samples else []
    measured = [s.bytes_per_patch for s in scans if s.bytes_per_patch]
    if options.shard_size_bytes and measured:
        members = 3 if options.class_names else 2
        per_sample = sum(measured) / len(measured) + members * _TAR_BYTES_PER_MEMBER
        limits.append(max(options.patch.block_patches**2, int(options.shard_size_bytes // per_sample)))
    return min(limits) if limits else 2**31


@dataclass
class _Tally:
    """Shards and patches written so far, against the whole build's (or part's) totals; reports each change."""

    progress: ProgressCallback[BuildProgress]
    shards_total: int
    patches_total: int
    shards: int = 0
    patches: int = 0

    def written(self, samples: int) -> None:
        self.patches += samples
        self.report()

    def finished(self, outcome: ShardOutcome, sign: int = 1, *, with_samples: bool = False) -> None:
        """A shard done (``sign`` -1: undone); its samples count too unless :meth:`written` counted them."""
        self.shards += sign
        self.patches += sign * (outcome.record.samples if outcome.record and with_samples else 0)

    def report(self) -> None:
        self.progress(BuildProgress("extract", self.shards, self.shards_total, self.patches, self.patches_total))


def _work(scan: ScanResult) -> SlideWork | None:
    record = scan.record
    if scan.cands is None:
        return None
    return SlideWork(path=record.file, slide_id=record.slide_id, level=record.level or 0, mpp=record.patch_mpp or 0,
                     cands=scan.cands, blocks=scan.blocks, label=record.label)  # fmt: skip


def _extract_staged(pool: WorkerPool, shards: list[ShardPlan], scans: list[ScanResult], dest: Destination,
                    options: BuildOptions, tally: _Tally, state: BuildState,
                    remote: _Scratch) -> Extracted:  # fmt: skip
    """Slides in object storage, group by group: stage each slide's patches once, then write the group's shards."""
    outcomes: dict[int, ShardOutcome] = {}
    previous = state.load_done()
    for g in sorted({sp.group for sp in shards}):
        mine = [sp for sp in shards if sp.group == g]
        failed = state.load_failed()
        todo = [sp for sp in mine if sp.index not in _still_valid(previous, mine, failed)]
        wanted = sorted({s for sp in todo for s, _ in sp.blocks} - set(failed))
        tasks = [StageTask(index=s, url=scans[s].record.file, work=work, scratch=remote.scratch,
                           storage_options=remote.storage_options, encode=options.encode)
                 for s in wanted if (work := _work(scans[s])) is not None]  # fmt: skip
        staged: dict[int, StagedSlide] = {}
        for result in pool.imap(stage_slide, tasks, on_crash=crashed_stage):
            if result.staged is None:
                failed[result.index] = result.reason
            else:
                staged[result.index] = result.staged
        state.save_failed(failed)
        done, _ = _extract_all(pool, mine, scans, dest, options, tally, state, staged)
        outcomes.update(done)
        remove_staging(remote.scratch)
    return outcomes, state.load_failed()


def _extract_all(pool: WorkerPool, shards: list[ShardPlan], scans: list[ScanResult], dest: Destination,
                 options: BuildOptions, tally: _Tally, state: BuildState,
                 staged: dict[int, StagedSlide] | None = None) -> Extracted:  # fmt: skip
    """Write the shards not already done; a slide failing mid-way is excluded and the shards it touched redone."""
    sources = {i: SlideSource(work, (staged or {}).get(i)) for i, s in enumerate(scans) if (work := _work(s))}
    failed = state.load_failed()
    done = _still_valid(state.load_done(), shards, failed)
    for outcome in done.values():
        tally.finished(outcome, with_samples=True)
    by_index = {sp.index: sp for sp in shards}
    pending = [sp for sp in shards if sp.index not in done]
    while pending:
        excluded = frozenset(failed)
        size = segment_size(sum(sp.patches for sp in pending), pool.jobs)
        tasks = [t for sp in pending for t in segment_tasks(sp, sources, excluded, options.encode, size)]
        segments = pool.imap(extract_segment, tasks, on_crash=crashed_segment, window=4 * pool.jobs)
        new_failed: dict[int, str] = {}
        for outcome in assemble_shards(segments, dest, tally.written):
            if outcome.failed_slide is None:
                done[outcome.index] = outcome
                tally.finished(outcome)
                state.save_done(outcome, shard_name(outcome.index), _excluded(by_index[outcome.index], failed))
            elif outcome.failed_slide >= 0:
                new_failed.setdefault(outcome.failed_slide, outcome.reason)
            else:
                new_failed.update(_crash_culprits(pool, by_index[outcome.index], sources, excluded, options))
        failed.update(new_failed)
        if new_failed:
            state.save_failed(failed)
        pending = [sp for sp in shards if any(s in new_failed for s, _ in sp.blocks)]
        for sp in pending:  # rewritten without the failed slides, or gone if nothing else was in them
            stale = done.pop(sp.index, None)
            if stale is not None:
                tally.finished(stale, -1, with_samples=True)
    for sp in shards:
        if done[sp.index].record is None:
            dest.remove(shard_name(sp.index))  # a shard left empty: no file (an earlier run may have written one)
    return done, failed


def _crash_culprits(pool: WorkerPool, sp: ShardPlan, sources: dict[int, SlideSource], excluded: frozenset[int],
                    options: BuildOptions) -> dict[int, str]:  # fmt: skip
    """The slides of a shard whose reading kills a worker process, found by reading each one's blocks alone."""
    slides = sorted({s for s, _ in sp.blocks} - excluded)
    probes = [
        SegmentTask(shard=sp.index, segment=0, last=True, blocks=tuple(b for b in sp.blocks if b[0] == s),
                    slides={s: sources[s]}, excluded=excluded, encode=options.encode)
        for s in slides
    ]  # fmt: skip
    outcomes = pool.imap(extract_segment, probes, on_crash=crashed_segment, window=1)
    crashed = [s for s, outcome in zip(slides, outcomes, strict=True) if outcome.crashed]
    reason = "the worker process reading it died twice (killed: out of memory?)"
    if not crashed:  # no single slide kills a worker: rather than retry for ever, none of them is kept
        reason = f"a worker process died twice writing shard {sp.index} and no single slide of it could be blamed"
    return dict.fromkeys(crashed or slides, reason)


def _excluded(sp: ShardPlan, failed: Mapping[int, str]) -> frozenset[int]:
    return frozenset(s for s, _ in sp.blocks if s in failed)


def _still_valid(previous: dict[int, tuple[ShardOutcome, frozenset[int]]], shards: list[ShardPlan],
                 failed: Mapping[int, str]) -> dict[int, ShardOutcome]:  # fmt: skip
    """Shards an earlier run finished that need no redo: written with the same slides excluded as now."""
    return {
        sp.index: previous[sp.index][0]
        for sp in shards
        if sp.index in previous and previous[sp.index][1] == _excluded(sp, failed)
    }


def _manifest(inputs: Sequence[str], options: BuildOptions, scans: list[ScanResult],
              outcomes: dict[int, ShardOutcome], failed: dict[int, str], digest: str, slide_indices: list[int],
              part: tuple[int, int] | None) -> Manifest:  # fmt: skip
    patches: dict[int, int] = {}
    for outcome in outcomes.values():
        for slide, n in (outcome.patches_by_slide or {}).items():
            patches[slide] = patches.get(slide, 0) + n
    slides: list[SlideRecord] = []
    for i in slide_indices:
        record = scans[i].record
        if i in failed:
            record = dataclasses.replace(record, status="failed", reason=f"extraction: {failed[i]}", patches=0)
        elif record.status == "ok":  # planned patches not written were left out by the quality filters
            quality = len(scans[i].cands or ()) - patches.get(i, 0)
            filtered = {**record.filtered, **({"quality": quality} if quality > 0 else {})}
            record = dataclasses.replace(record, patches=patches.get(i, 0), filtered=filtered)
        slides.append(record)
    shards: list[ShardRecord] = [o.record for _, o in sorted(outcomes.items()) if o.record is not None]
    extra: dict[str, Any] = {"fingerprint": digest}
    if options.class_names:
        extra["label_names"] = list(options.class_names)
    if part is not None:
        extra.update(part=list(part), slide_indices=slide_indices, slides_total=len(scans))
    return Manifest(
        options={"inputs": list(inputs), **_options_dict(options)}, shards=shards, slides=slides,
        image_format=options.image_format, wsishard_version=__version__, extra=extra,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )  # fmt: skip


def _options_dict(options: BuildOptions, *, for_fingerprint: bool = False) -> dict[str, Any]:
    """Every option as plain data; the fingerprint leaves out what does not change the output (``jobs``)."""
    data = dataclasses.asdict(options)
    data["mpp_overrides"] = dict(options.mpp_overrides)
    data["labels"] = dict(options.labels)
    data["label_names"] = list(options.label_names)
    if for_fingerprint:
        data.pop("jobs")
        data.pop("require_labels")  # a check, not a change to the output
    return data


def _remove_leftovers(dest: Destination, names: set[str]) -> None:
    """Remove temporary files an interrupted local build left for ``names`` (only this run's shards: other parts
    of a cluster build may be writing theirs into the same folder right now)."""
    if not dest.remote:
        for name in dest.listdir():
            if temp_target(name) in names:
                dest.remove(name)
