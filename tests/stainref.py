"""Per-image numpy references of the stain operations, shared by the tests of the torch path (test_stain_ops.py) and
of the C pass (test_stain_native.py): torchstain's Macenko normalisation with a given stain, torchvision's
ColorJitter formulas."""

from __future__ import annotations

import numpy as np
from skimage import color

from wsishard.augment.stain import StainTarget


def torchstain_normalize(
    tile: np.ndarray, matrix: np.ndarray, max_conc: np.ndarray, target: StainTarget, io: float = 240.0
) -> np.ndarray:
    """torchstain's NumpyMacenkoNormalizer.normalize, its per-tile fit replaced by (matrix, max_conc), before its
    cast to uint8: float (h, w, 3) in 0..255."""
    od = -np.log((tile.reshape(-1, 3).astype(float) + 1) / io)
    conc = np.linalg.lstsq(matrix, od.T, rcond=None)[0]
    conc = conc / (max_conc / np.array(target.max_conc))[:, None]
    out = io * np.exp(-np.array(target.matrix) @ conc)
    out[out > 255] = 255
    return out.T.reshape(tile.shape)


def jitter_reference(img: np.ndarray, f: np.ndarray) -> np.ndarray:
    """torchvision's adjust_brightness, _contrast, _saturation and _hue on one float (h, w, 3) image in [0, 1]."""
    grey = lambda x: x @ np.array([0.2989, 0.587, 0.114])  # noqa: E731
    x = np.clip(img * f[0], 0, 1)
    x = np.clip(f[1] * x + (1 - f[1]) * grey(x).mean(), 0, 1)
    x = np.clip(f[2] * x + (1 - f[2]) * grey(x)[..., None], 0, 1)
    hsv = color.rgb2hsv(x)
    hsv[..., 0] = (hsv[..., 0] + f[3]) % 1.0
    return color.hsv2rgb(hsv)
