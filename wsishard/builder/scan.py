"""Per-slide scan: open, resolve mpp, pick the level, detect tissue on a low-res view, lay out the patch grid.

Scanning reads only a low-resolution view (plus, when shards are sized in bytes, two blocks to measure encoded
bytes per patch), so it is cheap next to extraction. Its result is small and picklable.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import skimage.filters.rank

from wsishard.builder.context import context_footprints, context_legend
from wsishard.builder.grid import (
    Block,
    Candidates,
    PatchOptions,
    blocks,
    candidates,
    choose_level,
    grid_shape,
    output_scale,
)
from wsishard.builder.patches import EncodeOptions, SlideWork, block_samples
from wsishard.builder.qc import QcLayers, legend_lines
from wsishard.builder.qcrecord import QcRecord, picture_png, view_jpeg
from wsishard.builder.roi import RoiOptions, label_patches, roi_status, slide_roi
from wsishard.builder.staging import StagedSlide, local_copy, stage_copy, staging_path
from wsishard.builder.stain import fit_or_reference
from wsishard.builder.tissue import TissueOptions, TissueResult, find_tissue
from wsishard.errors import OutputError, SlideError, SlideFailure
from wsishard.manifest import SlideRecord
from wsishard.slide import SlideReader, open_slide, read_lowres, resolve_mpp
from wsishard.slide import openslide_backend as _openslide_backend
from wsishard.slide.remote_tiff import open_in_place
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions, is_url, public_location

logger = logging.getLogger(__name__)

# What the workers' scans use, though the modules that need it import it lazily (so that the CLI starts without
# it): imported with this module, so before a build's pool forks its workers, which inherit it (a forkserver
# preloads this module) instead of each importing it again.
_PRELOADED = (skimage.filters.rank, _openslide_backend)

_MEASURED_PATCHES = 6  # patches per slide encoded while scanning to size shards in bytes
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # writing failed for want of room or rights: not the slide's


@dataclass(frozen=True, kw_only=True)
class ScanTask:
    """Everything a worker needs to scan one slide."""

    index: int
    path: str
    slide_id: str
    patch: PatchOptions
    tissue: TissueOptions
    encode: EncodeOptions
    measure: bool  # encode a few patches to measure bytes per patch
    mpp_override: float | None
    default_mpp: float | None
    label: int | None
    seed: int
    dest: Destination  # the build output (QC pictures go there)
    roi: RoiOptions = field(default_factory=RoiOptions)
    roi_file: str | None = None  # the slide's annotation file (None: none; see roi.missing when roi.path is set)
    qc_name: str | None  # the QC picture's name in the output (None: no picture)
    qc_size_px: int = 2000  # the QC picture's longest side (at most; a small slide's is smaller)
    scratch: str = ""  # local folder for a copy of a slide given as a URL
    storage_options: StorageOptions = field(default_factory=dict)


@dataclass(frozen=True)
class ScanResult:
    """A slide's record plus what extraction needs (empty for failed slides)."""

    record: SlideRecord
    cands: Candidates | None = None
    blocks: list[Block] = field(default_factory=list)
    bytes_per_patch: float | None = None
    staged: StagedSlide | None = None  # a slide copied from object storage: its patches, encoded from that copy
    qc: QcRecord | None = None  # what its QC picture needs (None: the scan failed before finding tissue)

    @property
    def block_sizes(self) -> list[int]:
        return [len(b.patches) for b in self.blocks]

    @property
    def work(self) -> SlideWork | None:
        """What reading the slide's patches needs (None: it has none)."""
        return None if self.cands is None else _slide_work(self.record, self.cands, self.blocks)


def _slide_work(record: SlideRecord, cands: Candidates, block_list: list[Block]) -> SlideWork:
    return SlideWork(path=record.file, slide_id=record.slide_id, level=record.level or 0, mpp=record.patch_mpp or 0,
                     cands=cands, blocks=block_list, label=record.label)  # fmt: skip


def scan_slide(task: ScanTask) -> ScanResult:
    """Scan one slide. Never raises for a bad slide: failures come back as a failed record with a reason.

    Raises:
        OutputError: the QC picture cannot be written into the output, or a disk is full: not the slide's failure
            (a failed record is kept by a resumed build), and every slide would fail the same way.
    """
    record = SlideRecord(slide_id=task.slide_id, file=public_location(task.path), status="failed", label=task.label)
    stop: OutputError | None = None
    with SlideFailure(record.file) as failure:  # logged (-v) without a URL's query string or user info
        try:
            if not is_url(task.path):
                return _scan_path(task, task.path, record)
            remote = open_in_place(task.path, task.scratch, task.storage_options, fast=task.encode.fast_path)
            if remote is not None:
                with remote:
                    result = _scan_open(task, remote, record)
                return replace(result, record=replace(result.record, bytes_read=remote.bytes_read))
            with local_copy(task.path, task.scratch, task.storage_options) as local:
                result = _scan_path(task, local, record)
                copied = os.path.getsize(local)
                result = replace(result, staged=_stage_from_copy(task, local, result))
            return replace(result, record=replace(result.record, bytes_read=copied))
        except OutputError as exc:
            stop = exc
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            stop = OutputError(exc.filename or task.scratch or task.path, exc.strerror or str(exc))
    if stop is not None:
        raise stop
    return ScanResult(replace(record, reason=(failure.reason or "").replace(task.path, record.file)))


def crashed_scan(task: ScanTask) -> ScanResult:
    """The result for a slide whose scan killed its worker process twice (an out-of-memory kill, say)."""
    reason = "the worker process scanning it died twice (killed: out of memory?)"
    return ScanResult(SlideRecord(slide_id=task.slide_id, file=public_location(task.path), status="failed",
                                  label=task.label, reason=reason))  # fmt: skip


def _stage_from_copy(task: ScanTask, local: str, result: ScanResult) -> StagedSlide | None:
    """A scanned slide's patches, every block encoded from the copy the scan read (so it is copied once per build);
    None when it has none or staging failed (extraction then stages it again from a new copy, and fails it there)."""
    work = result.work
    if work is None:
        return None
    out_path = staging_path(task.scratch, task.index)
    with SlideFailure(task.path) as failure:
        return stage_copy(local, work, task.encode, out_path)
    logger.debug("%s not staged while scanning: %s", public_location(task.path), failure.reason)
    if os.path.exists(out_path):
        os.remove(out_path)
    return None


def _scan_path(task: ScanTask, path: str, record: SlideRecord) -> ScanResult:
    with open_slide(path, fast=task.encode.fast_path) as reader:
        return _scan_open(task, reader, record)


def _scan_open(task: ScanTask, reader: SlideReader, record: SlideRecord) -> ScanResult:
    """Scan an open slide; ``record`` is filled in as facts become known (failures keep what was learnt)."""
    l0_w, l0_h = reader.level_dimensions[0]
    record = _resolution(task, reader, replace(record, width=l0_w, height=l0_h))
    if record.reason:
        return ScanResult(record)
    patch, mpp0 = task.patch, float(record.mpp or 0)
    l0_per_o = output_scale(mpp0, float(record.downsample or 1), patch)
    cols, rows = grid_shape((l0_w, l0_h), l0_per_o, patch.patch_size_px, patch.stride)
    if cols == 0 or rows == 0:
        reason = f"smaller than one {patch.patch_size_px} px patch at {patch.target_mpp} mpp ({l0_w}x{l0_h})"
        return ScanResult(replace(record, reason=reason))
    record = replace(record, roi=roi_status(task.roi, task.roi_file))
    if task.roi.path is not None and task.roi_file is None and task.roi.missing == "skip":
        return ScanResult(replace(record, status="skipped", reason="no annotation file in --roi (--roi-missing whole "
                                                                   "builds it whole)"))  # fmt: skip
    asked = max(task.tissue.thumb_mpp / mpp0, max(l0_w, l0_h) / task.tissue.max_thumb_px, 1.0)
    thumb, l0_per_t = read_lowres(reader, asked)
    found = find_tissue(thumb, l0_per_t * mpp0, task.tissue)
    mask = found.mask
    roi = slide_roi(task.roi, task.roi_file, mask.shape, l0_per_t)
    cands = candidates((l0_w, l0_h), mpp0, mask, l0_per_t, patch,
                       seed=_slide_seed(task), level_downsample=float(record.downsample or 1),
                       artefact=found.ink | found.dark, roi=None if roi is None else roi.mask,
                       min_roi_coverage=task.roi.min_roi_coverage, pigment=found.pigment)  # fmt: skip
    if roi is not None and task.roi.labels:
        cands = label_patches(cands, roi, task.roi.labels, l0_per_t)
    record = replace(record, **_tissue_report(found, l0_per_t * mpp0, cands))
    layers = QcLayers(mask, l0_per_t, found.ink, found.dark, None if roi is None else roi.mask, found.pigment)
    qc = _qc_record(task, layers, asked, thumb, cands, record)
    if task.qc_name is not None:
        _write_qc(task, reader, thumb, qc, cands)
    if len(cands) == 0:
        reason = "no tissue found" if not mask.any() else f"no patch with >= {patch.min_tissue:.0%} tissue"
        left_out = ", ".join(f"{k} {n}" for k, n in sorted(record.filtered.items()))
        return ScanResult(replace(record, reason=reason + (f" (left out: {left_out})" if left_out else "")), qc=qc)
    block_list = blocks(cands, patch.block_patches)
    work = _slide_work(record, cands, block_list)
    # the stain on the whole view, not the tissue mask: the scan's masks take darker-stained tissue for ink
    record = replace(record, stain=fit_or_reference(thumb[None], seed=_slide_seed(task)).to_record())
    measured = _bytes_per_patch(task, reader, work) if task.measure else None
    return ScanResult(replace(record, status="ok"), cands, block_list, measured, qc=qc)


def _tissue_report(found: TissueResult, t_mpp: float, cands: Candidates) -> dict[str, Any]:
    """The slide record's tissue fields: fraction, areas in mm^2 (``t_mpp``: microns per view px), candidates and
    the patches the scan left out per reason."""
    mm2 = (t_mpp / 1000.0) ** 2  # per view px
    counts = {
        "min_tissue": cands.dropped_low,
        "artefact": cands.dropped_artefact,
        "roi": cands.dropped_roi,
        "roi_class": cands.dropped_class,
        "max_patches": cands.dropped_cap,
    }
    filtered = {reason: n for reason, n in counts.items() if n}
    return dict(tissue_fraction=round(float(found.mask.mean()), 4), candidates=cands.total,
                tissue_mm2=round(int(found.mask.sum()) * mm2, 4), ink_mm2=round(int(found.ink.sum()) * mm2, 4),
                artefact_mm2=round(int((found.dark & ~found.ink).sum()) * mm2, 4),
                pigment_mm2=round(int(found.pigment.sum()) * mm2, 4), filtered=filtered)  # fmt: skip


def _qc_record(task: ScanTask, layers: QcLayers, asked: float, thumb: np.ndarray, cands: Candidates,
               record: SlideRecord) -> QcRecord:  # fmt: skip
    """What the slide's QC picture needs (:mod:`wsishard.builder.qcrecord`), drawn now or later."""
    legend = legend_lines(tissue_mm2=record.tissue_mm2, ink_mm2=record.ink_mm2, artefact_mm2=record.artefact_mm2,
                          kept=len(cands), filtered=record.filtered, roi=record.roi,
                          pigment_mm2=record.pigment_mm2)  # fmt: skip
    footprints = context_footprints(cands, task.encode.context, float(record.mpp or 1))
    legend += context_legend(task.encode.context) if footprints else []
    return QcRecord(layers, asked, float(record.mpp or 1), tuple(legend), tuple(footprints), view_jpeg(thumb))


def _write_qc(task: ScanTask, reader: SlideReader, thumb: np.ndarray, qc: QcRecord, cands: Candidates) -> None:
    """Draw the slide's QC picture (``--qc``) and write it into the output.

    Raises:
        OutputError: it cannot be written (a permission, a full disk, a read-only store).
    """
    data = picture_png(qc, cands, task.qc_size_px, reader, view=thumb)
    name = task.qc_name or ""
    try:
        task.dest.write_bytes(name, data)
    except OSError as exc:
        raise OutputError(task.dest.path(name), exc.strerror or str(exc)) from exc


def _resolution(task: ScanTask, reader: SlideReader, record: SlideRecord) -> SlideRecord:
    """The record with the slide's mpp, the level read and the patches' actual mpp; or with the reason it has none."""
    try:
        mpp0, mpp_source = resolve_mpp(
            task.path, reader.properties, task.mpp_override, task.default_mpp, (record.width or 0, record.height or 0)
        )
        record = replace(record, mpp=mpp0, mpp_source=mpp_source)
        level = choose_level(task.path, mpp0, reader.level_downsamples, task.patch)
    except SlideError as exc:
        return replace(record, reason=exc.reason)
    downsample = reader.level_downsamples[level]
    patch_mpp = round(mpp0 * output_scale(mpp0, downsample, task.patch), 6)
    return replace(record, level=level, downsample=downsample, patch_mpp=patch_mpp)


def _slide_seed(task: ScanTask) -> int:
    return int.from_bytes(task.slide_id.encode()[:8].ljust(8, b"\0"), "little") ^ task.seed


def _bytes_per_patch(task: ScanTask, reader: SlideReader, work: SlideWork) -> float | None:
    """Mean encoded bytes of a sample, measured on a few seeded patches of the slide (read one by one)."""
    cands = work.cands
    rng = np.random.default_rng((task.seed, task.index, 0x5CA9))
    picks = rng.choice(len(cands), size=min(_MEASURED_PATCHES, len(cands)), replace=False)
    sizes: list[int] = []
    for i in picks.tolist():
        ox, oy = int(cands.col[i]) * cands.stride, int(cands.row[i]) * cands.stride
        one = Block(patches=np.array([i]), o_x=ox, o_y=oy, o_w=cands.patch, o_h=cands.patch)
        samples = block_samples(reader, work, one, task.encode)
        sizes.extend(sum(len(v) for v in members.values()) for _, members in samples)
    return float(np.mean(sizes)) if sizes else None  # None: every patch measured was left out by a quality filter
