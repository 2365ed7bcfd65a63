"""Join the part manifests of a cluster build (``wsishard build --part i/n``) into the final manifest."""

from __future__ import annotations

import dataclasses
import datetime

from wsishard.errors import ManifestError
from wsishard.format import MANIFEST_NAME, parse_part_manifest, shard_order
from wsishard.manifest import Manifest, SlideRecord, manifest_files
from wsishard.shards.summary import Summary, summary_name, write_summary
from wsishard.storage.opener import load_manifest
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions


def merge(output: str, storage_options: StorageOptions | None = None) -> Manifest:
    """Check that every part of ``output`` is there and consistent, then write and return ``manifest.json`` (and
    its ``slides.jsonl`` and ``index.npz``): the files a one-machine build of the same slides and options writes.

    Raises:
        ManifestError: no part manifests, a part missing, or parts of different builds (other options, or another
            format version: the merged manifest keeps its parts' version, so version 2 parts merge as before).
    """
    dest = Destination(output, storage_options)
    found: dict[int, tuple[int, str]] = {}
    for name in dest.listdir():
        part = parse_part_manifest(name)
        if part is not None:
            found[part[0]] = (part[1], name)
    if not found:
        raise ManifestError(dest.path(MANIFEST_NAME), "no part manifests (manifest.part-I-of-N.json) to merge")
    counts = {n for n, _ in found.values()}
    if len(counts) != 1:
        raise ManifestError(dest.location, f"part manifests of different part counts: {sorted(counts)}")
    n = counts.pop()
    missing = sorted(set(range(1, n + 1)) - set(found))
    if missing:
        raise ManifestError(dest.location, f"parts {', '.join(map(str, missing))} of {n} are not finished yet")
    parts = [load_manifest(dest.path(found[i][1]), storage_options)[0] for i in range(1, n + 1)]  # with slides
    manifest = _join(parts, dest.location)
    summaries = [dest.read_bytes(summary_name((i, n))) for i in range(1, n + 1)]
    summary = write_summary(
        dest,
        [s.name for s in manifest.shards],
        summary_name(),
        [Summary.from_bytes(b, dest.path(summary_name((i + 1, n)))) for i, b in enumerate(summaries) if b],
    )
    manifest = dataclasses.replace(manifest, index_sha256=summary.digest() if summary is not None else "")
    for name, data in manifest_files(manifest):
        dest.write_bytes(name, data)
    return manifest


def _join(parts: list[Manifest], location: str) -> Manifest:
    first = parts[0]
    for i, part in enumerate(parts[1:], start=2):
        if part.version != first.version:  # each part's samples as its version writes them: one version an output
            versions = f"part {i} is of format version {part.version} and part 1 of version {first.version}"
            raise ManifestError(location, f"{versions}: build every part with the same wsishard")
        if part.extra.get("fingerprint") != first.extra.get("fingerprint"):
            raise ManifestError(location, f"part {i} was built from other slides or options than part 1")
    indexed: list[tuple[int, SlideRecord]] = []
    for i, part in enumerate(parts, start=1):
        indices = part.extra["slide_indices"]
        if len(indices) != len(part.slides):
            raise ManifestError(location, f"part {i} lists {len(indices)} slide indices for {len(part.slides)} slides")
        indexed += zip(indices, part.slides, strict=True)
    total = first.extra["slides_total"]
    indexed.sort(key=lambda t: t[0])
    if [i for i, _ in indexed] != list(range(total)):
        raise ManifestError(location, f"the parts do not list each of the {total} slides exactly once")
    shards = sorted((s for p in parts for s in p.shards), key=lambda s: shard_order(s.name))
    if len({s.name for s in shards}) != len(shards):
        raise ManifestError(location, "two parts list the same shard")
    extra = {k: v for k, v in first.extra.items() if k not in ("part", "slide_indices", "slides_total")}
    return dataclasses.replace(
        first,
        shards=shards,
        slides=[s for _, s in indexed],
        extra=extra,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )
