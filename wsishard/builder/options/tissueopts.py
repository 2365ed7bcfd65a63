"""The build's tissue and region options as plain dataclasses. They import neither numpy nor Pillow, so that
``wsishard --help`` starts without them; :mod:`~wsishard.builder.scan.tissue` and :mod:`~wsishard.builder.inputs.roi`
export them too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from wsishard.errors import OptionError, check_option

MAX_THUMB_MPP = 1000.0  # a view of 1 mm per px: a glass slide is 75 px long; coarser sees no tissue


@dataclass(frozen=True, kw_only=True)
class TissueOptions:
    """Tissue-detection options; lengths in microns, areas in square microns.

    Attributes:
        thumb_mpp: microns per px of the low-res view detection runs on (the build picks a level near this).
        max_thumb_px: the low-res view's longest side is capped at this (bounded memory).
        use_darkness: combine HSV saturation with darkness against the glass (max of the two); False: saturation
            alone.
        median_um: median blur radius (24 um: a 7 px wide disk at 8 um/px, CLAM's ``mthresh=7``).
        close_um: morphological closing radius.
        min_object_um2: objects at most this large are dropped (dust; a 224 px patch at 0.5 mpp is 12544).
        min_hole_um2: holes at most this large inside tissue are filled.
        min_threshold: floor (0..1) on Otsu's threshold, so a blank slide yields no tissue.
        fixed_threshold: if set (0..1), used instead of Otsu's threshold and its floor.
        ink_filter: remove marker ink (saturated colours outside the H&E hue band).
        ink_min_saturation: HSV saturation (0..1) from which a colour outside the H&E band counts as ink.
        he_hue_from_deg, he_hue_to_deg: the H&E hue band, degrees, going up from ``from`` (it may wrap past 360).
        dark_filter: remove dark artefacts (dark regions, HSV value below ``dark_max_value`` or dark and grey, that
            do not look like pigment).
        keep_pigment: tell dark pigment (brown, deeply stained or speckled dark regions) from dark artefacts and keep
            it as tissue; False: every dark region is an artefact.
        dark_max_value: HSV value (0..1) below which a pixel is dark: an artefact unless its region is pigment.
        artefact_margin_um: ink and dark artefacts are grown by this much before they are removed.

    A field's ``metadata`` describes its ``wsishard build`` flag as plain data (read by :mod:`wsishard.cli`).

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    thumb_mpp: float = field(
        default=8.0, metadata={"metavar": "UM", "parse": "positive_float", "help": "resolution detection runs at"}
    )
    max_thumb_px: int = 4096
    use_darkness: bool = field(
        default=True,
        metadata={
            "flag": "--tissue-saturation-only",
            "old_flags": ("--no-darkness",),
            "help": "find tissue by HSV saturation alone (by default darkness against the glass counts too; "
            "dark artefacts are removed either way)",
        },
    )
    median_um: float = field(
        default=24.0,
        metadata={"flag": "--tissue-median-um", "metavar": "UM", "parse": "non_negative", "help": "median blur radius"},
    )
    close_um: float = field(
        default=16.0,
        metadata={"flag": "--tissue-close-um", "metavar": "UM", "parse": "non_negative", "help": "closing radius"},
    )
    min_object_um2: float = field(
        default=20_000.0,
        metadata={"metavar": "UM2", "parse": "non_negative", "help": "drop objects this small or smaller (dust)"},
    )
    min_hole_um2: float = field(
        default=10_000.0,
        metadata={"metavar": "UM2", "parse": "non_negative", "help": "fill holes this small or smaller"},
    )
    min_threshold: float = 0.05
    fixed_threshold: float | None = field(
        default=None,
        metadata={
            "flag": "--tissue-threshold",
            "metavar": "T",
            "parse": "fraction",
            "help": "fixed threshold (0..1) on the stain feature instead of Otsu's",
        },
    )
    ink_filter: bool = field(
        default=True,
        metadata={
            "group": "artefacts",
            "help": "keep marker ink (by default blue, green and other non-H&E colours are removed)",
        },
    )
    ink_min_saturation: float = field(
        default=0.15,
        metadata={
            "metavar": "S",
            "parse": "fraction",
            "group": "artefacts",
            "help": "saturation (0..1) from which a non-H&E colour is ink",
        },
    )
    he_hue_from_deg: float = field(
        default=235.0,
        metadata={
            "flag": "--he-hue-from",
            "metavar": "DEG",
            "parse": "degrees",
            "group": "artefacts",
            "help": "H&E hue band start, degrees (the band goes up from here, through 360)",
        },
    )
    he_hue_to_deg: float = field(
        default=20.0,
        metadata={
            "flag": "--he-hue-to",
            "metavar": "DEG",
            "parse": "degrees",
            "group": "artefacts",
            "help": "H&E hue band end, degrees",
        },
    )
    dark_filter: bool = field(
        default=True,
        metadata={
            "flag": "--keep-dark-artefacts",
            "old_flags": ("--no-dark-filter",),
            "group": "artefacts",
            "help": "keep dark artefacts too (by default scanner edges, black ink and dots and bubble rims are "
            "removed, and dark pigment is kept)",
        },
    )
    keep_pigment: bool = field(
        default=True,
        metadata={
            "flag": "--dark-pigment-as-artefact",
            "group": "artefacts",
            "help": "remove dark pigment with the dark artefacts (by default brown, deeply stained or speckled dark "
            "regions, as melanin, haemosiderin, carbon and dense tissue are, stay tissue)",
        },
    )
    dark_max_value: float = field(
        default=0.25,
        metadata={
            "flag": "--dark-threshold",
            "old_flags": ("--dark-max-value",),
            "metavar": "V",
            "parse": "fraction",
            "group": "artefacts",
            "help": "brightness (HSV value, 0..1) below which a pixel is dark: removed as an artefact unless its "
            "region looks like pigment",
        },
    )
    artefact_margin_um: float = field(
        default=8.0,
        metadata={
            "metavar": "UM",
            "parse": "non_negative",
            "group": "artefacts",
            "help": "ink and dark artefacts are grown by this much (microns) before they are removed",
        },
    )

    def __post_init__(self) -> None:
        """Validate every field; the message names the field, the bad value and what is needed."""
        check_option(0 < self.thumb_mpp <= MAX_THUMB_MPP, "thumb_mpp", self.thumb_mpp, f"0 < UM <= {MAX_THUMB_MPP:g}")
        ok_px = isinstance(self.max_thumb_px, int) and not isinstance(self.max_thumb_px, bool)
        check_option(ok_px and self.max_thumb_px >= 16, "max_thumb_px", self.max_thumb_px, "an integer >= 16")
        check_option(isinstance(self.use_darkness, bool), "use_darkness", self.use_darkness, "True or False")
        for name in ("median_um", "close_um", "min_object_um2", "min_hole_um2"):
            value = getattr(self, name)
            check_option(math.isfinite(value) and value >= 0, name, value, "a finite number >= 0")
        check_option(0.0 <= self.min_threshold < 1.0, "min_threshold", self.min_threshold, "0 <= T < 1")
        fixed = self.fixed_threshold
        check_option(fixed is None or 0.0 <= fixed < 1.0, "fixed_threshold", fixed, "0 <= T < 1")
        for name in ("ink_filter", "dark_filter", "keep_pigment"):
            check_option(isinstance(getattr(self, name), bool), name, getattr(self, name), "True or False")
        for name in ("ink_min_saturation", "dark_max_value"):
            check_option(0.0 <= getattr(self, name) <= 1.0, name, getattr(self, name), "0..1")
        for name in ("he_hue_from_deg", "he_hue_to_deg"):
            check_option(0.0 <= getattr(self, name) < 360.0, name, getattr(self, name), "0 <= DEG < 360")
        margin = self.artefact_margin_um
        check_option(math.isfinite(margin) and margin >= 0, "artefact_margin_um", margin, "a finite number >= 0")


MISSING_POLICIES = ("skip", "whole")


@dataclass(frozen=True, kw_only=True)
class RoiOptions:
    """Annotation regions; see the module docstring.

    Attributes:
        path: a GeoJSON file or a folder of them, one per slide (None: no regions, every slide whole).
        min_roi_coverage: keep patches with at least this fraction inside the regions.
        labels: class names; a patch's label is the index of the listed class covering most of it.
        exclude: class names whose regions are removed from the others.
        missing: ``skip`` a slide with no annotation file (a failed record saying so), or build it ``whole``.

    Raises:
        OptionError: (a ``ValueError``) naming the field and the bad value.
    """

    path: str | None = field(
        default=None,
        metadata={
            "flag": "--roi",
            "metavar": "PATH",
            "parse": "str",
            "help": "GeoJSON annotations: a file, or a folder of <slide>.geojson files; patches only inside them",
        },
    )
    min_roi_coverage: float = field(
        default=0.5,
        metadata={"metavar": "FRAC", "parse": "fraction", "help": "keep patches at least this much inside the regions"},
    )
    labels: tuple[str, ...] = field(
        default=(),
        metadata={
            "flag": "--roi-labels",
            "metavar": "NAMES",
            "parse": "names",
            "help": "comma-separated class names: a patch's label (.cls) is the index of the class covering most of it",
        },
    )
    exclude: tuple[str, ...] = field(
        default=(),
        metadata={
            "flag": "--roi-exclude",
            "metavar": "NAMES",
            "parse": "names",
            "help": "comma-separated class names whose regions are removed",
        },
    )
    missing: str = field(
        default="skip",
        metadata={
            "flag": "--roi-missing",
            "choices": MISSING_POLICIES,
            "help": "a slide without an annotation file: skip it (recorded as such) or build it whole",
        },
    )

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_roi_coverage <= 1.0:
            raise OptionError(f"invalid min_roi_coverage: {self.min_roi_coverage!r} (need 0 <= FRAC <= 1)")
        if self.missing not in MISSING_POLICIES:
            raise OptionError(f"invalid missing: {self.missing!r} (need one of {', '.join(MISSING_POLICIES)})")
        for name in ("labels", "exclude"):
            names = getattr(self, name)
            if not isinstance(names, tuple) or not all(isinstance(n, str) and n for n in names):
                raise OptionError(f"invalid {name}: {names!r} (need a tuple of class names)")
            if len(set(names)) != len(names):
                raise OptionError(f"invalid {name}: {names!r} (a class is named twice)")
        if set(self.labels) & set(self.exclude):
            raise OptionError(f"invalid labels: {sorted(set(self.labels) & set(self.exclude))!r} also excluded")


def parse_names(text: str) -> tuple[str, ...]:
    """``"Tumor, Stroma"`` -> ``("Tumor", "Stroma")`` (the ``--roi-labels`` / ``--roi-exclude`` values)."""
    return tuple(n.strip() for n in text.split(",") if n.strip())
