"""Shard extraction, run in worker processes: read each planned block once, cut, encode, write the shard.

A shard is the unit of work. Its content is fixed by the plan and by the set of slides excluded (failed), so a
shard can be redone at any time with the same result. Slide handles come from this process's
:data:`~wsishard.slide.cache.READERS`, opened inside the worker, never pickled.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from wsishard.builder.patches import EncodeOptions, Samples, SlideWork, block_samples
from wsishard.builder.staging import StagedSlide
from wsishard.errors import SlideFailure
from wsishard.format import ShardRecord, shard_name
from wsishard.shards.writer import ShardWriter
from wsishard.slide.cache import READERS
from wsishard.storage.output import Destination

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlideSource:
    """One scanned slide as extraction reads it: from the slide itself, or from its staged patches."""

    work: SlideWork
    staged: StagedSlide | None = None  # a slide from object storage: its patches, already encoded


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    index: int
    blocks: tuple[tuple[int, int], ...]  # (slide, block) in write order
    slides: dict[int, SlideSource]  # the slides this shard draws from
    excluded: frozenset[int]  # slides that failed: their blocks are skipped
    dest: Destination
    encode: EncodeOptions


@dataclass(frozen=True)
class ShardOutcome:
    """A written shard (``record``), an empty one (both None), or the slide that broke it (``failed_slide``)."""

    index: int
    record: ShardRecord | None = None
    patches_by_slide: dict[int, int] | None = None
    failed_slide: int | None = None
    reason: str = ""


def extract_shard(task: ShardTask) -> ShardOutcome:
    """Write one shard. A slide that fails mid-way aborts the shard (nothing appears) and is named."""
    counts: dict[int, int] = {}
    writer = ShardWriter(task.dest, shard_name(task.index))
    try:
        for slide_index, block_index in task.blocks:
            if slide_index in task.excluded:
                continue
            source = task.slides[slide_index]
            with SlideFailure(source.work.path) as failure:
                samples = _read_block(source, block_index, task.encode)
            if failure.reason is not None:
                writer.abort()
                READERS.drop(source.work.path)
                return ShardOutcome(task.index, failed_slide=slide_index, reason=failure.reason)
            for key, members in samples:
                writer.write(key, members, source.work.slide_id)
            counts[slide_index] = counts.get(slide_index, 0) + len(samples)
        if not counts:
            writer.abort()
            return ShardOutcome(task.index)
        return ShardOutcome(task.index, record=writer.commit(), patches_by_slide=counts)
    except BaseException:
        writer.abort()
        raise


def _read_block(source: SlideSource, block_index: int, encode: EncodeOptions) -> Samples:
    if source.staged is not None:
        return source.staged.read(block_index)
    work = source.work
    return block_samples(READERS.get(work.path, encode.fast_path), work, work.blocks[block_index], encode)
