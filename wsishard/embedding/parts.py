"""The embedding pass's unit of resume: a part, some consecutive source shards' patches embedded, written
atomically under ``OUT/.wsishard/embed/`` and skipped by a resumed run when present and made by the same pass.

A part is an ``.npz`` of plain arrays (read with ``allow_pickle=False``): ``features`` (n, D) float16, ``coords``
(n, 2) int32 level-0 x, y, and ``info``, UTF-8 JSON as uint8: the pass's fingerprint, each patch's key and slide id.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from wsishard.manifest import Manifest, ShardRecord
from wsishard.storage.output import Destination

PART_FOLDER = ".wsishard/embed"

__all__ = ["Part", "PartData", "deal_parts", "part_name", "read_part", "source_id", "write_part"]


@dataclass(frozen=True)
class Part:
    """Source shards ``shards`` (indexes in manifest order), embedded together: ``samples`` patches."""

    index: int
    shards: tuple[int, ...]
    samples: int


@dataclass(frozen=True)
class PartData:
    """A part's content: per patch its key, slide id, features and level-0 coordinates."""

    keys: list[str]
    slides: list[str]
    features: np.ndarray  # (n, D) float16
    coords: np.ndarray  # (n, 2) int32: level-0 x, y


def source_id(manifest: Manifest) -> str:
    """A build's identity: a digest of its shard list (names, counts, sha256), 16 hex digits."""
    rows = [[s.name, s.samples, s.sha256] for s in manifest.shards]
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()[:16]


def deal_parts(shards: list[ShardRecord], part_samples: int, world_size: int) -> list[list[Part]]:
    """The source's shards cut into parts of about ``part_samples`` patches (consecutive shards, whatever the
    topology: a run resumed on other ranks finds the same parts), then dealt to ranks, largest first, each to the
    rank with the fewest patches so far."""
    parts: list[Part] = []
    run: list[int] = []
    total = 0
    for i, shard in enumerate(shards):
        run.append(i)
        total += shard.samples
        if total >= part_samples:
            parts.append(Part(len(parts), tuple(run), total))
            run, total = [], 0
    if run:
        parts.append(Part(len(parts), tuple(run), total))
    ranks: list[list[Part]] = [[] for _ in range(world_size)]
    load = [0] * world_size
    for part in sorted(parts, key=lambda p: (-p.samples, p.index)):
        r = min(range(world_size), key=lambda k: (load[k], k))
        ranks[r].append(part)
        load[r] += part.samples
    return [sorted(r, key=lambda p: p.index) for r in ranks]


def part_name(index: int) -> str:
    return f"{PART_FOLDER}/part-{index:06d}.npz"


def write_part(dest: Destination, index: int, fingerprint: str, data: PartData) -> None:
    """Write part ``index`` atomically (it appears complete or not at all)."""
    info = json.dumps({"fingerprint": fingerprint, "keys": data.keys, "slides": data.slides}).encode()
    buf = io.BytesIO()
    np.savez(
        buf,
        features=data.features.astype(np.float16),
        coords=data.coords.astype(np.int32),
        info=np.frombuffer(info, dtype=np.uint8),
    )
    dest.write_bytes(part_name(index), buf.getvalue())


def read_part(dest: Destination, index: int, fingerprint: str, samples: int) -> PartData | None:
    """Part ``index`` if it is there, made by the pass of ``fingerprint`` and holds ``samples`` patches; else None
    (it is then made again)."""
    raw = dest.read_bytes(part_name(index))
    if raw is None:
        return None
    try:
        with np.load(io.BytesIO(raw), allow_pickle=False) as z:
            arrays: dict[str, Any] = {k: z[k] for k in ("features", "coords", "info")}
        info = json.loads(arrays["info"].tobytes().decode())
    except (OSError, ValueError, KeyError, zipfile.BadZipFile):
        return None
    if info.get("fingerprint") != fingerprint or len(info.get("keys", ())) != samples:
        return None
    return PartData(info["keys"], info["slides"], arrays["features"], arrays["coords"])
