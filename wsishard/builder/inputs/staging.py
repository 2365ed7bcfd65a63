"""Slides in object storage: bounded local scratch copies, and per-slide staging of encoded patches.

SVS and pyramidal TIFF slides given as URLs are read in place, by range (:mod:`wsishard.slide.remote_tiff`), unless
in place cannot win: a tiny slide (:data:`~wsishard.slide.remote_tiff.COPY_BELOW_BYTES`), or one whose kept patches
lie on most of its bytes (:func:`in_place_pays`, known once its scan has laid them out) is copied instead.
OpenSlide needs local files, so any other slide given as a URL is copied into the scratch folder by the worker that
scans it, and deleted right after: a worker holds one slide copy at a time, so scratch holds at most ``jobs`` slides.
Shards mix every slide of a group, which would need the whole group on disk at once; instead, while the copy is
there, each block the scan laid out is read and encoded into a staging file of the slide's patches (about a tenth of
the slide's size), so the slide is downloaded once per build. A group's shards are assembled from its staging files,
which are deleted when the group is done; until then scratch keeps the staging files of the copied slides scanned.
A resumed build has lost them (and a slide whose staging failed has none): such slides are staged again when their
group is extracted, from a new copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import struct
import tempfile
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import fsspec
import numpy as np

from wsishard.builder.extract.patches import EncodeOptions, Samples, SlideWork, block_samples
from wsishard.errors import SlideError, SlideFailure
from wsishard.slide import SlideReader, open_slide
from wsishard.slide.dicom import is_dicom, series_files
from wsishard.slide.remote_tiff import RemoteTiffReader, open_in_place
from wsishard.storage.urls import StorageOptions, is_url, public_location

logger = logging.getLogger(__name__)

_LEN = struct.Struct("<I")
# A slide whose kept patches' tiles, read in place, would take more than this share of its file's bytes is copied:
# in place would download about as much, in more requests, with the directories read again to stage it.
COPY_ABOVE_FRACTION = 0.5


@dataclass(frozen=True)
class Scratch:
    """Where a build copies and stages slides given as URLs, and the fsspec options to fetch them."""

    folder: str = ""
    storage_options: dict[str, Any] = field(default_factory=dict)  # never logged or stored
    from_urls: bool = False  # some slides are URLs: those not read in place are copied to ``folder`` and staged


@contextlib.contextmanager
def scratch_for(paths: list[str], folder: str | None, storage_options: StorageOptions | None) -> Iterator[Scratch]:
    """The scratch space of a build of ``paths``: ``folder``, or a temporary folder (removed after) when slides are
    URLs."""
    from_urls = any(is_url(p) for p in paths)
    made = tempfile.mkdtemp(prefix="wsishard-scratch-") if from_urls and folder is None else None
    try:
        yield Scratch(made or folder or "", dict(storage_options or {}), from_urls)
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


@contextlib.contextmanager
def local_copy(url: str, scratch: str, storage_options: StorageOptions | None = None) -> Iterator[str]:
    """Copy ``url`` into a folder of its own in ``scratch`` for the duration of the ``with`` block, then delete it:
    a DICOM file with the other files of its series beside it (OpenSlide opens the series from the folder).

    Raises:
        SlideError: the object cannot be downloaded.
    """
    folder = os.path.join(scratch, f"copy-{uuid.uuid4().hex[:12]}")
    os.makedirs(folder)
    local = os.path.join(folder, _copy_name(url))
    try:
        try:
            fs, _ = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
            files = series_files(url, storage_options) if is_dicom(url) else [url]
            for one in files:
                fs.get_file(
                    fsspec.core.url_to_fs(one, **dict(storage_options or {}))[1], os.path.join(folder, _copy_name(one))
                )
        except (OSError, ValueError) as exc:
            raise SlideError(url, f"cannot be copied to scratch ({type(exc).__name__})") from exc
        yield local
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def copied_bytes(local: str) -> int:
    """The bytes :func:`local_copy` downloaded to make ``local`` (with a DICOM series' other files)."""
    folder = os.path.dirname(local)
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def _copy_name(url: str) -> str:
    return public_location(url).rstrip("/").rsplit("/", 1)[-1] or "slide"


def in_place_pays(reader: RemoteTiffReader, work: SlideWork) -> bool:
    """Whether reading ``work``'s patches in place downloads less than a copy: the ranges that fetch the tiles of
    its level under its patches (coalesced, as in place reads them) take under :data:`COPY_ABOVE_FRACTION` of the
    file's bytes (context patches' margins aside)."""
    tile_w, tile_h, counts = reader.tile_bytes(work.level)  # (rows, cols) int64
    cands, down = work.cands, reader.level_downsamples[work.level]
    x0, y0, side = cands.l0_x / down, cands.l0_y / down, cands.l0_extent / down
    rows, cols = counts.shape
    c0 = np.clip((x0 // tile_w).astype(np.int64), 0, cols - 1)
    r0 = np.clip((y0 // tile_h).astype(np.int64), 0, rows - 1)
    c1 = np.clip(((x0 + side - 1) // tile_w).astype(np.int64), c0, cols - 1) + 1
    r1 = np.clip(((y0 + side - 1) // tile_h).astype(np.int64), r0, rows - 1) + 1
    edges = np.zeros((rows + 1, cols + 1), dtype=np.int64)  # each patch's tile rectangle, as corner increments
    for r, c, sign in ((r0, c0, 1), (r0, c1, -1), (r1, c0, -1), (r1, c1, 1)):
        np.add.at(edges, (r, c), sign)
    under = edges.cumsum(axis=0).cumsum(axis=1)[:rows, :cols] > 0  # (rows, cols): tiles under some patch
    return reader.in_place_bytes(work.level, under) < COPY_ABOVE_FRACTION * reader.size_bytes


@dataclass(frozen=True)
class StagedSlide:
    """A slide's encoded patches in a local staging file: block index -> (offset, length)."""

    path: str
    blocks: tuple[tuple[int, int], ...]
    bytes_read: int = 0  # bytes of the slide file downloaded to stage it

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
    """One slide to stage: its planned blocks (``work``), where to copy it, how to encode its patches."""

    index: int
    url: str
    work: SlideWork  # its path is the URL; the local copy is read
    scratch: Scratch
    encode: EncodeOptions
    copy: bool = False  # its scan chose a copy (its record's ``read``): never read in place


@dataclass(frozen=True)
class StageOutcome:
    index: int
    staged: StagedSlide | None = None
    reason: str = ""


def stage_slide(task: StageTask) -> StageOutcome:
    """Encode every planned block of one slide into a staging file: read in place, or from a copy deleted after."""
    scratch = task.scratch
    out_path = staging_path(scratch.folder, task.index)
    with SlideFailure(public_location(task.url)) as failure:  # logged (-v) without a query string or user info
        fast = task.encode.fast_path and not task.copy
        remote = open_in_place(task.url, scratch.folder, scratch.storage_options, fast=fast)
        if remote is not None:  # tiles read by range
            with remote:
                spans = _write_blocks(remote, replace(task.work, file_name=task.work.name), task.encode, out_path)
            return StageOutcome(task.index, StagedSlide(out_path, tuple(spans), remote.bytes_read))
        with local_copy(task.url, scratch.folder, scratch.storage_options) as local:
            staged = stage_copy(local, task.work, task.encode, out_path)
            copied = copied_bytes(local)
        return StageOutcome(task.index, replace(staged, bytes_read=copied))
    if os.path.exists(out_path):
        os.remove(out_path)
    return StageOutcome(task.index, reason=failure.reason or "")


def staging_path(scratch: str, index: int) -> str:
    """A new staging file's path for slide ``index`` (its folder made)."""
    out_path = os.path.join(scratch, "staging", f"{index:07d}-{uuid.uuid4().hex[:8]}.bin")
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    return out_path


def stage_copy(local: str, work: SlideWork, encode: EncodeOptions, out_path: str) -> StagedSlide:
    """Encode every block of ``work`` from ``local``, a copy of the slide, into the staging file ``out_path``.

    Raises:
        SlideError: (and others) the copy cannot be read; the staging file may be left behind.
    """
    work = replace(work, path=local, file_name=work.name)  # samples name the slide, not the copy
    with open_slide(local, fast=encode.fast_path) as reader:
        return StagedSlide(out_path, tuple(_write_blocks(reader, work, encode, out_path)))


def stage_scanned(
    local: str, work: SlideWork | None, index: int, url: str, scratch: str, encode: EncodeOptions
) -> StagedSlide | None:
    """A slide just scanned from ``local``, its copy of ``url``: its patches (``work``: its blocks), every block
    encoded from that copy before it is deleted, so the slide is copied once per build. None when it has none, or
    when staging failed (extraction then stages it again from a new copy, and fails it there)."""
    if work is None:
        return None
    out_path = staging_path(scratch, index)
    with SlideFailure(url) as failure:
        return stage_copy(local, work, encode, out_path)
    logger.debug("%s not staged while scanning: %s", public_location(url), failure.reason)
    if os.path.exists(out_path):
        os.remove(out_path)
    return None


def crashed_stage(task: StageTask) -> StageOutcome:
    """The outcome for a slide whose staging killed its worker process twice."""
    return StageOutcome(task.index, reason="the worker process staging it died twice (killed: out of memory?)")


def _write_blocks(reader: SlideReader, work: SlideWork, encode: EncodeOptions, out_path: str) -> list[tuple[int, int]]:
    spans = []
    with open(out_path, "wb") as fh:
        for block in work.blocks:
            data = _frame(block_samples(reader, work, block, encode))
            spans.append((fh.tell(), len(data)))
            fh.write(data)
    return spans


def remove_staging(scratch: str, staged: Iterable[StagedSlide] | None = None) -> None:
    """Remove the staging files ``staged``, or the whole staging folder (leftovers of earlier runs too)."""
    if staged is None:
        shutil.rmtree(os.path.join(scratch, "staging"), ignore_errors=True)
        return
    for one in staged:
        with contextlib.suppress(FileNotFoundError):
            os.remove(one.path)


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
