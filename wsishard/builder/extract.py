"""Shard extraction, run in worker processes: read each planned block once, cut, encode, write the shard.

A shard is the unit of work. Its content is fixed by the plan and by the set of slides excluded (failed), so a
shard can be redone at any time with the same result. Slide handles live in a per-process cache and are opened
inside the worker, never pickled.
"""

from __future__ import annotations

import logging
import os
from collections import OrderedDict
from dataclasses import dataclass

from wsishard.destination import Destination
from wsishard.encode import block_samples
from wsishard.errors import failure_reason
from wsishard.format import ShardRecord, shard_name
from wsishard.grid import Block, Candidates
from wsishard.scratch import StagedSlide
from wsishard.slide import SlideReader, open_slide
from wsishard.writer import ShardWriter

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SlideWork:
    """What extraction needs of one scanned slide."""

    path: str
    slide_id: str
    level: int
    cands: Candidates
    blocks: list[Block]
    label: int | None
    staged: StagedSlide | None = None  # a slide from object storage: its patches, already encoded


@dataclass(frozen=True, kw_only=True)
class ShardTask:
    index: int
    blocks: tuple[tuple[int, int], ...]  # (slide, block) in write order
    slides: dict[int, SlideWork]  # the slides this shard draws from
    excluded: frozenset[int]  # slides that failed: their blocks are skipped
    dest: Destination
    target_mpp: float
    image_format: str
    quality: int
    fast_path: bool


@dataclass(frozen=True)
class ShardOutcome:
    """A written shard (``record``), an empty one (both None), or the slide that broke it (``failed_slide``)."""

    index: int
    record: ShardRecord | None = None
    patches_by_slide: dict[int, int] | None = None
    failed_slide: int | None = None
    reason: str = ""


class _ReaderCache:
    """Open slide readers of this process, least recently used closed first."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = capacity
        self._readers: OrderedDict[str, SlideReader] = OrderedDict()

    def get(self, path: str, fast: bool) -> SlideReader:
        reader = self._readers.pop(path, None)
        if reader is None:
            reader = open_slide(path, fast=fast)
            while len(self._readers) >= self.capacity:
                self._readers.popitem(last=False)[1].close()
        self._readers[path] = reader
        return reader

    def clear(self) -> None:
        for path in list(self._readers):
            self.drop(path)

    def drop(self, path: str) -> None:
        reader = self._readers.pop(path, None)
        if reader is not None:
            reader.close()


_CACHE = _ReaderCache()  # per worker process: slide handles are opened here, in the process that reads them


def extract_shard(task: ShardTask) -> ShardOutcome:
    """Write one shard. A slide that fails mid-way aborts the shard (nothing appears) and is named."""
    name = shard_name(task.index)
    counts: dict[int, int] = {}
    writer = ShardWriter(task.dest, name)
    try:
        for slide_index, block_index in task.blocks:
            if slide_index in task.excluded:
                continue
            work = task.slides[slide_index]
            try:
                samples = _read_block(task, work, block_index)
            except Exception as exc:  # a slide's failure is recorded and the build goes on
                writer.abort()
                _CACHE.drop(work.path)
                return ShardOutcome(task.index, failed_slide=slide_index, reason=failure_reason(exc))
            for key, members in samples:
                writer.write(key, members, work.slide_id)
            counts[slide_index] = counts.get(slide_index, 0) + len(samples)
        if not counts:
            writer.abort()
            return ShardOutcome(task.index)
        return ShardOutcome(task.index, record=writer.commit(), patches_by_slide=counts)
    except BaseException:
        writer.abort()
        raise


def _read_block(task: ShardTask, work: SlideWork, block_index: int) -> list[tuple[str, dict[str, bytes]]]:
    if work.staged is not None:
        return work.staged.read(block_index)
    reader = _CACHE.get(work.path, task.fast_path)
    return block_samples(
        reader, work.blocks[block_index], work.cands, level=work.level, slide_id=work.slide_id,
        file_name=os.path.basename(work.path), target_mpp=task.target_mpp, image_format=task.image_format,
        quality=task.quality, label=work.label,
    )  # fmt: skip


def close_readers() -> None:
    """Close every slide handle this process holds."""
    _CACHE.clear()
