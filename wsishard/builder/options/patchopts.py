"""The build's patch options as plain dataclasses: what a patch is, its context, its quality filters, how it is
encoded. They import neither numpy nor Pillow, so that ``wsishard --help`` starts without them; the modules that do
the work (:mod:`~wsishard.builder.scan.grid`, :mod:`~wsishard.builder.extract.context`,
:mod:`~wsishard.builder.extract.quality`, :mod:`~wsishard.builder.extract.patches`) export them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from wsishard.builder.options.values import target_mpps
from wsishard.errors import OptionError, check_option
from wsishard.format import IMAGE_FORMATS

BLOCK_SIDE_PX = 2048  # output px a side of a read block when PatchOptions.block_patches is None


@dataclass(frozen=True, kw_only=True)
class PatchOptions:
    """What a patch is and which ones are kept.

    Attributes:
        target_mpp: microns per pixel of the written patches; several (a tuple, ascending) make a multi-mpp build:
            each scale's patches as a build of that mpp alone would make them, from one scan (:attr:`mpps`).
        patch_size_px: width = height of a written patch, px.
        stride_px: grid step in output px (None: ``patch_size_px``, no overlap).
        min_tissue: keep patches with at least this fraction of tissue (0..1).
        max_patches_per_slide: keep a seeded random subset of at most this many (None: all).
        allow_upsample: allow a target finer than level 0 (patches are then upsampled).
        max_upsample: with ``allow_upsample``, the largest factor level 0 is upsampled by; a slide needing more
            is failed (its mpp metadata is likely wrong, and its patches would be blur).
        mpp_tolerance: 0 (default): patches at exactly ``target_mpp``, resampled from whatever the scanner gives.
            Above 0: where an integer reduction of a pyramid level lands within this fraction of the target, it is
            used as it is (the nominal-magnification convention; hs2p's default is 0.05), and the patches' actual
            mpp is recorded.
        block_patches: patches per side of a read block (a block is one region read; its blocks are the unit a
            slide's patches are dealt to shards in). None (default): :meth:`auto_block`, blocks of about
            :data:`BLOCK_SIDE_PX` output px a side, at most 8 patches.
        max_artefact: drop patches more than this fraction ink or dark artefact (as tissue detection found them;
            1 keeps them all).

    A field's ``metadata`` describes its ``wsishard build`` flag as plain data (read by :mod:`wsishard.cli`).
    """

    target_mpp: float | tuple[float, ...] = field(
        default=0.5,
        metadata={
            "flag": "--mpp",
            "metavar": "UM",
            "parse": "positive_float",
            "nargs": "+",
            "help": "target microns per pixel; several (--mpp 0.5 1.0 2.0) build every one from one scan",
        },
    )
    patch_size_px: int = field(
        default=256,
        metadata={"flag": "--patch-size", "metavar": "PX", "parse": "positive_int", "help": "patch width = height"},
    )
    stride_px: int | None = field(
        default=None,
        metadata={
            "flag": "--stride",
            "metavar": "PX",
            "parse": "positive_int",
            "help": "grid step at the target mpp (default: the patch size, no overlap)",
        },
    )
    min_tissue: float = field(
        default=0.5,
        metadata={"metavar": "FRAC", "parse": "fraction", "help": "keep patches with at least this fraction of tissue"},
    )
    max_patches_per_slide: int | None = field(
        default=None, metadata={"metavar": "N", "parse": "positive_int", "help": "keep a seeded random subset"}
    )
    allow_upsample: bool = field(default=False, metadata={"help": "allow a target finer than the slide's level 0"})
    max_upsample: float = field(
        default=4.0,
        metadata={
            "metavar": "X",
            "parse": "positive_float",
            "help": "with --allow-upsample: fail a slide whose level 0 would be upsampled more than X times",
        },
    )
    mpp_tolerance: float = field(
        default=0.0,
        metadata={
            "metavar": "FRAC",
            "parse": "non_negative",
            "help": "0: patches at exactly --mpp; above 0: an integer reduction of a pyramid level within this "
            "fraction of --mpp is used as it is (actual mpp recorded; 0.05 is hs2p's default)",
        },
    )
    block_patches: int | None = None
    max_artefact: float = field(
        default=0.2,
        metadata={
            "flag": "--max-artefact-fraction",
            "old_flags": ("--max-artefact",),
            "metavar": "FRAC",
            "parse": "fraction",
            "group": "artefacts",
            "help": "leave out patches more than this fraction marker ink or dark artefact, as tissue detection found "
            "them (1 keeps them all; pigment is not artefact)",
        },
    )

    def __post_init__(self) -> None:
        """Validate every field; the message names the field, the bad value and what is needed."""
        object.__setattr__(self, "target_mpp", target_mpps(self.target_mpp))  # canonical: one, or ascending
        check_option(8 <= self.patch_size_px <= 8192, "patch_size_px", self.patch_size_px, "8..8192")
        check_option(self.stride_px is None or 1 <= self.stride_px <= 8192, "stride_px", self.stride_px, "1..8192")
        check_option(0.0 <= self.min_tissue <= 1.0, "min_tissue", self.min_tissue, "0 <= FRAC <= 1")
        check_option(
            self.max_patches_per_slide is None or self.max_patches_per_slide >= 1,
            "max_patches_per_slide",
            self.max_patches_per_slide,
            ">= 1",
        )
        check_option(
            math.isfinite(self.max_upsample) and self.max_upsample >= 1.0,
            "max_upsample",
            self.max_upsample,
            "a finite X >= 1",
        )
        check_option(0.0 <= self.mpp_tolerance < 0.5, "mpp_tolerance", self.mpp_tolerance, "0 <= FRAC < 0.5")
        check_option(
            self.block_patches is None or 1 <= self.block_patches <= 64, "block_patches", self.block_patches, "1..64"
        )
        check_option(0.0 <= self.max_artefact <= 1.0, "max_artefact", self.max_artefact, "0 <= FRAC <= 1")

    @property
    def mpps(self) -> tuple[float, ...]:
        """The target mpps, ascending (one for a build of one magnification)."""
        return self.target_mpp if isinstance(self.target_mpp, tuple) else (self.target_mpp,)

    @property
    def multi(self) -> bool:
        """Whether this is a multi-mpp build (its keys then name their mpp: :func:`~wsishard.format.sample_key`)."""
        return isinstance(self.target_mpp, tuple)

    @property
    def mpp(self) -> float:
        """The target mpp of one scale's options (:meth:`at`); the finest of a multi-mpp build's."""
        return self.mpps[0]

    def at(self, mpp: float) -> PatchOptions:
        """These options for one scale: ``target_mpp`` one number."""
        return self if mpp == self.target_mpp else replace(self, target_mpp=mpp)

    @property
    def stride(self) -> int:
        return self.stride_px or self.patch_size_px

    def auto_block(self, shard_patches: int | None = None, group_slides: int = 1) -> int:
        """Patches per block side when ``block_patches`` is None: as many as fit :data:`BLOCK_SIDE_PX` output px
        (8 of 256 px, 4 of 512 px), 1 to 8; and, where a shard holds about ``shard_patches`` patches of a group of
        ``group_slides`` slides, no more than lets every slide of the group have a block in every shard (a block is
        never split between shards, and shards mix their group's slides by blocks).

        Neighbouring blocks share the slide tiles along their common edge, and a build of many shards deals a slide's
        blocks to different shards: those tiles are then decoded once per block. Blocks of 8x8 patches of 256 px
        decode 9% fewer tiles than 4x4 in such a build; the side in px bounds a block's region in memory (about
        13 MB) whatever the patch size."""
        side = max(1, min(8, BLOCK_SIDE_PX // self.patch_size_px))
        if shard_patches is not None:
            side = min(side, max(1, math.isqrt(shard_patches // max(group_slides, 1))))
        return side


@dataclass(frozen=True, kw_only=True)
class ContextOptions:
    """The context patches written with every sample.

    Attributes:
        mpps: microns per pixel of each context patch, ascending (member ``ctx<i>`` is ``mpps[i]``).
        size_px: width = height of a context patch, px.
        allow_upsample: a context mpp finer than level 0 may upsample it (as ``--allow-upsample`` for patches).
        max_upsample: with ``allow_upsample``, the largest factor level 0 is upsampled by.
    """

    mpps: tuple[float, ...]
    size_px: int
    allow_upsample: bool = False
    max_upsample: float = 4.0


Scores = dict[str, float]  # background, dark, sharpness


@dataclass(frozen=True, kw_only=True)
class QualityOptions:
    """Build-time patch filters on the quality scores; the defaults keep every patch (scores are still recorded).

    Attributes:
        max_background: leave out patches more than this fraction glass (1: keep all).
        max_dark: leave out patches more than this fraction very dark (1: keep all).
        min_sharpness: leave out patches whose Laplacian variance is below this (0: keep all).

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    max_background: float = field(
        default=1.0,
        metadata={
            "metavar": "FRAC",
            "parse": "fraction",
            "help": "leave out patches more than this fraction background (glass)",
        },
    )
    max_dark: float = field(
        default=1.0,
        metadata={
            "flag": "--max-dark-pixels",
            "old_flags": ("--max-dark",),
            "metavar": "FRAC",
            "parse": "fraction",
            "help": "leave out patches more than this fraction very dark pixels (HSV value below 0.25), pigment "
            "included, counted on the patch itself (by default none is left out: the .json's dark and "
            "pigment scores let training leave them out instead)",
        },
    )
    min_sharpness: float = field(
        default=0.0,
        metadata={
            "metavar": "VAR",
            "parse": "non_negative",
            "help": "leave out patches whose Laplacian variance (blur measure) is below this",
        },
    )

    def __post_init__(self) -> None:
        for name in ("max_background", "max_dark"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise OptionError(f"invalid {name}: {getattr(self, name)!r} (need 0 <= FRAC <= 1)")
        if not (math.isfinite(self.min_sharpness) and self.min_sharpness >= 0):
            raise OptionError(f"invalid min_sharpness: {self.min_sharpness!r} (need a finite number >= 0)")

    def rejects(self, scores: Scores) -> str | None:
        """The reason a patch with ``scores`` is left out (``background``, ``dark``, ``sharpness``), or None."""
        if scores["background"] > self.max_background:
            return "background"
        if scores["dark"] > self.max_dark:
            return "dark"
        if scores["sharpness"] < self.min_sharpness:
            return "sharpness"
        return None


@dataclass(frozen=True, kw_only=True)
class EncodeOptions:
    """How patches are made from a slide's pixels.

    Attributes:
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.
        filters: per-patch quality filters (the scores are written into every ``.json`` either way).
        context: the context patches written with each sample (None: none).

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    image_format: str = "jpg"
    quality: int = 90
    fast_path: bool = True
    filters: QualityOptions = field(default_factory=QualityOptions)
    context: ContextOptions | None = None

    def __post_init__(self) -> None:
        if self.image_format not in IMAGE_FORMATS:
            raise OptionError(f"invalid image_format: {self.image_format!r}")
        if not 1 <= self.quality <= 100:
            raise OptionError(f"invalid quality: {self.quality!r}")
