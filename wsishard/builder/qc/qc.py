"""Quality-control pictures: the slide at about ``--qc-size`` px with what the build saw and kept.

Drawn over a low-resolution view of the slide: removed ink (magenta) and dark artefacts (orange), and dark pigment
kept as tissue (cyan), as translucent fills, the kept patches as a translucent blue fill (the tissue under them stays
visible), the tissue contour (green), the annotation regions' outlines (yellow), one sample's context fields (red
squares, with ``--context-mpp``), and a legend band under the picture with the counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image, ImageDraw, ImageFont

CONTOUR_RGB = (0, 170, 0)
PATCH_RGB = (30, 60, 230)
INK_RGB = (230, 0, 200)
DARK_RGB = (255, 140, 0)
PIGMENT_RGB = (0, 200, 220)
ROI_RGB = (255, 215, 0)
CONTEXT_RGB = (220, 0, 0)
FILL_ALPHA = 0.35  # kept patches
ARTEFACT_ALPHA = 0.5  # removed ink and dark artefacts
DEFAULT_SIZE_PX = 2000
_CROSS = cv2.getStructuringElement(cv2.MORPH_CROSS, (3, 3))  # 4-connected neighbours


@dataclass(frozen=True)
class QcLayers:
    """What a QC picture shows, each (h, w) bool on the tissue mask's grid (``l0_per_m`` level-0 px per px).

    ``ink``, ``dark``, ``roi`` and ``pigment`` (dark pigment kept as tissue) may be None (nothing of the kind)."""

    tissue: np.ndarray
    l0_per_m: float
    ink: np.ndarray | None = None
    dark: np.ndarray | None = None
    roi: np.ndarray | None = None
    pigment: np.ndarray | None = None


def qc_picture(
    view: np.ndarray,
    l0_per_v: float,
    layers: QcLayers,
    l0_x: np.ndarray,
    l0_y: np.ndarray,
    l0_extent: int,
    *,
    legend: list[str] | None = None,
    max_side_px: int = DEFAULT_SIZE_PX,
    footprints: Sequence[tuple[float, float, float]] = (),
) -> Image.Image:
    """Draw the picture.

    Args:
        view: (h, w, 3) uint8 low-resolution view of the slide at ``l0_per_v`` level-0 px per px; scaled down to at
            most ``max_side_px`` (never up).
        layers: the tissue mask and what was removed, on their own grid (resized to the picture's).
        l0_x, l0_y: (n,) level-0 top-left corners of the kept patches; ``l0_extent`` their level-0 side.
        legend: lines of counts written under the picture with the colour key (None: no legend band).
        footprints: level-0 squares ``(x, y, side)`` outlined in red: one sample's context fields.
    """
    image = Image.fromarray(view)
    scale = min(1.0, max_side_px / max(image.size))
    if scale < 1.0:
        image = image.resize(
            (max(1, round(image.width * scale)), max(1, round(image.height * scale))), Image.Resampling.BOX
        )
    size = (image.width, image.height)
    out = np.array(image)  # (H, W, 3) uint8, drawn on in place
    for layer, color in ((layers.ink, INK_RGB), (layers.dark, DARK_RGB), (layers.pigment, PIGMENT_RGB)):
        if layer is not None and layer.any():
            _blend(out, _resized(layer, size), color, ARTEFACT_ALPHA)
    t_per_l0 = scale / l0_per_v  # picture px per level-0 px
    _blend(out, _patch_area(size, l0_x, l0_y, l0_extent, t_per_l0), PATCH_RGB, FILL_ALPHA)
    width = 2 if max(size) >= 1000 else 1
    out[_outline(_resized(layers.tissue, size), width)] = CONTOUR_RGB
    if layers.roi is not None:
        out[_outline(_resized(layers.roi, size), width)] = ROI_RGB
    picture = Image.fromarray(out)
    draw = ImageDraw.Draw(picture)
    for x, y, side in footprints:  # may run off the picture, as context runs off the slide
        box = [round(x * t_per_l0), round(y * t_per_l0), round((x + side) * t_per_l0), round((y + side) * t_per_l0)]
        draw.rectangle(box, outline=CONTEXT_RGB, width=width)
    return picture if legend is None else _with_legend(picture, legend)


def _resized(mask: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """(H, W) bool: ``mask`` resized (nearest) to ``size`` (W, H)."""
    if (mask.shape[1], mask.shape[0]) == size:
        return mask
    return np.asarray(Image.fromarray(mask).resize(size, Image.Resampling.NEAREST))


def _blend(out: np.ndarray, where: np.ndarray, color: tuple[int, int, int], alpha: float) -> None:
    """``color`` laid over ``out`` (H, W, 3) uint8, in place, at opacity ``alpha`` where ``where`` (H, W) is True.

    The arithmetic of Pillow's ``Image.composite`` with an 8-bit mask of ``round(alpha * 255)`` (the same pixels),
    as one lookup table per channel: no full-size mask, colour plane or float copy."""
    a = round(alpha * 255)
    mixed = np.arange(256, dtype=np.uint16)[:, None] * (255 - a) + np.array(color, dtype=np.uint16) * a + 128
    table = (((mixed >> 8) + mixed) >> 8).astype(np.uint8)  # (256, 3): Pillow's exact division by 255
    cv2.copyTo(cv2.LUT(out, table[:, None, :]), np.ascontiguousarray(where).view(np.uint8), out)  # into out


def _patch_area(
    size: tuple[int, int], l0_x: np.ndarray, l0_y: np.ndarray, l0_extent: int, t_per_l0: float
) -> np.ndarray:
    """(H, W) bool: the picture px the kept patches cover (each at least one px)."""
    area = np.zeros((size[1], size[0]), dtype=bool)
    side = max(1, round(l0_extent * t_per_l0))
    for x, y in zip(l0_x.tolist(), l0_y.tolist(), strict=True):
        px, py = round(x * t_per_l0), round(y * t_per_l0)
        area[py : py + side, px : px + side] = True
    return area


def _outline(mask: np.ndarray, width: int) -> np.ndarray:
    """(H, W) bool: the pixels of ``mask`` that touch (4-connected) a pixel outside it, grown ``width - 1`` px
    inwards; the image's border does not count as outside (scikit-image's ``find_boundaries(mode="inner")``)."""
    m = mask.astype(np.uint8)
    inner = np.asarray(cv2.erode(m, _CROSS, borderType=cv2.BORDER_REPLICATE), dtype=np.uint8)
    edge = m > inner  # in the mask, not in its erosion
    if width > 1:
        grown = cv2.dilate(
            edge.view(np.uint8), _CROSS, iterations=width - 1, borderType=cv2.BORDER_CONSTANT, borderValue=0
        )
        edge = np.asarray(grown, dtype=bool) & mask
    return edge


def legend_lines(
    *,
    tissue_mm2: float,
    ink_mm2: float,
    artefact_mm2: float,
    kept: int,
    filtered: dict[str, int],
    roi: str = "",
    pigment_mm2: float = 0.0,
) -> list[str]:
    """The legend's lines: the colour key with each layer's figure, then the patches left out per reason."""
    key = (
        f"tissue contour (green): {tissue_mm2:.2f} mm2 | kept patches (blue): {kept:,} | "
        f"ink removed (magenta): {ink_mm2:.2f} mm2 | "
        f"dark artefacts removed (orange): {artefact_mm2:.2f} mm2 | "
        f"dark pigment kept as tissue (cyan): {pigment_mm2:.2f} mm2"
    )
    lines = [key + (f" | annotations (yellow): {roi}" if roi else "")]
    if filtered:
        lines.append("left out: " + ", ".join(f"{reason} {n:,}" for reason, n in sorted(filtered.items())))
    return lines


def _with_legend(picture: Image.Image, lines: list[str]) -> Image.Image:
    """The picture with a white band under it holding ``lines`` (font sized to the picture, wrapped to fit)."""
    font_px = max(10, min(22, picture.width // 60))
    font = ImageFont.load_default(size=font_px)
    wrapped = [part for line in lines for part in _wrap(line, font, picture.width - 2 * font_px)]
    band = Image.new("RGB", (picture.width, (len(wrapped) + 1) * int(font_px * 1.4)), "white")
    draw = ImageDraw.Draw(band)
    for i, text in enumerate(wrapped):
        draw.text((font_px, int(font_px * (0.6 + 1.4 * i))), text, fill=(20, 20, 20), font=font)
    return Image.fromarray(np.concatenate([np.asarray(picture), np.asarray(band)]))  # (H + band, W, 3)


def _wrap(text: str, font: ImageFont.FreeTypeFont | ImageFont.ImageFont, width: float) -> list[str]:
    """``text`` cut at spaces into lines at most ``width`` px wide (a word longer than that stays whole)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and font.getlength(lines[-1] + " " + word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines
