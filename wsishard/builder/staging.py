"""Slides in object storage: listing, bounded local scratch copies, and per-slide staging of encoded patches.

OpenSlide needs local files, so a slide given as a URL is copied into the scratch folder right before it is used
and deleted right after: a worker holds one slide copy at a time, so scratch holds at most ``jobs`` slides.
Shards mix every slide of a group, which would need the whole group on disk at once; instead each slide is read
once into a staging file of encoded patches (about a tenth of the slide's size), and the group's shards are then
assembled from the staging files, which are deleted when the group is done.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import fsspec

from wsishard.encode import block_samples
from wsishard.errors import OptionError, SlideError, failure_reason
from wsishard.slide import SLIDE_SUFFIXES, open_slide

Samples = list[tuple[str, dict[str, bytes]]]
_LEN = struct.Struct("<I")


def list_slides(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """Slide URLs under a prefix (recursive), or the URL itself when it names one object.

    Raises:
        OptionError: nothing exists at ``url``.
    """
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    protocol = url.split("://", 1)[0]
    if fs.isfile(root):
        return [url]
    if not fs.exists(root):
        raise OptionError(f"no such object or prefix: {url}")
    found = [p for p in fs.find(root) if p.lower().endswith(SLIDE_SUFFIXES) and "/." not in p]
    return [f"{protocol}://{p}" for p in sorted(found)]


@contextlib.contextmanager
def local_copy(url: str, scratch: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[str]:
    """Copy ``url`` into ``scratch`` for the duration of the ``with`` block, then delete it.

    Raises:
        SlideError: the object cannot be downloaded.
    """
    os.makedirs(scratch, exist_ok=True)
    local = os.path.join(scratch, f"{uuid.uuid4().hex[:12]}-{url.rstrip('/').rsplit('/', 1)[-1]}")
    try:
        try:
            fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
            fs.get_file(path, local)
        except (OSError, ValueError) as exc:
            raise SlideError(url, f"cannot be copied to scratch ({type(exc).__name__})") from exc
        yield local
    finally:
        if os.path.exists(local):
            os.remove(local)


@dataclass(frozen=True)
class StagedSlide:
    """A slide's encoded patches in a local staging file: block index -> (offset, length)."""

    path: str
    blocks: tuple[tuple[int, int], ...]

    def read(self, block: int) -> Samples:
        offset, length = self.blocks[block]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            data = os.pread(fd, length, offset)
        finally:
            os.close(fd)
        return _unframe(data)


@dataclass(frozen=True, kw_only=True)
class StageTask:
    index: int
    url: str
    slide_id: str
    level: int
    cands: Any  # grid.Candidates
    blocks: list[Any]  # list[grid.Block]
    label: int | None
    scratch: str
    storage_options: dict[str, Any]
    target_mpp: float
    image_format: str
    quality: int
    fast_path: bool


@dataclass(frozen=True)
class StageOutcome:
    index: int
    staged: StagedSlide | None = None
    reason: str = ""


def stage_slide(task: StageTask) -> StageOutcome:
    """Copy one slide to scratch, encode every planned block into a staging file, delete the copy."""
    out_path = os.path.join(task.scratch, "staging", f"{task.index:07d}-{uuid.uuid4().hex[:8]}.bin")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    try:
        with local_copy(task.url, task.scratch, task.storage_options) as local:
            reader = open_slide(local, fast=task.fast_path)
            try:
                spans = _write_blocks(task, reader, out_path)
            finally:
                reader.close()
    except Exception as exc:  # the build's boundary: a slide's failure is recorded, the build goes on
        if os.path.exists(out_path):
            os.remove(out_path)
        return StageOutcome(task.index, reason=failure_reason(exc))
    return StageOutcome(task.index, StagedSlide(out_path, tuple(spans)))


def _write_blocks(task: StageTask, reader: Any, out_path: str) -> list[tuple[int, int]]:
    spans = []
    with open(out_path, "wb") as fh:
        for block in task.blocks:
            samples = block_samples(
                reader, block, task.cands, level=task.level, slide_id=task.slide_id,
                file_name=task.url.rsplit("/", 1)[-1], target_mpp=task.target_mpp, image_format=task.image_format,
                quality=task.quality, label=task.label,
            )  # fmt: skip
            data = _frame(samples)
            spans.append((fh.tell(), len(data)))
            fh.write(data)
    return spans


def remove_staging(scratch: str) -> None:
    shutil.rmtree(os.path.join(scratch, "staging"), ignore_errors=True)


def _frame(samples: Samples) -> bytes:
    """Samples as bytes: per sample a length-prefixed JSON header (key, member sizes) and the member bytes."""
    parts = []
    for key, members in samples:
        exts = sorted(members)
        header = json.dumps({"key": key, "members": [[e, len(members[e])] for e in exts]}).encode()
        parts += [_LEN.pack(len(header)), header, *(members[e] for e in exts)]
    return b"".join(parts)


def _unframe(data: bytes) -> Samples:
    out: Samples = []
    pos = 0
    while pos < len(data):
        (n,) = _LEN.unpack_from(data, pos)
        header = json.loads(data[pos + 4 : pos + 4 + n])
        pos += 4 + n
        members = {}
        for ext, size in header["members"]:
            members[ext] = data[pos : pos + size]
            pos += size
        out.append((header["key"], members))
    return out
