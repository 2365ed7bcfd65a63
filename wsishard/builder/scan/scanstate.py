"""Scan results saved one slide at a time, as each arrives, under ``OUT/.wsishard/scan/`` (local or object storage).

    scan/0000042.npz    slide 42's scan: its record (JSON bytes under ``meta``), its candidate arrays
                        (``col``, ``row``, ``tissue``) and what its QC picture needs (``qc_*``,
                        :mod:`wsishard.builder.qc.qcrecord`), never pickled; written atomically

A build interrupted while scanning keeps every slide scanned before: the next run scans only the others. The main
process writes each result as it arrives and keeps none of them: extraction loads one group's scans at a time
(:meth:`ScanStore.load`), so it never holds the candidates of every slide at once. The file of a slide is named
by its index in the sorted input list, which the build's fingerprint fixes.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable
from typing import Any

import numpy as np

from wsishard import manifest as manifest_records
from wsishard.builder.qc.qcrecord import is_record_array, read_record, record_arrays
from wsishard.builder.scan.grid import Candidates, ScaleWork, blocks
from wsishard.builder.scan.scan import ScanResult
from wsishard.storage.output import Destination

SCAN_DIR = "scan"
_SUFFIX = ".npz"


def scan_file(index: int) -> str:
    """The file name of slide ``index``'s scan: ``0000042.npz``."""
    return f"{index:07d}{_SUFFIX}"


def _parse(name: str) -> int | None:
    stem = name.removesuffix(_SUFFIX)
    return int(stem) if name.endswith(_SUFFIX) and stem.isdigit() else None


_GRID = ("col", "row")  # int64 in memory, saved as int32 (a grid of 2**31 cells a side is no slide)


def encode_scan(scan: ScanResult) -> bytes:
    """A scan result as the bytes of a compressed ``.npz`` file (:func:`decode_scan`'s inverse)."""
    cands, geometry, arrays = scan.cands, None, dict[str, np.ndarray]()
    if cands is not None:
        geometry, arrays = _grid_data(cands)
    meta: dict[str, Any] = dict(record=dataclasses.asdict(scan.record), cands=geometry, bytes=scan.bytes_per_patch)
    scales: list[dict[str, Any]] = [dict(mpp=one.mpp, level=one.level, patch_mpp=one.patch_mpp) for one in scan.scales]
    for i, one in enumerate(scan.scales[1:], start=1):  # a multi-mpp build: each further scale's grid (names _s<i>)
        scales[i]["cands"], more = _grid_data(one.cands)
        arrays.update({f"{k}_s{i}": v for k, v in more.items()})
    if scales:
        meta["scales"] = scales
    if scan.qc is not None:
        meta["qc"], qc_arrays = record_arrays(scan.qc)
        arrays.update(qc_arrays)
    buf = io.BytesIO()
    np.savez_compressed(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def _grid_data(cands: Candidates) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """A grid's scalar fields and its arrays, as saved (:meth:`Candidates.from_arrays` reads them back)."""
    geometry = dict(l0_per_o=cands.l0_per_o, stride=cands.stride, patch=cands.patch, total=cands.total)
    return geometry, {k: v.astype(np.int32) if k in _GRID else v for k, v in cands.arrays().items()}  # grid indices


def decode_scan(data: bytes, block_patches: int, *, qc: bool = False) -> ScanResult:
    """A scan result from :func:`encode_scan`'s bytes, its blocks laid out with ``block_patches``; with its QC record
    when ``qc`` (and it has one)."""
    with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
        meta = json.loads(arrays["meta"].tobytes())
        record = manifest_records.SlideRecord(**meta["record"])
        drawn = read_record(meta["qc"], arrays) if qc and meta.get("qc") is not None else None
        if meta["cands"] is None:
            return ScanResult(record, qc=drawn)
        got = {
            k: arrays[k].astype(np.int64) if k.split("_s")[0] in _GRID else arrays[k]
            for k in arrays.files
            if not is_record_array(k)
        }
        cands = Candidates.from_arrays(got, **meta["cands"])
        scales = tuple(
            ScaleWork(
                one["mpp"],
                one["level"],
                one["patch_mpp"],
                cands if i == 0 else Candidates.from_arrays(got, f"_s{i}", **one["cands"]),
            )
            for i, one in enumerate(meta.get("scales", []))
        )
    grids = [one.cands for one in scales] or [cands]
    block_list = [b for i, grid in enumerate(grids) for b in blocks(grid, block_patches, i)]
    return ScanResult(record, cands, block_list, meta["bytes"], qc=drawn, scales=scales)


class ScanStore:
    """The per-slide scan results of one build output, in its state folder ``state_dir``."""

    def __init__(self, dest: Destination, state_dir: str) -> None:
        self.dest, self.folder = dest, f"{state_dir}/{SCAN_DIR}"

    def scanned(self) -> set[int]:
        """The slides whose scan is saved (one listing; files still being written are not counted)."""
        return {i for name in self.dest.listdir(self.folder) if (i := _parse(name)) is not None}

    def save(self, index: int, scan: ScanResult) -> None:
        self.dest.write_bytes(f"{self.folder}/{scan_file(index)}", encode_scan(scan))

    def load(self, index: int, block_patches: int, *, qc: bool = False) -> ScanResult | None:
        """Slide ``index``'s saved scan (with its QC record when ``qc``), or None when it has none."""
        data = self.dest.read_bytes(f"{self.folder}/{scan_file(index)}")
        return None if data is None else decode_scan(data, block_patches, qc=qc)

    def load_many(self, indices: Iterable[int], block_patches: int) -> dict[int, ScanResult]:
        """The saved scans of ``indices`` (slides without one are left out)."""
        return {i: scan for i in indices if (scan := self.load(i, block_patches)) is not None}
