"""The options of a build and the progress events it reports. Defaults live here (and in the option classes of
the modules they concern: :class:`~wsishard.builder.scan.grid.PatchOptions`,
:class:`~wsishard.builder.scan.tissue.TissueOptions`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from wsishard.builder.options.keywords import with_keywords
from wsishard.builder.options.patchopts import ContextOptions, EncodeOptions, PatchOptions, QualityOptions
from wsishard.builder.options.tissueopts import RoiOptions, TissueOptions
from wsishard.builder.options.values import MAX_MPP, MPP_RULE, context_mpps, valid_label, valid_mpp
from wsishard.errors import OptionError, check_option
from wsishard.format import IMAGE_FORMATS


def group_count(n_slides: int, group_slides: int) -> int:
    """How many groups ``n_slides`` slides make, at most ``group_slides`` each
    (:func:`~wsishard.builder.plan.plan.make_groups` cuts them with sizes within one: the largest holds
    ``ceil(n_slides / group_count)``)."""
    return math.ceil(n_slides / group_slides)


# Encoded bytes per output pixel, roughly (JPEG q90 of H&E about 14 KB a 256 px patch; lossless 5-8x that): only to
# size the read blocks of a build planned by bytes (BuildOptions.block_side), not its shards.
BYTES_PER_PX = {"jpg": 0.25, "png": 1.5, "webp": 1.5}


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every option of a build.

    Attributes:
        patch: grid, resolution and selection of patches.
        tissue: tissue detection.
        roi: annotation regions (GeoJSON) patches are restricted to, and their classes as labels.
        patch_quality: per-patch quality filters (background, dark, sharpness) applied while extracting.
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        shard_size_bytes: shards are planned to hold at most about this many bytes (None: no byte limit).
        shard_samples: at most this many samples per shard (None: no count limit); at least one read block
            (``patch.block_patches`` squared; by default blocks shrink to fit: :meth:`PatchOptions.auto_block`).
        group_slides: slides per group; every shard mixes the slides of its group.
        seed: seeds every random choice of the build (>= 0).
        jobs: worker processes (None: all cores).
        qc: draw the ``qc/<slide>.png`` pictures (and ``qc/index.html``) while building; without it the build
            records what they need and ``wsishard inspect OUT --qc`` draws them later.
        qc_size_px: the QC pictures' longest side, px (64..16384).
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.
        default_mpp: level-0 mpp for slides that report none.
        mpp_overrides: slide (path, file name or stem) -> level-0 mpp; wins over the slide's own value.
        labels: slide (path, file name or stem) -> integer label (int64) written as ``.cls``.
        label_names: class names when labels were given as names (label i is ``label_names[i]``).
        require_labels: refuse to build when a slide has no label (default: such a slide is unlabelled: no
            ``.cls``, label -1 when streamed).
        context_mpp: with each sample, a patch centred on it at each of these mpp, ascending (``ctx0``, ``ctx1``,
            ...; :mod:`wsishard.builder.extract.context`). Given in any order, kept in ascending order.
        context_size: width = height of the context patches, px (None: ``patch.patch_size_px``).

    A field's ``metadata`` describes its ``wsishard build`` flag as plain data (read by :mod:`wsishard.cli`);
    the nested option classes' flags go in the help group named by ``patch``'s and ``tissue``'s metadata.

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    patch: PatchOptions = field(default_factory=PatchOptions, metadata={"group": "patches"})
    tissue: TissueOptions = field(default_factory=TissueOptions, metadata={"group": "tissue"})
    roi: RoiOptions = field(default_factory=RoiOptions, metadata={"group": "roi"})
    patch_quality: QualityOptions = field(default_factory=QualityOptions, metadata={"group": "patches"})
    image_format: str = field(
        default="jpg",
        metadata={
            "flag": "--format",
            "group": "output",
            "choices": IMAGE_FORMATS,
            "help": "jpg (lossy) or png/webp (lossless)",
        },
    )
    quality: int = field(
        default=90, metadata={"group": "output", "parse": "int", "metavar": "1..100", "help": "JPEG quality"}
    )
    shard_size_bytes: int | None = field(
        default=256 * 1000**2,
        metadata={
            "flag": "--shard-size",
            "group": "output",
            "parse": "size",
            "metavar": "BYTES",
            "help": "about this many bytes per shard: 512MB, 1GiB, ...",
        },
    )
    shard_samples: int | None = field(
        default=None,
        metadata={"group": "output", "parse": "positive_int", "metavar": "N", "help": "at most N samples per shard"},
    )
    group_slides: int = field(
        default=32,
        metadata={
            "group": "output",
            "parse": "positive_int",
            "metavar": "N",
            "help": "slides mixed together in each group of shards",
        },
    )
    seed: int = field(
        default=0,
        metadata={
            "group": "run",
            "parse": "non_negative_int",
            "help": "seeds every random choice: same inputs and seed, same shards",
        },
    )
    jobs: int | None = field(
        default=None,
        metadata={
            "group": "run",
            "parse": "positive_int",
            "metavar": "N",
            "help": "worker processes (default: all cores)",
        },
    )
    qc: bool = field(
        default=False,
        metadata={
            "group": "output",
            "help": "draw the qc/<slide>.png pictures and qc/index.html while building (default: "
            "recorded only; wsishard inspect OUT --qc draws them later)",
        },
    )
    qc_size_px: int = field(
        default=2000,
        metadata={
            "flag": "--qc-size",
            "group": "output",
            "parse": "positive_int",
            "metavar": "PX",
            "help": "longest side of the QC pictures",
        },
    )
    fast_path: bool = field(default=True, metadata={"group": "run", "help": "read every slide through OpenSlide"})
    default_mpp: float | None = field(
        default=None,
        metadata={
            "group": "resolution",
            "parse": "positive_float",
            "metavar": "UM",
            "help": "level-0 mpp for slides that report none (without it such a slide fails with a clear reason)",
        },
    )
    mpp_overrides: Mapping[str, float] = field(
        default_factory=dict,
        metadata={
            "flag": "--mpp-csv",
            "group": "resolution",
            "parse": "mpp_table",
            "metavar": "CSV",
            "help": "slide,mpp lines that override the slides' own level-0 mpp "
            "(slide = path, file name or file name without extension)",
        },
    )
    labels: Mapping[str, int] = field(
        default_factory=dict,
        metadata={
            "group": "output",
            "parse": "label_table",
            "fills": ("labels", "label_names"),
            "metavar": "CSV",
            "help": "slide,label lines written as .cls: integers, or class names numbered in sorted order",
        },
    )
    label_names: tuple[str, ...] = ()
    require_labels: bool = field(
        default=False,
        metadata={
            "group": "output",
            "help": "refuse to build when a slide has no label in --labels "
            "(without it such a slide is unlabelled: no .cls, label -1 when streamed)",
        },
    )
    context_mpp: tuple[float, ...] = field(
        default=(),
        metadata={
            "group": "patches",
            "parse": "mpps",
            "metavar": "UM[,UM...]",
            "with_others": True,
            "help": "also write, with each sample, a patch centred on it at each of these mpp "
            "(members ctx0, ctx1, ... in ascending mpp)",
        },
    )
    context_size: int | None = field(
        default=None,
        metadata={
            "group": "patches",
            "parse": "positive_int",
            "metavar": "PX",
            "help": "width = height of the context patches (default: --patch-size)",
        },
    )

    def __post_init__(self) -> None:
        """Validate every field; the message names the field, the bad value and what is needed."""
        object.__setattr__(self, "context_mpp", context_mpps(self.context_mpp))  # canonical: ascending
        block = (self.patch.block_patches or 1) ** 2  # a chosen side fits (with_block_side)
        checks = {
            "image_format": (self.image_format in IMAGE_FORMATS, "/".join(IMAGE_FORMATS)),
            "quality": (1 <= self.quality <= 100, "1..100"),
            "shard_size_bytes": (self.shard_size_bytes is None or self.shard_size_bytes >= 1024, ">= 1024"),
            "shard_samples": (self.shard_samples is None or self.shard_samples >= block, f">= {block}: one block"),
            "group_slides": (self.group_slides >= 1, ">= 1"),
            "seed": (self.seed >= 0, ">= 0"),
            "jobs": (self.jobs is None or self.jobs >= 1, ">= 1"),
            "qc_size_px": (64 <= self.qc_size_px <= 16384, "64..16384"),
            "default_mpp": (self.default_mpp is None or valid_mpp(self.default_mpp), f"0 < UM < {MAX_MPP:g}"),
            "context_size": (self.context_size is None or 8 <= self.context_size <= 8192, "8..8192"),
        }
        for name, (ok, rule) in checks.items():
            check_option(ok, name, getattr(self, name), rule)
        for slide, mpp in self.mpp_overrides.items():
            if not valid_mpp(mpp):
                raise OptionError(f"invalid mpp_overrides: mpp of {slide!r} is {mpp!r}: need {MPP_RULE}")
        if self.labels and self.roi.labels:
            raise OptionError(
                "invalid labels: give slide labels (--labels) or annotation-class labels (--roi-labels), not both"
            )
        same = [m for m in self.patch.mpps if m in self.context_mpp]
        if same and self.context_size_px == self.patch.patch_size_px:
            raise OptionError(
                f"invalid context_mpp: {same[0]!r} is the patch's own mpp at the same size "
                "(it would repeat the patch; give another mpp or a --context-size)"
            )
        for slide, label in self.labels.items():
            if not valid_label(label):
                raise OptionError(
                    f"invalid labels: label of {slide!r} is {label!r}: need an integer in 0..2**63-1 "
                    "(-1 marks unlabelled samples)"
                )

    @classmethod
    def from_keywords(cls, **keywords: Any) -> BuildOptions:
        """The options the ``wsishard build`` flags give as flat keywords: ``BuildOptions.from_keywords(mpp=1.0,
        patch_size=224)`` (see :func:`wsishard.build`; :mod:`wsishard.builder.options.keywords` maps them).

        Raises:
            TypeError: a keyword that is no build option, naming it and the close matches.
            OptionError: (a ``ValueError``) a value the option refuses.
        """
        return with_keywords(cls(), keywords, caller="BuildOptions.from_keywords")

    @property
    def class_names(self) -> tuple[str, ...]:
        """Names of the integer labels: the slide label table's, or the annotation classes (``--roi-labels``, which
        label nothing without ``--roi``)."""
        return self.label_names or (self.roi.labels if self.roi.path is not None else ())

    @property
    def block_side(self) -> int:
        """Patches per side of a read block: ``patch.block_patches`` (:func:`with_block_side` chooses it for a
        build), else :meth:`~wsishard.builder.options.patchopts.PatchOptions.auto_block` by the patch size alone."""
        return self.patch.block_patches or self.patch.auto_block()

    def with_block_side(self, slides: int) -> BuildOptions:
        """These options with ``patch.block_patches`` chosen for a build of ``slides`` slides where it is None
        (:meth:`~wsishard.builder.options.patchopts.PatchOptions.auto_block`): 8 of 256 px, fewer where a shard would
        hold less than a block of each slide of its group (``shard_samples``, or ``shard_size_bytes`` at about
        :data:`BYTES_PER_PX` a pixel; groups of ``group_slides``, sizes within one). The build records the choice."""
        if self.patch.block_patches is not None:
            return self
        limits = [] if self.shard_samples is None else [self.shard_samples]
        if self.shard_size_bytes is not None:
            per_patch = BYTES_PER_PX[self.image_format] * self.patch.patch_size_px**2
            limits.append(int(self.shard_size_bytes // per_patch))
        groups = max(1, group_count(slides, self.group_slides))
        side = self.patch.auto_block(min(limits) if limits else None, math.ceil(slides / groups))
        return replace(self, patch=replace(self.patch, block_patches=side))

    @property
    def context_size_px(self) -> int:
        """Width = height of the context patches, px: ``context_size``, or the patch size."""
        return self.context_size or self.patch.patch_size_px

    @property
    def encode(self) -> EncodeOptions:
        """How patches are resampled and encoded."""
        context = None
        if self.context_mpp:
            context = ContextOptions(
                mpps=self.context_mpp,
                size_px=self.context_size_px,
                allow_upsample=self.patch.allow_upsample,
                max_upsample=self.patch.max_upsample,
            )
        return EncodeOptions(
            image_format=self.image_format,
            quality=self.quality,
            fast_path=self.fast_path,
            filters=self.patch_quality,
            context=context,
        )


@dataclass(frozen=True)
class BuildProgress:
    """What a progress callback receives after each slide scanned and each shard written."""

    stage: str  # "scan" | "extract"
    done: int  # slides scanned, or shards finished
    total: int
    patches_done: int = 0
    patches_total: int = 0
