"""Per-slide scan: open, resolve mpp, pick the level, detect tissue on a low-res view, lay out the patch grid.

Scanning reads only a low-resolution view (plus, when shards are sized in bytes, two blocks to measure encoded
bytes per patch), so it is cheap next to extraction. Its result is small and picklable.
"""

from __future__ import annotations

import errno
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from wsishard.builder.extract.context import context_footprints, context_legend
from wsishard.builder.extract.patches import SlideWork, block_samples
from wsishard.builder.inputs.roi import label_patches, roi_status, slide_roi
from wsishard.builder.inputs.sources import lookup
from wsishard.builder.inputs.staging import Scratch, StagedSlide, copied_bytes, in_place_pays, local_copy, stage_scanned
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.patchopts import PatchOptions
from wsishard.builder.qc.qc import QcLayers, legend_lines
from wsishard.builder.qc.qcrecord import QcRecord, picture_png, view_jpeg
from wsishard.builder.scan.grid import (
    Block,
    Candidates,
    ScaleWork,
    blocks,
    candidates,
    choose_level,
    grid_shape,
    output_scale,
    scale_grids,
)
from wsishard.builder.scan.stain import fit_or_reference
from wsishard.builder.scan.tissue import TissueResult, find_tissue
from wsishard.errors import OutputError, SlideError, SlideFailure
from wsishard.format import qc_picture_name, unique_slide_ids
from wsishard.manifest import SlideRecord
from wsishard.slide import SlideReader, open_slide, read_lowres, resolve_mpp
from wsishard.slide import openslide_backend as _openslide_backend
from wsishard.slide.remote_tiff import open_in_place
from wsishard.storage.output import Destination
from wsishard.storage.urls import is_url, public_location

logger = logging.getLogger(__name__)

# What the workers' scans use, though the modules that need it import it lazily (so that the CLI starts without
# it): imported with this module, so before a build's pool forks its workers, which inherit it (a forkserver
# preloads this module) instead of each importing it again.
_PRELOADED = (_openslide_backend,)

_MEASURED_PATCHES = 6  # patches per slide encoded while scanning to size shards in bytes...
_CALIBRATED = 2  # ...or this many, scaled by the slide's compressed tile sizes, where the reader knows them
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)  # writing failed for want of room or rights: not the slide's


@dataclass(frozen=True, kw_only=True)
class ScanTask:
    """One slide to scan: the slide, what the build's per-slide tables give it, and the build's options.

    ``options`` are the build's without the per-slide tables (``labels``, ``mpp_overrides``), which would be pickled
    with every task sent to a worker: :func:`scan_tasks` looks the slide up in them (``label``, ``mpp_override``).
    """

    index: int
    path: str
    slide_id: str
    options: BuildOptions  # without labels and mpp_overrides
    dest: Destination  # the build output (QC pictures go there)
    label: int | None = None
    mpp_override: float | None = None  # the slide's level-0 mpp from the build's table (None: not in it)
    roi_file: str | None = None  # the slide's annotation file (None: none; see roi.missing when roi.path is set)
    scratch: Scratch = field(default_factory=Scratch)  # where a slide given as a URL is copied

    @property
    def qc_name(self) -> str | None:
        """The QC picture's name in the output (None: no picture)."""
        return qc_picture_name(self.slide_id) if self.options.qc else None


def scan_tasks(
    options: BuildOptions,
    paths: list[str],
    indices: Iterable[int],
    annotations: list[str | None],
    dest: Destination,
    scratch: Scratch,
    names: Mapping[str, str] | None = None,
) -> Iterator[ScanTask]:
    """The scan tasks of the slides ``indices`` of a build of ``paths`` (each slide's id is unique among them all;
    ``annotations``: each slide's annotation file; ``names``: the slides not named by their file, by location)."""
    ids = unique_slide_ids([public_location(p) for p in paths], names)  # never from a query string
    shared = replace(options, labels={}, mpp_overrides={})
    for i in indices:
        yield ScanTask(
            index=i,
            path=paths[i],
            slide_id=ids[i],
            options=shared,
            dest=dest,
            scratch=scratch,
            label=lookup(options.labels, paths[i]),
            mpp_override=lookup(options.mpp_overrides, paths[i]),
            roi_file=annotations[i],
        )


@dataclass(frozen=True)
class ScanResult:
    """A slide's record plus what extraction needs (empty for failed slides)."""

    record: SlideRecord
    cands: Candidates | None = None
    blocks: list[Block] = field(default_factory=list)
    bytes_per_patch: float | None = None
    staged: StagedSlide | None = None  # a slide copied from object storage: its patches, encoded from that copy
    qc: QcRecord | None = None  # what its QC picture needs (None: the scan failed before finding tissue)
    scales: tuple[ScaleWork, ...] = ()  # a multi-mpp build's scales (``cands`` is the first's; ``blocks``, all of them)

    @property
    def block_sizes(self) -> list[int]:
        return [len(b.patches) for b in self.blocks]

    @property
    def work(self) -> SlideWork | None:
        """What reading the slide's patches needs (None: it has none)."""
        return None if self.cands is None else _slide_work(self.record, self.cands, self.blocks, self.scales)


def _slide_work(
    record: SlideRecord, cands: Candidates, block_list: list[Block], scales: tuple[ScaleWork, ...] = ()
) -> SlideWork:
    return SlideWork(
        path=record.file,
        slide_id=record.slide_id,
        level=record.level or 0,
        patch_mpp=record.patch_mpp or 0,
        cands=cands,
        blocks=block_list,
        label=record.label,
        scales=scales,
    )


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
            return _scan_url(task, record)
        except OutputError as exc:
            stop = exc
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise
            stop = OutputError(exc.filename or task.scratch.folder or task.path, exc.strerror or str(exc))
    if stop is not None:
        raise stop
    return ScanResult(replace(record, reason=(failure.reason or "").replace(task.path, record.file)))


def crashed_scan(task: ScanTask) -> ScanResult:
    """The result for a slide whose scan killed its worker process twice (an out-of-memory kill, say)."""
    reason = "the worker process scanning it died twice (killed: out of memory?)"
    return ScanResult(
        SlideRecord(
            slide_id=task.slide_id, file=public_location(task.path), status="failed", label=task.label, reason=reason
        )
    )


def _scan_url(task: ScanTask, record: SlideRecord) -> ScanResult:
    """A slide given as a URL, read in place by range; or scanned from a copy in scratch (or in place, then copied
    where its patches lie on most of its bytes: ``in_place_pays``), its patches staged from that copy."""
    scratch, fast = task.scratch, task.options.fast_path
    remote = open_in_place(task.path, scratch.folder, scratch.storage_options, fast=fast)
    scanned = 0
    if remote is not None:
        with remote:
            result = _scan_open(task, remote, record)
            work = result.work
            if work is None or in_place_pays(remote, work):
                return replace(result, record=replace(result.record, bytes_read=remote.bytes_read, read="in place"))
        scanned = remote.bytes_read
    with local_copy(task.path, scratch.folder, scratch.storage_options) as local:
        result = _scan_path(task, local, record) if remote is None else result
        copied = copied_bytes(local)
        staged = stage_scanned(local, result.work, task.index, task.path, scratch.folder, task.options.encode)
    return replace(result, staged=staged, record=replace(result.record, bytes_read=scanned + copied, read="copied"))


def _scan_path(task: ScanTask, path: str, record: SlideRecord) -> ScanResult:
    with open_slide(path, fast=task.options.fast_path) as reader:
        return _scan_open(task, reader, record)


def _scan_open(task: ScanTask, reader: SlideReader, record: SlideRecord) -> ScanResult:
    """Scan an open slide; ``record`` is filled in as facts become known (failures keep what was learnt)."""
    l0_w, l0_h = reader.level_dimensions[0]
    record = _resolution(task, reader, replace(record, width=l0_w, height=l0_h))
    if record.reason:
        return ScanResult(record)
    options = task.options
    patch, mpp0 = options.patch.at(options.patch.mpps[0]), float(record.slide_mpp or 0)  # the finest scale
    l0_per_o = output_scale(mpp0, float(record.downsample or 1), patch)
    cols, rows = grid_shape((l0_w, l0_h), l0_per_o, patch.patch_size_px, patch.stride)
    if cols == 0 or rows == 0:
        reason = f"smaller than one {patch.patch_size_px} px patch at {patch.target_mpp} mpp ({l0_w}x{l0_h})"
        return ScanResult(replace(record, reason=reason))
    record = replace(record, roi=roi_status(options.roi, task.roi_file))
    if options.roi.path is not None and task.roi_file is None and options.roi.missing == "skip":
        return ScanResult(
            replace(
                record, status="skipped", reason="no annotation file in --roi (--roi-missing whole builds it whole)"
            )
        )
    asked = max(options.tissue.thumb_mpp / mpp0, max(l0_w, l0_h) / options.tissue.max_thumb_px, 1.0)
    thumb, l0_per_t = read_lowres(reader, asked)
    found = find_tissue(thumb, l0_per_t * mpp0, options.tissue)
    mask = found.mask
    roi = slide_roi(options.roi, task.roi_file, mask.shape, l0_per_t)

    grid = _grids(task, (l0_w, l0_h), mpp0, found, roi, l0_per_t)
    cands = grid(patch, float(record.downsample or 1))
    scales = scale_grids(task.path, options.patch, record, reader.level_downsamples, cands, grid)
    record = replace(record, **_tissue_report(found, l0_per_t * mpp0, cands))
    layers = QcLayers(mask, l0_per_t, found.ink, found.dark, None if roi is None else roi.mask, found.pigment)
    qc = _qc_record(task, layers, asked, thumb, cands, record)
    if task.qc_name is not None:
        _write_qc(task, reader, thumb, qc, cands)
    if len(cands) + sum(len(one.cands) for one in scales[1:]) == 0:
        reason = "no tissue found" if not mask.any() else f"no patch with >= {patch.min_tissue:.0%} tissue"
        left_out = ", ".join(f"{k} {n}" for k, n in sorted(record.filtered.items()))
        return ScanResult(replace(record, reason=reason + (f" (left out: {left_out})" if left_out else "")), qc=qc)
    block_list = [
        b for i, one in enumerate(scales or (None,)) for b in blocks(one.cands if one else cands, options.block_side, i)
    ]
    work = _slide_work(record, cands, block_list, scales)
    # the stain on the whole view, not the tissue mask: the scan's masks take darker-stained tissue for ink
    record = replace(record, stain=fit_or_reference(thumb[None], seed=_slide_seed(task)).to_record())
    measured = _bytes_per_patch(task, reader, work) if options.shard_size_bytes is not None else None
    return ScanResult(replace(record, status="ok"), cands, block_list, measured, qc=qc, scales=scales)


def _grids(
    task: ScanTask, l0_dims: tuple[int, int], mpp0: float, found: TissueResult, roi: Any, l0_per_t: float
) -> Callable[[PatchOptions, float], Candidates]:
    """A scale's candidates (given its patch options and its level's downsample) on the slide's one tissue mask."""
    options = task.options

    def grid(patch: PatchOptions, downsample: float) -> Candidates:
        cands = candidates(
            l0_dims,
            mpp0,
            found.mask,
            l0_per_t,
            patch,
            seed=_slide_seed(task),
            level_downsample=downsample,
            artefact=found.ink | found.dark,
            roi=None if roi is None else roi.mask,
            min_roi_coverage=options.roi.min_roi_coverage,
            pigment=found.pigment,
        )
        labels = options.roi.labels
        return cands if roi is None or not labels else label_patches(cands, roi, labels, l0_per_t)

    return grid


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
    return dict(
        tissue_fraction=round(float(found.mask.mean()), 4),
        candidates=cands.total,
        tissue_mm2=round(int(found.mask.sum()) * mm2, 4),
        ink_mm2=round(int(found.ink.sum()) * mm2, 4),
        artefact_mm2=round(int((found.dark & ~found.ink).sum()) * mm2, 4),
        pigment_mm2=round(int(found.pigment.sum()) * mm2, 4),
        filtered=filtered,
    )


def _qc_record(
    task: ScanTask, layers: QcLayers, asked: float, thumb: np.ndarray, cands: Candidates, record: SlideRecord
) -> QcRecord:
    """What the slide's QC picture needs (:mod:`wsishard.builder.qc.qcrecord`), drawn now or later."""
    legend = legend_lines(
        tissue_mm2=record.tissue_mm2,
        ink_mm2=record.ink_mm2,
        artefact_mm2=record.artefact_mm2,
        kept=len(cands),
        filtered=record.filtered,
        roi=record.roi,
        pigment_mm2=record.pigment_mm2,
    )
    context = task.options.encode.context
    footprints = context_footprints(cands, context, float(record.slide_mpp or 1))
    legend += context_legend(context) if footprints else []
    return QcRecord(layers, asked, float(record.slide_mpp or 1), tuple(legend), tuple(footprints), view_jpeg(thumb))


def _write_qc(task: ScanTask, reader: SlideReader, thumb: np.ndarray, qc: QcRecord, cands: Candidates) -> None:
    """Draw the slide's QC picture (``--qc``) and write it into the output.

    Raises:
        OutputError: it cannot be written (a permission, a full disk, a read-only store).
    """
    data = picture_png(qc, cands, task.options.qc_size_px, reader, view=thumb)
    name = task.qc_name or ""
    try:
        task.dest.write_bytes(name, data)
    except OSError as exc:
        raise OutputError(task.dest.path(name), exc.strerror or str(exc)) from exc


def _resolution(task: ScanTask, reader: SlideReader, record: SlideRecord) -> SlideRecord:
    """The record with the slide's mpp, the level read and the patches' actual mpp; or with the reason it has none."""
    options, l0_dims = task.options, (record.width or 0, record.height or 0)
    try:
        mpp0, mpp_source = resolve_mpp(task.path, reader.properties, task.mpp_override, options.default_mpp, l0_dims)
        record = replace(record, slide_mpp=mpp0, mpp_source=mpp_source)
        finest = options.patch.at(options.patch.mpps[0])  # a multi-mpp build's record is its finest scale's
        level = choose_level(task.path, mpp0, reader.level_downsamples, finest)
    except SlideError as exc:
        return replace(record, reason=exc.reason)
    downsample = reader.level_downsamples[level]
    patch_mpp = round(mpp0 * output_scale(mpp0, downsample, finest), 6)
    return replace(record, level=level, downsample=downsample, patch_mpp=patch_mpp)


def _slide_seed(task: ScanTask) -> int:
    return int.from_bytes(task.slide_id.encode()[:8].ljust(8, b"\0"), "little") ^ task.options.seed


def _bytes_per_patch(task: ScanTask, reader: SlideReader, work: SlideWork) -> float | None:
    """Mean encoded bytes of a sample, estimated on a few seeded patches of the slide (read one by one).

    Where the reader knows its tiles' compressed sizes (:meth:`TiffTileReader.tile_bytes`), :data:`_CALIBRATED`
    patches are encoded and their image bytes scaled by the compressed bytes of the slide's tiles under every
    candidate against those under the patches measured: the estimate covers the whole grid, and costs a third of
    :data:`_MEASURED_PATCHES` patches. Otherwise the mean of that many patches."""
    cands = work.cands
    rng = np.random.default_rng((task.options.seed, task.index, 0x5CA9))
    tiles = getattr(reader, "tile_bytes", None)
    source = _source_bytes(cands, reader, work.level, tiles(work.level)) if tiles is not None else None
    picks = rng.choice(len(cands), size=min(_MEASURED_PATCHES, len(cands)), replace=False).tolist()
    encode = task.options.encode
    images: list[int] = []
    others: list[int] = []
    under: list[float] = []
    for i in picks[:_CALIBRATED] if source is not None else picks:
        ox, oy = int(cands.col[i]) * cands.stride, int(cands.row[i]) * cands.stride
        one = Block(patches=np.array([i]), o_x=ox, o_y=oy, o_w=cands.patch, o_h=cands.patch)
        for _, members in block_samples(reader, work, one, encode):
            images.append(len(members[encode.image_format]))
            others.append(sum(len(v) for v in members.values()) - images[-1])
            under.append(float(source[i]) if source is not None else 0.0)
    if not images:
        return None  # every patch measured was left out by a quality filter
    if source is None or sum(under) <= 0:
        return float(np.mean(images) + np.mean(others))
    return float(sum(images) / sum(under) * source.mean() + np.mean(others))


def _source_bytes(cands: Candidates, reader: SlideReader, level: int, tiles: tuple[int, int, np.ndarray]) -> np.ndarray:
    """Per candidate: the mean compressed size of the level's tiles it covers (float64)."""
    tile_w, tile_h, counts = tiles
    down = reader.level_downsamples[level]
    summed = np.zeros((counts.shape[0] + 1, counts.shape[1] + 1), dtype=np.int64)  # summed[r, c]: tiles above, left
    summed[1:, 1:] = counts.cumsum(axis=0).cumsum(axis=1)
    side = cands.l0_extent / down
    x0, y0 = cands.l0_x / down, cands.l0_y / down
    c0 = np.clip((x0 // tile_w).astype(np.int64), 0, counts.shape[1] - 1)
    r0 = np.clip((y0 // tile_h).astype(np.int64), 0, counts.shape[0] - 1)
    c1 = np.clip(((x0 + side - 1) // tile_w).astype(np.int64), c0, counts.shape[1] - 1) + 1
    r1 = np.clip(((y0 + side - 1) // tile_h).astype(np.int64), r0, counts.shape[0] - 1) + 1
    total = summed[r1, c1] - summed[r0, c1] - summed[r1, c0] + summed[r0, c0]
    return total / ((r1 - r0) * (c1 - c0))
