"""``wsishard export OUT --format h5 -o DIR``: one ``<slide_id>.h5`` per slide, the layout CLAM and TRIDENT read.

Each file holds datasets ``features`` (N, D) float16 and ``coords`` (N, 2) int32 (level-0 x, y of each patch's top-left
corner); ``coords`` carries TRIDENT's attributes ``patch_size`` (px as embedded), ``patch_size_level0`` (the level-0
px a patch covers), ``patch_level`` (0: coordinates are level-0) and ``name`` (the slide id), plus ``patch_mpp``; the
file's own attributes repeat them with the model, D and the source build.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import h5py

from wsishard.embedding.output import is_embeddings
from wsishard.embedding.slides import SlideBag, read_slides
from wsishard.errors import ManifestError
from wsishard.format import sanitize_slide_id
from wsishard.storage.opener import StreamOpener, load_manifest
from wsishard.storage.secrets import redact

__all__ = ["export_h5"]


def export_h5(
    source: str | os.PathLike[str], folder: str | os.PathLike[str], storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Write every slide of the embeddings output ``source`` as ``folder/<slide_id>.h5`` (a local folder); return
    the paths written. Each file is written under a temporary name and renamed, so none is ever seen half written.

    Raises:
        ManifestError: ``source`` is not an embeddings output (``wsishard embed``).
    """
    manifest, root = load_manifest(os.fspath(source), dict(storage_options or {}))
    if not is_embeddings(manifest):
        where = redact(os.fspath(source), storage_options)
        raise ManifestError(where, "not an embeddings output: export reads what wsishard embed writes")
    records = {s.slide_id: s for s in manifest.slides}
    os.makedirs(folder, exist_ok=True)
    written = []
    for bag in read_slides(root, manifest, StreamOpener(dict(storage_options or {}))):
        rec = records.get(bag.slide_id)
        level0 = None
        if rec is not None and rec.patch_mpp and rec.slide_mpp:
            level0 = round(int(bag.meta.get("patch_size", 0)) * rec.patch_mpp / rec.slide_mpp)
        written.append(_write(bag, os.fspath(folder), level0))
    return written


def _write(bag: SlideBag, folder: str, patch_size_level0: int | None) -> str:
    path = os.path.join(folder, f"{sanitize_slide_id(bag.slide_id)}.h5")
    tmp = f"{path}.tmp-{os.getpid()}"
    attrs = {
        "patch_size": int(bag.meta.get("patch_size") or 0),
        "patch_size_level0": patch_size_level0 if patch_size_level0 is not None else -1,
        "patch_level": 0,
        "patch_mpp": float(bag.meta.get("patch_mpp") or -1),
        "name": bag.slide_id,
    }
    try:
        with h5py.File(tmp, "w") as f:
            f.create_dataset("features", data=bag.features)
            coords = f.create_dataset("coords", data=bag.coords)
            for k, v in attrs.items():
                coords.attrs[k] = v
                f.attrs[k] = v
            f.attrs["model"] = str(bag.meta.get("model", ""))
            f.attrs["dim"] = int(bag.features.shape[1])
            f.attrs["source_id"] = str(bag.meta.get("source_id", ""))
            f.attrs["label"] = bag.label
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path
