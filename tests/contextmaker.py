"""Context members added to hand-made outputs (:mod:`shardmaker`), as ``wsishard build --context-mpp`` writes them.

The contract shared with the build: the manifest's ``options`` gain ``context_mpp`` (ascending floats, K of them) and
``context_size`` (px); each sample gains ``<key>.ctx0.<fmt>`` ... ``<key>.ctx<K-1>.<fmt>`` right after its image, in
the image's format, and its ``.json`` a ``"context"`` list (each scale's mpp, level-0 corner, size, padded fraction).
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable

import numpy as np
import shardmaker as sm
from PIL import Image

from wsishard.format import IMAGE_FORMATS, split_member
from wsishard.manifest import Manifest

Maker = Callable[[str, int, bytes], bytes]  # (key, scale, the sample's image bytes) -> the context member's bytes


def add_context(
    out: sm.Output, mpp: tuple[float, ...] = (2.0,), size_px: int = 24, *, member: Maker | None = None, seed: int = 0
) -> dict[str, np.ndarray]:
    """Rewrite every shard of ``out`` with K = ``len(mpp)`` context members a sample (noise patches of ``size_px`` in
    the output's image format, or ``member(key, scale, image bytes)``), and record the scales in the manifest.

    Returns:
        key -> (K, size, size, 3) uint8: each sample's context members as PIL decodes them.
    """
    rng = np.random.default_rng(seed)
    fmt = out.manifest.image_format
    decoded: dict[str, np.ndarray] = {}

    def change(members: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        result: list[tuple[str, bytes]] = []
        for name, data in members:
            key, ext = split_member(name) or (name, "")
            if ext in IMAGE_FORMATS:  # the image first, then its context, then the rest (the contract's order)
                first = next(i for i, (n, _) in enumerate([*result, (name, b"")]) if n.startswith(key + "."))
                result.insert(first, (name, data))
                scales = []
                for k in range(len(mpp)):
                    noise = rng.integers(0, 256, (size_px, size_px, 3), dtype=np.uint8)  # (h, w, 3)
                    ctx = member(key, k, data) if member else sm.encode(noise, fmt)
                    result.insert(first + 1 + k, (f"{key}.ctx{k}.{fmt}", ctx))
                    scales.append(_pil(ctx))
                decoded[key] = np.stack(scales) if scales else np.zeros((0, size_px, size_px, 3), np.uint8)
            elif ext == "json":
                meta = json.loads(data)
                meta["context"] = [
                    {"mpp": m, "x": meta["x"], "y": meta["y"], "size": size_px, "padded": 0.0} for m in mpp
                ]
                result.append((name, json.dumps(meta, sort_keys=True).encode()))
            else:
                result.append((name, data))
        return result

    for i in range(len(out.manifest.shards)):
        sm.rewrite_shard(out, i, change)
    set_options(out, context_mpp=list(mpp), context_size=size_px)
    return decoded


def set_options(out: sm.Output, **options: object) -> None:
    """Set manifest options of ``out`` (and write the manifest)."""
    out.manifest = Manifest(**{**out.manifest.__dict__, "options": {**out.manifest.options, **options}})
    sm.write_manifest(out)


def _pil(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as img:
        return np.asarray(img.convert("RGB"))  # (h, w, 3) uint8


def members_of(path: str) -> list[str]:
    """The member names of a shard, in tar order."""
    with tarfile.open(path) as tar:
        return tar.getnames()
