"""Orchestration: find slides, scan them, plan, extract shards in a process pool, write the manifest last.

``build()`` is the one catch-all boundary of wsishard: a slide's failure anywhere (open, mpp, tissue, a corrupt
tile deep in level 0) is recorded with its reason and every other slide is still built. A slide that fails
during extraction is dropped from every shard it touched (those shards are rewritten), so nothing of a failed
slide is left in the output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from wsishard.builder.extract import (
    ShardOutcome,
    SlideSource,
    assemble_shards,
    crash_culprits,
    crashed_segment,
    extract_segment,
    segment_size,
    segment_tasks,
)
from wsishard.builder.inputs import check_tables, find_slides, lookup
from wsishard.builder.keywords import build_arguments
from wsishard.builder.options import BuildOptions, BuildProgress
from wsishard.builder.plan import ShardPlan, empty_part_reason, make_groups, part_groups, plan_group
from wsishard.builder.pool import WorkerPool
from wsishard.builder.records import make_manifest, options_dict, write_outputs
from wsishard.builder.roi import match_annotations
from wsishard.builder.scan import ScanResult, ScanTask, crashed_scan, scan_slide
from wsishard.builder.staging import StagedSlide, StageTask, crashed_stage, remove_staging, stage_slide
from wsishard.builder.stamps import fingerprint, input_stamps
from wsishard.builder.state import BuildState
from wsishard.errors import OptionError, OutputError
from wsishard.format import is_shard_name, qc_picture_name, shard_name, shard_order, temp_target, unique_slide_ids
from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.shards.index import index_shard
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions, is_url, public_location

logger = logging.getLogger(__name__)

_TAR_BYTES_PER_MEMBER = 512 + 256  # header + mean padding
Done = dict[int, tuple[ShardOutcome, frozenset[int]]]  # shards finished before: index -> (outcome, excluded slides)


def build(inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], output: str | os.PathLike[str],
          options: BuildOptions | None = None, *, progress: ProgressCallback[BuildProgress] = ignore_progress,
          storage_options: StorageOptions | None = None, part: tuple[int, int] | None = None,
          overwrite: bool = False, scratch: str | None = None, **keywords: Any) -> Manifest:  # fmt: skip
    """Build mixed tissue-patch shards from slides into ``output`` and return the manifest it wrote.

    ``build("slides/", "out/", mpp=0.5, jobs=8)`` is ``wsishard build slides/ -o out/ --mpp 0.5 --jobs 8``.
    Re-running the same build on the same output resumes it: finished shards are kept, the rest is written; slides
    scanned before (each scan is saved as it finishes) are not scanned again.

    Args:
        inputs: a slide folder, slide file, text file listing slides or URL prefix, or a list of them.
        output: local folder or fsspec URL prefix (``s3://bucket/prefix``).
        options: every build option as the nested option classes (defaults: :class:`BuildOptions`).
        progress: called after each slide scanned and each shard written.
        storage_options: fsspec options for an URL output (endpoint, credentials); never logged or stored.
        part: ``(i, n)``, 1-based: build only part ``i`` of ``n`` and write a part manifest (:func:`wsishard.merge`
            joins them). A part scans and extracts only its own slide groups (from the sorted slide list and the
            seed alone): the merged output is the one build the same options make on one machine, whatever ``n``.
        overwrite: replace a build with other inputs or options (or slides changed since) found in ``output``
            instead of refusing; only that build's own files are removed, never anything else there.
        scratch: local folder for copies of slides given as URLs (default: a temporary folder); it holds at most
            one slide per worker, plus the staged (encoded) patches of slides copied and not yet extracted.
        **keywords: every ``wsishard build`` flag, named without its dashes (``patch_size=256``; ``--no-qc`` is
            ``qc=False``), applied over ``options``; the CLI reference lists them with their defaults.

    Raises:
        TypeError: a keyword that is no build option (the message names it and the close matches).
        OptionError: bad inputs (nothing found, a missing path), a bad ``part``, or ``output`` holding another
            build, slides changed since its build began, files that are not a build's, or being written by
            another build right now. Bad slides never raise: they are failed records.
        OutputError: ``output`` cannot be written (permissions, a full disk): the build stops.
    """
    sources, out, options = build_arguments(inputs, output, options, keywords)
    if part is not None and not 1 <= part[0] <= part[1]:
        raise OptionError(f"invalid part {part[0]}/{part[1]}: need 1 <= i <= n")
    paths = find_slides(sources, storage_options)
    check_tables(paths, options)  # warnings logged; an OptionError before anything is written
    annotations = match_annotations(options.roi.path, paths)  # likewise: a bad --roi never claims the output
    dest = Destination(out, storage_options)
    dest.makedirs()
    state = BuildState(dest, fingerprint(paths, options_dict(options, for_fingerprint=True)), part)
    jobs = options.jobs or os.cpu_count() or 1
    with state.lock:  # one build (or the parts of one) at a time; released on errors and interrupts too
        stamps = input_stamps(paths, storage_options)  # by location as stored (no query string or user info)
        state.claim(overwrite=overwrite, stamps=stamps)
        groups = make_groups(len(paths), options.group_slides, options.seed)
        mine = part_groups(groups, [int(stamps[public_location(p)].get("size") or 0) for p in paths], part)
        if part is not None and not mine:
            logger.warning("%s", empty_part_reason(part, len(paths), len(groups), options.group_slides))
        _remove_leftovers(dest, set(mine))
        with _scratch_for(paths, scratch, storage_options) as remote, WorkerPool(jobs) as pool:
            early = _scan_all(pool, paths, annotations, sorted(s for g in mine for s in groups[g]), dest, options,
                              state.lock.refreshing(progress), remote, state)  # fmt: skip
            slides, shards = _extract_groups(pool, [(g, groups[g]) for g in mine], paths, dest, options, state,
                                             progress, remote, early)  # fmt: skip
        manifest = make_manifest(sources, options, slides, shards, state.digest, part, len(paths))
        write_outputs(dest, manifest, part, qc=options.qc)
    return manifest


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


def _scan_all(pool: WorkerPool, paths: list[str], annotations: list[str | None], indices: list[int],
              dest: Destination, options: BuildOptions,
              progress: ProgressCallback[BuildProgress], remote: _Scratch,
              state: BuildState) -> dict[int, StagedSlide]:  # fmt: skip
    """Scan the slides ``indices`` not scanned yet; each result is saved as it arrives, and none is kept here but
    the staged patches of slides copied from object storage to be scanned (by slide index)."""
    ids = unique_slide_ids([public_location(p) for p in paths])  # never from a query string
    if options.qc:
        dest.makedirs("qc")
    store = state.scans
    have = store.scanned()
    todo = [i for i in indices if i not in have]
    tasks = (
        ScanTask(index=i, path=paths[i], slide_id=ids[i], patch=options.patch, tissue=options.tissue,
                 encode=options.encode, measure=options.shard_size_bytes is not None,
                 mpp_override=lookup(options.mpp_overrides, paths[i]), default_mpp=options.default_mpp,
                 label=lookup(options.labels, paths[i]), seed=options.seed, dest=dest,
                 qc_name=qc_picture_name(ids[i]) if options.qc else None, qc_size_px=options.qc_size_px,
                 scratch=remote.scratch, storage_options=remote.storage_options, roi=options.roi,
                 roi_file=annotations[i])
        for i in todo
    )  # fmt: skip
    done = len(indices) - len(todo)
    progress(BuildProgress("scan", done, len(indices)))
    staged: dict[int, StagedSlide] = {}
    for i, result in zip(todo, pool.imap(scan_slide, tasks, on_crash=crashed_scan), strict=True):
        store.save(i, result)
        if result.staged is not None:
            staged[i] = result.staged
        done += 1
        progress(BuildProgress("scan", done, len(indices)))
    return staged


def _extract_groups(pool: WorkerPool, groups: list[tuple[int, list[int]]], paths: list[str], dest: Destination,
                    options: BuildOptions,
                    state: BuildState, progress: ProgressCallback[BuildProgress],
                    remote: _Scratch, early: dict[int, StagedSlide]) -> tuple[dict[int, SlideRecord],
                                                                              list[ShardRecord]]:  # fmt: skip
    """Plan and write each group's shards, one group's scans in memory at a time; the final slide records (by slide
    index) and shard records (in shard order) of these groups. ``paths``: every slide's location as read (a scan
    records it without a URL's query string or user info). ``early``: slides staged while scanning (their files are
    removed as their group is done)."""
    previous, failed = state.load_done(), state.load_failed()
    tally = _Tally(progress, 0, 0)
    slides: dict[int, SlideRecord] = {}
    shards: list[ShardRecord] = []
    for g, members in groups:
        loaded = state.scans.load_many(members, options.patch.block_patches)
        scans = {s: _read_from(scan, paths[s]) for s, scan in loaded.items()}
        if len(scans) != len(members):
            raise OutputError(dest.path(state.scans.folder), f"scans of group {g} went missing during the build")
        per_shard = _samples_per_shard(options, list(scans.values()))
        plan = plan_group(g, {s: scans[s].block_sizes for s in members}, samples_per_shard=per_shard, seed=options.seed)
        tally.grow(len(plan), sum(sp.patches for sp in plan))
        staged = {s: early.pop(s) for s in members if s in early}
        if remote.from_urls:
            staged.update(_stage_group(pool, plan, scans, options, remote, previous, failed, state, set(staged)))
        outcomes = _extract_all(pool, plan, scans, dest, options, tally, state, previous, failed, staged)
        remove_staging(remote.scratch, staged.values())
        patches: dict[int, int] = {}
        for outcome in outcomes.values():
            for slide, n in (outcome.patches_by_slide or {}).items():
                patches[slide] = patches.get(slide, 0) + n
        shards += [o.record for _, o in sorted(outcomes.items()) if o.record is not None]
        for s in members:
            record = _final_record(scans[s], failed.get(s), patches.get(s, 0))
            got = staged[s].bytes_read if s in staged else 0
            slides[s] = dataclasses.replace(record, bytes_read=record.bytes_read + got) if got else record
    if remote.from_urls:
        remove_staging(remote.scratch)  # and what an interrupted run left there
    return slides, shards


def _read_from(scan: ScanResult, path: str) -> ScanResult:
    """``scan`` with its slide read from ``path`` (its record holds the slide's public location)."""
    return dataclasses.replace(scan, record=dataclasses.replace(scan.record, file=path))


def _final_record(scan: ScanResult, failure: str | None, patches: int) -> SlideRecord:
    """A slide's manifest record: its scan's, with the patches written or the reason extraction failed (the file
    as stored: no query string or user info)."""
    public = public_location(scan.record.file)
    record = dataclasses.replace(scan.record, file=public)
    if failure is not None:
        reason = f"extraction: {failure}".replace(scan.record.file, public)
        return dataclasses.replace(record, status="failed", reason=reason, patches=0)
    if record.status != "ok":
        return record
    quality = len(scan.cands or ()) - patches  # planned patches not written: left out by the quality filters
    filtered = {**record.filtered, **({"quality": quality} if quality > 0 else {})}
    return dataclasses.replace(record, patches=patches, filtered=filtered)


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
    """Shards and patches written so far, against the totals of the groups planned so far; reports each change."""

    progress: ProgressCallback[BuildProgress]
    shards_total: int
    patches_total: int
    shards: int = 0
    patches: int = 0

    def grow(self, shards: int, patches: int) -> None:
        """Another group planned: its shards and patches join the totals."""
        self.shards_total += shards
        self.patches_total += patches
        self.report()

    def written(self, samples: int) -> None:
        self.patches += samples
        self.report()

    def finished(self, outcome: ShardOutcome, sign: int = 1, *, with_samples: bool = False) -> None:
        """A shard done (``sign`` -1: undone); its samples count too unless :meth:`written` counted them."""
        self.shards += sign
        self.patches += sign * (outcome.record.samples if outcome.record and with_samples else 0)

    def report(self) -> None:
        self.progress(BuildProgress("extract", self.shards, self.shards_total, self.patches, self.patches_total))


def _stage_group(pool: WorkerPool, shards: list[ShardPlan], scans: Mapping[int, ScanResult], options: BuildOptions,
                 remote: _Scratch, previous: Done, failed: dict[int, str],
                 state: BuildState, have: set[int]) -> dict[int, StagedSlide]:  # fmt: skip
    """Slides in object storage: stage the patches of each slide a group's unfinished shards need and ``have`` has
    not (those staged while scanning), once."""
    done = _still_valid(previous, shards, failed)
    todo = [sp for sp in shards if sp.index not in done]
    wanted = sorted({s for sp in todo for s, _ in sp.blocks} - set(failed) - have)
    tasks = [StageTask(index=s, url=scans[s].record.file, work=work, scratch=remote.scratch,
                       storage_options=remote.storage_options, encode=options.encode)
             for s in wanted if (work := scans[s].work) is not None]  # fmt: skip
    staged: dict[int, StagedSlide] = {}
    before = len(failed)
    for result in pool.imap(stage_slide, tasks, on_crash=crashed_stage):
        if result.staged is None:
            failed[result.index] = result.reason
        else:
            staged[result.index] = result.staged
    if len(failed) != before:
        state.save_failed(failed)
    return staged


def _extract_all(pool: WorkerPool, shards: list[ShardPlan], scans: Mapping[int, ScanResult], dest: Destination,
                 options: BuildOptions, tally: _Tally, state: BuildState, previous: Done, failed: dict[int, str],
                 staged: dict[int, StagedSlide]) -> dict[int, ShardOutcome]:  # fmt: skip
    """Write the shards not already done; a slide failing mid-way is excluded and the shards it touched redone.

    ``failed`` (slide -> reason) is updated in place and saved whenever a slide fails."""
    sources = {i: SlideSource(work, staged.get(i)) for i, s in scans.items() if (work := s.work)}
    done = _still_valid(previous, shards, failed)
    for outcome in done.values():
        tally.finished(outcome, with_samples=True)
    by_index = {sp.index: sp for sp in shards}
    pending = [sp for sp in shards if sp.index not in done]
    while pending:
        excluded = frozenset(failed)
        size = segment_size(sum(sp.patches for sp in pending), pool.jobs)
        taper = size * pool.jobs if pool.jobs > 1 else 0  # the end of the last shard: finer segments
        tasks = [t for sp in pending for t in segment_tasks(sp, sources, excluded, options.encode, size,
                                                            taper if sp is pending[-1] else 0)]  # fmt: skip
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
                new_failed.update(crash_culprits(pool, by_index[outcome.index], sources, excluded, options.encode))
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
    return done


def _excluded(sp: ShardPlan, failed: Mapping[int, str]) -> frozenset[int]:
    return frozenset(s for s, _ in sp.blocks if s in failed)


def _still_valid(previous: Done, shards: list[ShardPlan],
                 failed: Mapping[int, str]) -> dict[int, ShardOutcome]:  # fmt: skip
    """Shards an earlier run finished that need no redo: written with the same slides excluded as now."""
    return {
        sp.index: previous[sp.index][0]
        for sp in shards
        if sp.index in previous and previous[sp.index][1] == _excluded(sp, failed)
    }


def _remove_leftovers(dest: Destination, groups: set[int]) -> None:
    """Remove temporary files an interrupted local build left for the shards of ``groups`` (only this part's: other
    parts of a cluster build may be writing theirs into the same folder right now)."""
    if not dest.remote:
        for name in dest.listdir():
            target = temp_target(name)
            shard = target if target is None or is_shard_name(target) else index_shard(target)
            if shard is not None and shard_order(shard)[0] in groups:
                dest.remove(name)  # a shard, or its index (killed between writing the index and renaming it)
