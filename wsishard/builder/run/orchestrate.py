"""Orchestration: find slides, scan them, plan, extract shards in a process pool, write the manifest last.

``build()`` is the one catch-all boundary of wsishard: a slide's failure anywhere (open, mpp, tissue, a corrupt
tile deep in level 0) is recorded with its reason and every other slide is still built. A slide that fails
during extraction is dropped from every shard it touched (those shards are rewritten), so nothing of a failed
slide is left in the output.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from wsishard.builder.extract.extract import (
    ShardDone,
    SlideFailed,
    SlideSource,
    WorkerDied,
    assemble_shards,
    crash_culprits,
    crashed_segment,
    extract_segment,
    segment_size,
    segment_tasks,
)
from wsishard.builder.inputs.roi import match_annotations
from wsishard.builder.inputs.sources import check_tables, find_inputs
from wsishard.builder.inputs.staging import (
    StagedSlide,
    StageTask,
    crashed_stage,
    remove_staging,
    scratch_for,
    stage_slide,
)
from wsishard.builder.options.buildopts import BuildOptions, BuildProgress
from wsishard.builder.options.config import build_arguments
from wsishard.builder.plan.plan import ShardPlan, empty_part_reason, make_groups, part_groups, plan_group
from wsishard.builder.run.buildcontext import BuildContext, Failures
from wsishard.builder.run.pool import WorkerPool
from wsishard.builder.run.records import make_manifest, options_dict, write_outputs
from wsishard.builder.run.stamps import build_identity, fingerprint, input_stamps
from wsishard.builder.run.state import BuildState
from wsishard.builder.scan.scan import ScanResult, crashed_scan, scan_slide, scan_tasks
from wsishard.errors import OptionError, OutputError
from wsishard.format import is_shard_name, shard_name, shard_order, temp_target
from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.shards.index import index_shard
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions, public_location

logger = logging.getLogger(__name__)

_TAR_BYTES_PER_MEMBER = 512 + 256  # header + mean padding
Done = dict[int, tuple[ShardDone, frozenset[int]]]  # shards finished before: index -> (outcome, excluded slides)


def build(
    inputs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    output: str | os.PathLike[str],
    options: BuildOptions | None = None,
    *,
    progress: ProgressCallback[BuildProgress] = ignore_progress,
    storage_options: StorageOptions | None = None,
    part: tuple[int, int] | None = None,
    overwrite: bool = False,
    scratch: str | None = None,
    config: str | os.PathLike[str] | None = None,
    **keywords: Any,
) -> Manifest:
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
        config: a TOML file of build options (``wsishard inspect OUT --options`` writes one from a build), applied
            over ``options``; its keys are the keywords below, in tables as ``wsishard build --help`` groups them
            (:mod:`wsishard.builder.options.config`).
        **keywords: every ``wsishard build`` flag, named without its dashes (``patch_size=256``; ``--no-qc`` is
            ``qc=False``), applied over ``options`` and ``config``; the CLI reference lists them with their defaults.

    Raises:
        TypeError: a keyword that is no build option (the message names it and the close matches).
        OptionError: a config file that cannot be read or holds an unknown key (named, with the closest known one)
            or a refused value; bad inputs (nothing found, a missing path), a bad ``part``, or ``output`` holding
            another build, slides changed since its build began, files that are not a build's, or being written by
            another build right now. Bad slides never raise: they are failed records.
        OutputError: ``output`` cannot be written (permissions, a full disk): the build stops.
    """
    sources, out, options = build_arguments(inputs, output, options, keywords, config)
    if part is not None and not 1 <= part[0] <= part[1]:
        raise OptionError(f"invalid part {part[0]}/{part[1]}: need 1 <= i <= n")
    paths, names = find_inputs(sources, storage_options)
    options = options.with_block_side(len(paths))  # recorded as chosen (the manifest, the resume fingerprint)
    check_tables(paths, options)  # warnings logged; an OptionError before anything is written
    annotations = match_annotations(options.roi.path, paths)  # likewise: a bad --roi never claims the output
    dest = Destination(out, storage_options)
    dest.makedirs()
    recorded = options_dict(options, for_fingerprint=True)
    state = BuildState(dest, fingerprint(paths, recorded), part, build_identity(paths, recorded), names)
    jobs = options.jobs or os.cpu_count() or 1
    with state.lock:  # one build (or the parts of one) at a time; released on errors and interrupts too
        stamps = input_stamps(paths, storage_options)  # by location as stored (no query string or user info)
        state.claim(overwrite=overwrite, stamps=stamps)
        groups = make_groups(len(paths), options.group_slides, options.seed)
        mine = part_groups(groups, [int(stamps[public_location(p)].get("size") or 0) for p in paths], part)
        if part is not None and not mine:
            logger.warning("%s", empty_part_reason(part, len(paths), len(groups), options.group_slides))
        _remove_leftovers(dest, set(mine))
        with scratch_for(paths, scratch, storage_options) as space, WorkerPool(jobs) as pool:
            ctx = BuildContext(
                options=options,
                dest=dest,
                state=state,
                scratch=space,
                pool=pool,
                paths=paths,
                progress=progress,
                names=names,
            )
            early = _scan_all(ctx, annotations, sorted(s for g in mine for s in groups[g]))
            slides, shards = _extract_groups(ctx, [(g, groups[g]) for g in mine], early)
        manifest = make_manifest(sources, options, slides, shards, state.digest, part, len(paths))
        manifest = write_outputs(dest, manifest, part, qc=options.qc)
    return manifest


def _scan_all(ctx: BuildContext, annotations: list[str | None], indices: list[int]) -> dict[int, StagedSlide]:
    """Scan the slides ``indices`` not scanned yet (``annotations``: every slide's annotation file); each result is
    saved as it arrives, and none is kept here but the staged patches of slides copied from object storage to be
    scanned (by slide index)."""
    if ctx.options.qc:
        ctx.dest.makedirs("qc")
    store = ctx.state.scans
    have = store.scanned()
    todo = [i for i in indices if i not in have]
    tasks = scan_tasks(ctx.options, ctx.paths, todo, annotations, ctx.dest, ctx.scratch, ctx.names)
    progress = ctx.state.lock.refreshing(ctx.progress)  # scanning saves nothing else that would refresh the lock
    done = len(indices) - len(todo)
    progress(BuildProgress("scan", done, len(indices)))
    staged: dict[int, StagedSlide] = {}
    for i, result in zip(todo, ctx.pool.imap(scan_slide, tasks, on_crash=crashed_scan), strict=True):
        store.save(i, result)
        if result.staged is not None:
            staged[i] = result.staged
        done += 1
        progress(BuildProgress("scan", done, len(indices)))
    return staged


@dataclass(frozen=True)
class _Group:
    """A group of slides in the extract step: its slides (``members``), their scans and staged patches (by slide
    index), and the plan of its shards."""

    index: int
    members: list[int]
    scans: dict[int, ScanResult]
    staged: dict[int, StagedSlide]  # filled as its slides are staged
    shards: list[ShardPlan]


def _extract_groups(
    ctx: BuildContext, groups: list[tuple[int, list[int]]], early: dict[int, StagedSlide]
) -> tuple[dict[int, SlideRecord], list[ShardRecord]]:
    """Plan and write each group's shards, one group's scans in memory at a time; the final slide records (by slide
    index) and shard records (in shard order) of these groups. ``early``: slides staged while scanning (their files are
    removed as their group is done)."""
    previous = ctx.state.load_done()
    tally = _Tally(ctx.progress, 0, 0)
    slides: dict[int, SlideRecord] = {}
    shards: list[ShardRecord] = []
    for g, members in groups:
        group = _plan(ctx, g, members, {s: early.pop(s) for s in members if s in early})
        tally.grow(len(group.shards), sum(sp.patches for sp in group.shards))
        if ctx.scratch.from_urls:
            group.staged.update(_stage_group(ctx, group, previous))
        outcomes = _extract_all(ctx, group, previous, tally)
        remove_staging(ctx.scratch.folder, group.staged.values())
        shards += [o.record for _, o in sorted(outcomes.items()) if o.record is not None]
        slides.update(_slide_records(ctx, group, outcomes.values()))
    if ctx.scratch.from_urls:
        remove_staging(ctx.scratch.folder)  # and what an interrupted run left there
    return slides, shards


def _plan(ctx: BuildContext, g: int, members: list[int], staged: dict[int, StagedSlide]) -> _Group:
    """Group ``g`` of slides ``members``: their saved scans, read from their locations as given (a scan records
    the slide's public location: no query string or user info), and its shards' plan."""
    loaded = ctx.state.scans.load_many(members, ctx.options.block_side)
    scans = {s: _read_from(scan, ctx.paths[s]) for s, scan in loaded.items()}
    if len(scans) != len(members):
        raise OutputError(ctx.dest.path(ctx.state.scans.folder), f"scans of group {g} went missing during the build")
    per_shard = _samples_per_shard(ctx.options, list(scans.values()))
    blocks = {s: scans[s].block_sizes for s in members}
    return _Group(g, members, scans, staged, plan_group(g, blocks, samples_per_shard=per_shard, seed=ctx.options.seed))


def _read_from(scan: ScanResult, path: str) -> ScanResult:
    """``scan`` with its slide read from ``path`` (its record holds the slide's public location)."""
    return dataclasses.replace(scan, record=dataclasses.replace(scan.record, file=path))


def _slide_records(ctx: BuildContext, group: _Group, outcomes: Iterable[ShardDone]) -> dict[int, SlideRecord]:
    """The manifest records of a group's slides (by slide index), once its shards are done."""
    patches: dict[int, int] = {}
    for outcome in outcomes:
        for slide, n in outcome.patches_by_slide.items():
            patches[slide] = patches.get(slide, 0) + n
    records: dict[int, SlideRecord] = {}
    for s in group.members:
        record = _final_record(group.scans[s], ctx.failures.reason(s), patches.get(s, 0))
        got = group.staged[s].bytes_read if s in group.staged else 0
        records[s] = dataclasses.replace(record, bytes_read=record.bytes_read + got) if got else record
    return records


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
    quality = sum(scan.block_sizes) - patches  # planned patches not written: left out by the quality filters
    filtered = {**record.filtered, **({"quality": quality} if quality > 0 else {})}
    return dataclasses.replace(record, patches=patches, filtered=filtered)


def _samples_per_shard(options: BuildOptions, scans: list[ScanResult]) -> int:
    limits = [options.shard_samples] if options.shard_samples else []
    measured = [s.bytes_per_patch for s in scans if s.bytes_per_patch]
    if options.shard_size_bytes and measured:
        members = 3 if options.class_names else 2
        per_sample = sum(measured) / len(measured) + members * _TAR_BYTES_PER_MEMBER
        limits.append(max(options.block_side**2, int(options.shard_size_bytes // per_sample)))
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

    def finished(self, outcome: ShardDone, sign: int = 1, *, with_samples: bool = False) -> None:
        """A shard done (``sign`` -1: undone); its samples count too unless :meth:`written` counted them."""
        self.shards += sign
        self.patches += sign * (outcome.record.samples if outcome.record and with_samples else 0)
        self.report()  # the last shard's too: the bar ends at 7/7 shards, not 6/7

    def report(self) -> None:
        self.progress(BuildProgress("extract", self.shards, self.shards_total, self.patches, self.patches_total))


def _stage_group(ctx: BuildContext, group: _Group, previous: Done) -> dict[int, StagedSlide]:
    """Slides in object storage: stage the patches of each slide the group's unfinished shards need that was not
    staged while scanning, once. A slide whose staging fails joins the build's failures."""
    done = _still_valid(previous, group.shards, ctx.failures)
    todo = [sp for sp in group.shards if sp.index not in done]
    wanted = sorted({s for sp in todo for s, _ in sp.blocks} - ctx.failures.slides - set(group.staged))
    encode = ctx.options.encode
    tasks = [
        StageTask(
            index=s,
            url=group.scans[s].record.file,
            work=work,
            scratch=ctx.scratch,
            encode=encode,
            copy=group.scans[s].record.read == "copied",
        )
        for s in wanted
        if (work := group.scans[s].work) is not None
    ]
    staged: dict[int, StagedSlide] = {}
    failed: dict[int, str] = {}
    for result in ctx.pool.imap(stage_slide, tasks, on_crash=crashed_stage):
        if result.staged is None:
            failed[result.index] = result.reason
        else:
            staged[result.index] = result.staged
    ctx.failures.add(failed)
    return staged


def _extract_all(ctx: BuildContext, group: _Group, previous: Done, tally: _Tally) -> dict[int, ShardDone]:
    """Write the group's shards not already done; a slide failing mid-way joins the build's failures, and the
    shards it touched are redone without it."""
    sources = {i: SlideSource(work, group.staged.get(i)) for i, s in group.scans.items() if (work := s.work)}
    shards, pool, encode = group.shards, ctx.pool, ctx.options.encode
    done = _still_valid(previous, shards, ctx.failures)
    for finished in done.values():
        tally.finished(finished, with_samples=True)
    by_index = {sp.index: sp for sp in shards}
    pending = [sp for sp in shards if sp.index not in done]
    while pending:
        excluded = ctx.failures.slides
        size = segment_size(sum(sp.patches for sp in pending), pool.jobs)
        taper = size * pool.jobs if pool.jobs > 1 else 0  # the end of the last shard: finer segments
        tasks = [
            t
            for sp in pending
            for t in segment_tasks(sp, sources, excluded, encode, size, taper if sp is pending[-1] else 0)
        ]
        segments = pool.imap(extract_segment, tasks, on_crash=crashed_segment, window=4 * pool.jobs)
        new_failed: dict[int, str] = {}
        for outcome in assemble_shards(segments, ctx.dest, tally.written):
            match outcome:
                case ShardDone(index=index):
                    done[index] = outcome
                    tally.finished(outcome)
                    ctx.state.save_done(outcome, shard_name(index), _excluded(by_index[index], ctx.failures))
                case SlideFailed(slide=slide, reason=reason):
                    new_failed.setdefault(slide, reason)
                case WorkerDied(index=index):
                    new_failed.update(crash_culprits(pool, by_index[index], sources, excluded, encode))
        ctx.failures.add(new_failed)
        pending = [sp for sp in shards if any(s in new_failed for s, _ in sp.blocks)]
        for sp in pending:  # rewritten without the failed slides, or gone if nothing else was in them
            stale = done.pop(sp.index, None)
            if stale is not None:
                tally.finished(stale, -1, with_samples=True)
    for sp in shards:
        if done[sp.index].record is None:
            ctx.dest.remove(shard_name(sp.index))  # a shard left empty: no file (an earlier run may have written one)
    return done


def _excluded(sp: ShardPlan, failures: Failures) -> frozenset[int]:
    return failures.among(s for s, _ in sp.blocks)


def _still_valid(previous: Done, shards: list[ShardPlan], failures: Failures) -> dict[int, ShardDone]:
    """Shards an earlier run finished that need no redo: written with the same slides excluded as now."""
    return {
        sp.index: previous[sp.index][0]
        for sp in shards
        if sp.index in previous and previous[sp.index][1] == _excluded(sp, failures)
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
