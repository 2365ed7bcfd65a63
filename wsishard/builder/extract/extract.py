"""Shard extraction: segments of a shard's plan are read and encoded in worker processes, and written in order.

A shard's content is fixed by the plan and by the set of slides excluded (failed), so a shard can be redone at any
time with the same result. The unit of parallel work is the *segment*, a contiguous run of a shard's planned blocks
(about :data:`SEGMENT_PATCHES` patches): a worker reads each of its blocks once, cuts and encodes the patches and
returns their tar records (:func:`extract_segment`); :func:`assemble_shards` writes each shard's segments in plan
order. Tar records concatenate, so the shard is byte for byte the same whatever the number of workers, and a build
of one shard still keeps every worker busy. Slide handles come from the worker's own
:data:`~wsishard.slide.cache.READERS`, opened inside it, never pickled.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeAlias

from wsishard.builder.extract.patches import EncodeOptions, Samples, SlideWork, block_samples, plan_block
from wsishard.builder.inputs.staging import StagedSlide
from wsishard.builder.plan.plan import ShardPlan
from wsishard.builder.run.pool import WorkerPool
from wsishard.errors import SlideFailure
from wsishard.format import shard_name
from wsishard.manifest import ShardRecord
from wsishard.shards.writer import ShardWriter, sample_records
from wsishard.slide.cache import READERS
from wsishard.slide.reader import SlideReader
from wsishard.storage.output import Destination

logger = logging.getLogger(__name__)

SEGMENT_PATCHES = 256  # patches per segment (whole blocks): enough to amortise a task, small to keep workers busy
SEGMENT_MIN_PATCHES = 32  # a small build's segments shrink to this, so that every job has several to work on


@dataclass(frozen=True)
class SlideSource:
    """One scanned slide as extraction reads it: from the slide itself, or from its staged patches."""

    work: SlideWork
    staged: StagedSlide | None = None  # a slide from object storage: its patches, already encoded


@dataclass(frozen=True, kw_only=True)
class SegmentTask:
    """A contiguous run of one shard's planned blocks."""

    shard: int  # the shard's global index
    segment: int  # its position in the shard
    last: bool  # the shard's last segment
    blocks: tuple[tuple[int, int], ...]  # (slide, block) in write order
    slides: dict[int, SlideSource]  # the slides these blocks draw from
    excluded: frozenset[int]  # slides that failed: their blocks are skipped
    encode: EncodeOptions


@dataclass(frozen=True)
class ShardDone:
    """A shard finished: written (``record``, and its patches per slide index), or left empty (``record`` None: every
    block of it was a failed slide's; no file)."""

    index: int
    record: ShardRecord | None = None
    patches_by_slide: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SlideFailed:
    """A shard not written: reading the slide ``slide`` (its index in the build) failed for ``reason``."""

    index: int
    slide: int
    reason: str


@dataclass(frozen=True)
class WorkerDied:
    """A shard not written: a worker process died (twice) reading it, and which slide killed it is not known."""

    index: int
    reason: str


ShardOutcome: TypeAlias = ShardDone | SlideFailed | WorkerDied  # what became of a shard's extraction


@dataclass(frozen=True)
class SegmentOutcome:
    """A segment's tar records, or its shard's :class:`SlideFailed` or :class:`WorkerDied` (``failure``)."""

    shard: int
    segment: int
    last: bool
    records: bytes = b""
    patches_by_slide: dict[int, int] = field(default_factory=dict)
    slide_ids: frozenset[str] = frozenset()
    failure: SlideFailed | WorkerDied | None = None

    @property
    def samples(self) -> int:
        return sum(self.patches_by_slide.values())


def segment_size(pending_patches: int, jobs: int) -> int:
    """Patches per segment: :data:`SEGMENT_PATCHES`, or fewer (down to :data:`SEGMENT_MIN_PATCHES`) when the work
    would otherwise give fewer than eight segments per job (a one-shard build on many cores)."""
    return max(SEGMENT_MIN_PATCHES, min(SEGMENT_PATCHES, pending_patches // (8 * max(jobs, 1))))


def segment_tasks(
    sp: ShardPlan,
    sources: dict[int, SlideSource],
    excluded: frozenset[int],
    encode: EncodeOptions,
    patches: int | None = None,
    taper: int = 0,
) -> list[SegmentTask]:
    """The shard's blocks cut into segments of whole blocks, about ``patches`` (:data:`SEGMENT_PATCHES`) each, and
    the shard's last ``taper`` patches into segments a quarter that size (the work's end: the workers then finish
    nearly together instead of one waiting for another's last full segment).

    The cut never changes the shard's bytes: only how its work is shared out.
    """
    cap = patches or SEGMENT_PATCHES
    fine = max(SEGMENT_MIN_PATCHES, cap // 4)
    runs: list[list[tuple[int, int]]] = [[]]
    size, left = 0, sp.patches
    for slide, block in sp.blocks:
        if size >= (fine if left <= taper else cap):
            runs.append([])
            size = 0
        runs[-1].append((slide, block))
        n = len(sources[slide].work.blocks[block].patches)
        size, left = size + n, left - n
    return [
        SegmentTask(
            shard=sp.index,
            segment=i,
            last=i == len(runs) - 1,
            blocks=tuple(run),
            slides={s: sources[s] for s in {s for s, _ in run}},
            excluded=excluded,
            encode=encode,
        )
        for i, run in enumerate(runs)
    ]


def extract_segment(task: SegmentTask) -> SegmentOutcome:
    """Read and encode one segment (in a worker). A slide that fails mid-way is named, and nothing is returned."""
    parts: list[bytes] = []
    counts: dict[int, int] = {}
    ids: set[str] = set()
    for slide_index, block_index in task.blocks:
        if slide_index in task.excluded:
            continue
        source = task.slides[slide_index]
        with SlideFailure(source.work.path) as failure:
            samples = _read_block(source, block_index, task.encode)
        if failure.reason is not None:
            READERS.drop(source.work.path)
            failed = SlideFailed(task.shard, slide_index, failure.reason)
            return SegmentOutcome(task.shard, task.segment, task.last, failure=failed)
        parts += [sample_records(key, members) for key, members in samples]
        counts[slide_index] = counts.get(slide_index, 0) + len(samples)
        ids.add(source.work.slide_id)
    return SegmentOutcome(task.shard, task.segment, task.last, b"".join(parts), counts, frozenset(ids))


def crashed_segment(task: SegmentTask) -> SegmentOutcome:
    """The outcome of a segment whose worker process died running it (twice)."""
    died = WorkerDied(task.shard, "its worker process died")
    return SegmentOutcome(task.shard, task.segment, task.last, failure=died)


def assemble_shards(
    segments: Iterator[SegmentOutcome], dest: Destination, written: Callable[[int], None]
) -> Iterator[ShardOutcome]:
    """Write shards from their segments, which arrive in plan order, and yield each shard's outcome.

    A segment's failure (:class:`SlideFailed`, :class:`WorkerDied`) drops its shard (nothing appears; the rest of its
    segments are passed over) and is the shard's outcome. ``written(n)`` is told of every ``n`` samples written, and
    of ``-n`` when a dropped shard takes them back.
    """
    writer: ShardWriter | None = None
    counts: dict[int, int] = {}
    dropped = False
    try:
        for seg in segments:
            if seg.segment == 0:
                writer, counts, dropped = None, {}, False
            if dropped:
                continue
            if seg.failure is not None:
                dropped = True
                _drop(writer, counts, written)
                writer = None
                yield seg.failure
                continue
            if seg.records:
                writer = writer or ShardWriter(dest, shard_name(seg.shard))
                writer.append(seg.records, seg.samples, seg.slide_ids)
                for slide, n in seg.patches_by_slide.items():
                    counts[slide] = counts.get(slide, 0) + n
                written(seg.samples)
            if seg.last:
                yield ShardDone(seg.shard, writer.commit(), counts) if writer else ShardDone(seg.shard)
                writer = None
    except BaseException:
        if writer is not None:
            writer.abort()
        raise


def _drop(writer: ShardWriter | None, counts: dict[int, int], written: Callable[[int], None]) -> None:
    if writer is not None:
        writer.abort()
    written(-sum(counts.values()))


_PLANNED: weakref.WeakSet[SlideReader] = weakref.WeakSet()  # readers told of every block of their slide


def _read_block(source: SlideSource, block_index: int, encode: EncodeOptions) -> Samples:
    if source.staged is not None:
        return source.staged.read(block_index)
    work = source.work
    reader = READERS.get(work.path, encode.fast_path)
    if reader not in _PLANNED:  # first block of this slide read with this reader: it learns which tiles blocks share
        _PLANNED.add(reader)
        for block in work.blocks:  # the slide's, this process's segments or not: a tile is decoded once here
            plan_block(reader, work, block)
    return block_samples(reader, work, work.blocks[block_index], encode)


def crash_culprits(
    pool: WorkerPool, sp: ShardPlan, sources: dict[int, SlideSource], excluded: frozenset[int], encode: EncodeOptions
) -> dict[int, str]:
    """The slides of a shard whose reading kills a worker process, found by reading each one's blocks alone."""
    slides = sorted({s for s, _ in sp.blocks} - excluded)
    probes = [
        SegmentTask(
            shard=sp.index,
            segment=0,
            last=True,
            blocks=tuple(b for b in sp.blocks if b[0] == s),
            slides={s: sources[s]},
            excluded=excluded,
            encode=encode,
        )
        for s in slides
    ]
    outcomes = pool.imap(extract_segment, probes, on_crash=crashed_segment, window=1)
    crashed = [s for s, outcome in zip(slides, outcomes, strict=True) if isinstance(outcome.failure, WorkerDied)]
    reason = "the worker process reading it died twice (killed: out of memory?)"
    if not crashed:  # no single slide kills a worker: rather than retry for ever, none of them is kept
        reason = f"a worker process died twice writing shard {sp.index} and no single slide of it could be blamed"
    return dict.fromkeys(crashed or slides, reason)
