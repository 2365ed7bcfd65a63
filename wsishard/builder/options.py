"""The options of a build and the progress events it reports. Defaults live here (and in the option classes of
the modules they concern: :class:`~wsishard.builder.grid.PatchOptions`,
:class:`~wsishard.builder.tissue.TissueOptions`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from wsishard.builder.grid import PatchOptions
from wsishard.builder.patches import EncodeOptions
from wsishard.builder.tissue import TissueOptions
from wsishard.errors import OptionError
from wsishard.format import IMAGE_FORMATS


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every option of a build.

    Attributes:
        patch: grid, resolution and selection of patches.
        tissue: tissue detection.
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        shard_size_bytes: shards are planned to hold at most about this many bytes (None: no byte limit).
        shard_samples: at most this many samples per shard (None: no count limit); at least one read block
            (``patch.block_patches`` squared, 16 by default).
        group_slides: slides per group; every shard mixes the slides of its group.
        seed: seeds every random choice of the build.
        jobs: worker processes (None: all cores).
        qc: write ``qc/<slide>.png`` pictures.
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.
        default_mpp: level-0 mpp for slides that report none.
        mpp_overrides: slide (path, file name or stem) -> level-0 mpp; wins over the slide's own value.
        labels: slide (path, file name or stem) -> integer label written as ``.cls``.
        label_names: class names when labels were given as names (label i is ``label_names[i]``).

    A field's ``metadata`` describes its ``wsishard build`` flag as plain data (read by :mod:`wsishard.cli`);
    the nested option classes' flags go in the help group named by ``patch``'s and ``tissue``'s metadata.

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    patch: PatchOptions = field(default_factory=PatchOptions, metadata={"group": "patches"})
    tissue: TissueOptions = field(default_factory=TissueOptions, metadata={"group": "tissue"})
    image_format: str = field(default="jpg", metadata={
        "flag": "--format", "group": "output", "choices": IMAGE_FORMATS,
        "help": "jpg (lossy) or png/webp (lossless)"})  # fmt: skip
    quality: int = field(default=90, metadata={
        "group": "output", "parse": "int", "choices": range(1, 101), "metavar": "1..100",
        "help": "JPEG quality"})  # fmt: skip
    shard_size_bytes: int | None = field(default=256 * 1000**2, metadata={
        "flag": "--shard-size", "group": "output", "parse": "size", "metavar": "BYTES",
        "help": "about this many bytes per shard: 512MB, 1GiB, ..."})  # fmt: skip
    shard_samples: int | None = field(default=None, metadata={
        "group": "output", "parse": "positive_int", "metavar": "N", "help": "at most N samples per shard"})  # fmt: skip
    group_slides: int = field(default=32, metadata={
        "group": "output", "parse": "positive_int", "metavar": "N",
        "help": "slides mixed together in each group of shards"})  # fmt: skip
    seed: int = field(default=0, metadata={
        "group": "run", "parse": "int",
        "help": "seeds every random choice: same inputs and seed, same shards"})  # fmt: skip
    jobs: int | None = field(default=None, metadata={
        "group": "run", "parse": "positive_int", "metavar": "N",
        "help": "worker processes (default: all cores)"})  # fmt: skip
    qc: bool = field(default=True, metadata={"group": "output", "help": "skip the qc/<slide>.png pictures"})
    fast_path: bool = field(default=True, metadata={"group": "run", "help": "read every slide through OpenSlide"})
    default_mpp: float | None = field(default=None, metadata={
        "group": "resolution", "parse": "positive_float", "metavar": "UM",
        "help": "level-0 mpp for slides that report none "
                "(without it such a slide fails with a clear reason)"})  # fmt: skip
    mpp_overrides: Mapping[str, float] = field(default_factory=dict, metadata={
        "flag": "--mpp-csv", "group": "resolution", "parse": "mpp_table", "metavar": "CSV",
        "help": "slide,mpp lines that override the slides' own level-0 mpp "
                "(slide = path, file name or file name without extension)"})  # fmt: skip
    labels: Mapping[str, int] = field(default_factory=dict, metadata={
        "group": "output", "parse": "label_table", "fills": ("labels", "label_names"), "metavar": "CSV",
        "help": "slide,label lines written as .cls: integers, or class names numbered in sorted order"})  # fmt: skip
    label_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = {
            "image_format": self.image_format in IMAGE_FORMATS,
            "quality": 1 <= self.quality <= 100,
            "shard_size_bytes": self.shard_size_bytes is None or self.shard_size_bytes >= 1024,
            "shard_samples": self.shard_samples is None or self.shard_samples >= self.patch.block_patches**2,
            "group_slides": self.group_slides >= 1,
            "jobs": self.jobs is None or self.jobs >= 1,
            "default_mpp": self.default_mpp is None or 0 < self.default_mpp < 1000,
        }
        for name, ok in checks.items():
            if not ok:
                raise OptionError(f"invalid {name}: {getattr(self, name)!r}")

    @property
    def encode(self) -> EncodeOptions:
        """How patches are resampled and encoded."""
        return EncodeOptions(target_mpp=self.patch.target_mpp, image_format=self.image_format, quality=self.quality,
                             fast_path=self.fast_path)  # fmt: skip


@dataclass(frozen=True)
class BuildProgress:
    """What a progress callback receives after each slide scanned and each shard written."""

    stage: str  # "scan" | "extract"
    done: int  # slides scanned, or shards finished
    total: int
    patches_done: int = 0
    patches_total: int = 0
