"""Tissue detection scored against a generated slide's truth: what the build's scan would keep, and how clean it is.

:func:`score_slide` runs the scan's own steps (the low-resolution view,
:func:`~wsishard.builder.scan.tissue.find_tissue`, :func:`~wsishard.builder.scan.grid.candidates`) on a
:class:`~wsishard.testing.synthetic.SyntheticSlide` and measures
the kept patches with its true masks: how many are mostly artefact, and how much of the clean tissue they cover.
The tissue tests and ``benchmarks/bench_tissue.py`` share it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from wsishard.builder.scan.grid import Candidates, PatchOptions, candidates
from wsishard.builder.scan.tissue import TissueOptions, find_tissue
from wsishard.slide import open_slide, read_lowres
from wsishard.testing.artefacts import patch_fractions
from wsishard.testing.synthetic import SyntheticSlide

DIRTY_FRACTION = 0.25  # a kept patch more than this much ink or artefact is a dirty patch
PIGMENT_FRACTION = 0.25  # a clean-tissue cell at least this much pigment (true mask) is a pigmented cell


@dataclass(frozen=True)
class SlideScore:
    """What the scan keeps of one generated slide, measured with its true masks."""

    kept: int  # patches kept
    dirty: int  # kept patches more than DIRTY_FRACTION ink or artefact (true mask)
    clean_coverage: float  # fraction of the clean-tissue cells kept, 0..1 (see score_slide)
    clean_area_coverage: float  # fraction of the true clean tissue's area inside kept patches, 0..1
    pigment_cells: int = 0  # clean-tissue cells at least PIGMENT_FRACTION true pigment
    pigment_kept: int = 0  # of those, the ones kept

    @property
    def pigment_coverage(self) -> float:
        """Fraction of the pigmented clean-tissue cells kept (1.0 when there are none)."""
        return self.pigment_kept / self.pigment_cells if self.pigment_cells else 1.0

    @property
    def dirty_fraction(self) -> float:
        return self.dirty / self.kept if self.kept else 0.0


def scan_cells(path: str, mpp: float, tissue: TissueOptions, patch: PatchOptions) -> Candidates:
    """The cells the build's scan keeps of the slide at ``path`` (level-0 ``mpp``): its low-resolution view,
    :func:`~wsishard.builder.scan.tissue.find_tissue` and :func:`~wsishard.builder.scan.grid.candidates`."""
    with open_slide(path) as reader:
        l0_w, l0_h = reader.level_dimensions[0]
        l0_per_t = max(tissue.thumb_mpp / mpp, max(l0_w, l0_h) / tissue.max_thumb_px, 1.0)
        thumb, l0_per_t = read_lowres(reader, l0_per_t)
    found = find_tissue(thumb, l0_per_t * mpp, tissue)
    return candidates(
        (l0_w, l0_h), mpp, found.mask, l0_per_t, patch, artefact=found.ink | found.dark, pigment=found.pigment
    )


def score_slide(slide: SyntheticSlide, tissue: TissueOptions, patch: PatchOptions) -> SlideScore:
    """Scan ``slide`` as the build does (level-0 mpp from the slide) and score the kept patches.

    Clean-tissue cells are the grid cells a perfect detector keeps: at least ``min_tissue`` true clean tissue and at
    most :data:`DIRTY_FRACTION` true artefact. ``clean_coverage`` is the fraction of them kept; the area figure
    also counts the clean tissue inside patches that are mostly ink, which no filter can keep without the ink.
    Pigmented cells are the clean-tissue cells at least :data:`PIGMENT_FRACTION` true pigment (pigment is tissue).
    """
    cands = scan_cells(slide.path, slide.mpp, tissue, patch)
    l0_w, l0_h = slide.width, slide.height
    d = slide.mask_downsample
    artefact = slide.artefacts.mask if slide.artefacts is not None else np.zeros_like(slide.mask)
    dirty = patch_fractions(artefact, d, cands.l0_x, cands.l0_y, cands.l0_extent) > DIRTY_FRACTION
    covered = np.zeros_like(slide.mask)
    side = max(1, round(cands.l0_extent / d))
    for x, y in zip(cands.l0_x.tolist(), cands.l0_y.tolist(), strict=True):
        covered[round(y / d) : round(y / d) + side, round(x / d) : round(x / d) + side] = True
    clean = slide.mask  # the true tissue mask already excludes the artefacts
    area = float((covered & clean).sum()) / max(int(clean.sum()), 1)
    ideal = candidates((l0_w, l0_h), slide.mpp, clean, d, patch)
    ok = patch_fractions(artefact, d, ideal.l0_x, ideal.l0_y, ideal.l0_extent) <= DIRTY_FRACTION
    wanted = set(zip(ideal.col[ok].tolist(), ideal.row[ok].tolist(), strict=True))
    kept = set(zip(cands.col.tolist(), cands.row.tolist(), strict=True))
    pigmented: set[tuple[int, int]] = set()
    if slide.pigment is not None:
        pig = patch_fractions(slide.pigment, d, ideal.l0_x, ideal.l0_y, ideal.l0_extent) >= PIGMENT_FRACTION
        pigmented = set(zip(ideal.col[ok & pig].tolist(), ideal.row[ok & pig].tolist(), strict=True))
    return SlideScore(
        len(cands),
        int(dirty.sum()),
        len(wanted & kept) / max(len(wanted), 1),
        area,
        len(pigmented),
        len(pigmented & kept),
    )
