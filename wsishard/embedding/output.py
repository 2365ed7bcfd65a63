"""An embeddings output: the parts of an embedding pass joined into one sample per slide, written as a build output
of its own (tar shards by :class:`~wsishard.shards.writer.ShardWriter`, the manifest last).

A slide's sample ``<slide_id>`` holds ``features.npy`` (N, D) float16, ``coords.npy`` (N, 2) int32 (each patch's
level-0 x, y), ``keys.json`` (the source samples' keys, in the same order: by y, then x), ``.cls`` (the slide's label,
when labelled) and ``.json`` (:func:`slide_meta`). The manifest's ``extra["kind"]`` is ``"embeddings"`` and
``extra["embed"]`` records the source build and the pass's options.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import numpy as np

from wsishard import __version__
from wsishard.embedding.parts import PartData
from wsishard.errors import ManifestError
from wsishard.format import EMBEDDINGS_KIND, is_embeddings_extra, shard_name
from wsishard.manifest import Manifest, SlideRecord, manifest_files
from wsishard.shards.summary import summary_name, write_summary
from wsishard.shards.writer import ShardWriter
from wsishard.storage.output import Destination

KIND = EMBEDDINGS_KIND

__all__ = ["KIND", "is_embeddings", "refuse_embeddings", "write_output"]


def is_embeddings(manifest: Manifest) -> bool:
    """Whether ``manifest`` is an embeddings output's (``wsishard embed``), not a pixel build's."""
    return is_embeddings_extra(manifest.extra)


def refuse_embeddings(manifest: Manifest, where: str, what: str) -> None:
    """Raise if ``manifest`` is an embeddings output's: ``what`` needs a build of pixel patches.

    Raises:
        ManifestError: naming ``where`` and ``what``.
    """
    if is_embeddings(manifest):
        raise ManifestError(where, f"an embeddings output (wsishard embed), not a build of pixel patches: {what}")


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, allow_pickle=False)
    return buf.getvalue()


def slide_meta(record: SlideRecord | None, slide_id: str, embed: dict[str, Any], patches: int) -> dict[str, Any]:
    """A slide sample's ``.json``: its id, label (when labelled), patch mpp and size, patches, the model, D and the
    source build."""
    labelled = record is not None and record.label is not None
    return {
        "slide_id": slide_id,
        **({"label": record.label} if labelled and record is not None else {}),  # as .cls: only when labelled
        "patch_mpp": record.patch_mpp if record is not None else None,
        "patch_size": embed["patch_size"],
        "patches": patches,
        "model": embed["model"],
        "dim": embed["dim"],
        "source_id": embed["source_id"],
    }


def _by_slide(parts: list[PartData]) -> dict[str, tuple[list[str], np.ndarray, np.ndarray]]:
    """Every patch of ``parts`` grouped by slide, each slide's patches ordered by (y, x)."""
    rows: dict[str, list[tuple[int, int]]] = defaultdict(list)  # slide -> (part, row)
    for p, part in enumerate(parts):
        for r, slide in enumerate(part.slides):
            rows[slide].append((p, r))
    slides = {}
    for slide, where in sorted(rows.items()):
        coords = np.stack([parts[p].coords[r] for p, r in where]).astype(np.int32)  # (n, 2)
        order = np.lexsort((coords[:, 0], coords[:, 1]))
        feats = np.stack([parts[p].features[r] for p, r in where]).astype(np.float16)[order]  # (n, D)
        keys = [parts[where[i][0]].keys[where[i][1]] for i in order]
        slides[slide] = (keys, feats, coords[order])
    return slides


def write_output(
    dest: Destination, parts: list[PartData], source: Manifest, embed: dict[str, Any], options: dict[str, Any]
) -> Manifest:
    """Join ``parts`` into one sample per slide in shards of ``options["slides_per_shard"]`` slides, then write the
    manifest (last: its presence means the output is complete). ``embed``: what the manifest and each slide's
    ``.json`` record (source id, model, D, patch size, the pass's options)."""
    records = {s.slide_id: s for s in source.slides}
    slides = _by_slide(parts)
    names = list(slides)
    per = int(options["slides_per_shard"])
    shards = []
    for k in range(0, len(names), per):
        with ShardWriter(dest, shard_name(k // per)) as writer:
            for slide in names[k : k + per]:
                keys, feats, coords = slides[slide]
                rec = records.get(slide)
                members = {
                    "features.npy": _npy(feats),
                    "coords.npy": _npy(coords),
                    "keys.json": json.dumps(keys).encode(),
                    "json": json.dumps(slide_meta(rec, slide, embed, len(keys))).encode(),
                }
                if rec is not None and rec.label is not None:
                    members["cls"] = str(rec.label).encode()
                writer.write(slide, members, slide)
        assert writer.record is not None  # committed on a clean exit
        shards.append(writer.record)
    out_slides = [replace(records[s], patches=len(slides[s][0])) for s in names if s in records]
    summary = write_summary(dest, [s.name for s in shards], summary_name())  # select= / weights= on slides
    manifest = Manifest(
        options={"patch": source.options.get("patch", {}), "embed": options},
        shards=shards,
        slides=out_slides,
        image_format=source.image_format,  # the source patches'; the kind (extra) says what the samples hold
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        wsishard_version=__version__,
        extra={"kind": KIND, "embed": embed},
        index_sha256=summary.digest() if summary is not None else "",
    )
    for name, data in manifest_files(manifest):
        dest.write_bytes(name, data)
    return manifest
