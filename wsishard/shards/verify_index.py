"""``verify``'s checks of the per-sample index: each shard's ``.idx.npz`` against its shard (the keys, in order, as
the shard was read) and against the digest the manifest records of it, and the summary (``index.npz``) against the
manifest's counts and digest and against the shard indexes' own label and slide counts.

An output built by a wsishard without indexes (no summary, no digests) has nothing to check here; an index that the
manifest does not bind (an older build, or one indexed after the fact before digests) is still checked against its
shard's keys and the summary.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import IO

import numpy as np

from wsishard.errors import IndexFileError
from wsishard.manifest import Manifest, ShardRecord
from wsishard.shards.index import index_name, load_index
from wsishard.shards.summary import SUMMARY_NAME, Summary, combine, per_shard
from wsishard.storage.secrets import describe

Counts = tuple[np.ndarray, ...]  # one shard index's (labels, label_counts, slide_names, slide_counts)


def keys_digest(keys: Iterable[str]) -> str:
    """sha256 of sample keys in order (one per line): the shard's keys as read, against its index's."""
    digest = hashlib.sha256()
    for key in keys:
        digest.update(key.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def check_index(
    location: str, record: ShardRecord, keys_sha256: str | None, opener: Callable[[str], IO[bytes]], indexed: bool
) -> tuple[list[str], Counts | None]:
    """How shard ``record``'s index at ``location`` differs from its shard and its manifest record (``keys_sha256``:
    the shard's keys as read, None where the shard could not be read whole), and the index's counts for the summary
    check. ``indexed``: the build has indexes (a missing one is then a problem)."""
    name = index_name(record.name)
    try:
        with opener(location) as fh:
            data = fh.read()
    except FileNotFoundError:
        missing = indexed or bool(record.index_sha256)
        return ([f"its index {name} is missing (re-run the build to write it again)"] if missing else []), None
    except OSError as exc:
        return [f"its index {name} cannot be read ({describe(exc)})"], None
    try:
        index = load_index(data, name)
    except IndexFileError as exc:
        return [f"its index {exc.reason}"], None
    reasons = []
    if record.index_sha256 and index.digest != record.index_sha256:
        reasons.append(f"its index {name} is not the one the build wrote for it (digest differs from the manifest's)")
    if len(index) != record.samples:
        reasons.append(f"its index {name} lists {len(index)} samples, the manifest says {record.samples}")
    elif keys_sha256 is not None and keys_digest(index.key.astype(str).tolist()) != keys_sha256:
        reasons.append(f"its index {name} lists other sample keys than the shard holds")
    slides = np.bincount(index.columns["slide"], minlength=len(index.slide_names)).astype(np.int64)
    labels, label_counts = np.unique(index.columns["label"], return_counts=True)
    return reasons, (labels.astype(np.int64), label_counts.astype(np.int64), index.slide_names, slides)


def summary_problems(
    manifest: Manifest, data: bytes | None, counts: Sequence[Counts | None], indexed: bool
) -> list[tuple[str, str]]:
    """``(index.npz, reason)`` where the summary (``data``: its bytes, None when missing) differs from the manifest
    or from the shard indexes' counts (``counts``, per shard in manifest order; None where an index was unusable)."""
    if data is None:
        return [(SUMMARY_NAME, "missing (re-run the build to write it again)")] if indexed else []
    try:
        summary = Summary.from_bytes(data, SUMMARY_NAME)
    except IndexFileError as exc:
        return [(SUMMARY_NAME, exc.reason)]
    names = [rec.name for rec in manifest.shards]
    if summary.shards.astype(str).tolist() != names:
        return [(SUMMARY_NAME, "lists other shards than the manifest")]
    problems = []
    if manifest.index_sha256 and summary.digest() != manifest.index_sha256:
        problems.append((SUMMARY_NAME, "is not the summary the build wrote (digest differs from the manifest's)"))
    wrong = [n for n, s, rec in zip(names, summary.samples.tolist(), manifest.shards, strict=True) if s != rec.samples]
    if wrong:
        problems.append((SUMMARY_NAME, f"counts other samples than the manifest for {len(wrong)} shards ({wrong[0]})"))
    if all(c is not None for c in counts):
        want = per_shard(combine(names, [c for c in counts if c is not None]))
        have = per_shard(summary)
        differ = [n for n in names if not all(np.array_equal(a, b) for a, b in zip(want[n], have[n], strict=True))]
        if differ:
            problems.append((SUMMARY_NAME, f"label or slide counts differ from {differ[0]}'s index"))
    return problems
