"""A build's records: its manifest made from the slides' and shards' records, and the files written last (the index
summary, the manifest and slide records, the QC page)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence
from typing import Any

from wsishard import __version__
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.format import QC_INDEX_NAME, slides_name
from wsishard.manifest import Manifest, ShardRecord, SlideRecord, manifest_files
from wsishard.qc_html import qc_index
from wsishard.shards.summary import summary_name, write_summary
from wsishard.storage.output import Destination
from wsishard.storage.urls import public_location


def make_manifest(
    inputs: Sequence[str],
    options: BuildOptions,
    slides: dict[int, SlideRecord],
    shards: list[ShardRecord],
    digest: str,
    part: tuple[int, int] | None,
    n_slides: int,
) -> Manifest:
    """The manifest of the build (or of a part: its slides' records, with their indices among all slides)."""
    extra: dict[str, Any] = {"fingerprint": digest}
    if options.class_names:
        extra["label_names"] = list(options.class_names)
    indices = sorted(slides)
    if part is not None:
        extra.update(part=list(part), slide_indices=indices, slides_total=n_slides)
    return Manifest(
        options={"inputs": [public_location(i) for i in inputs], **options_dict(options)},
        shards=shards,
        slides=[slides[i] for i in indices],
        image_format=options.image_format,
        wsishard_version=__version__,
        extra=extra,
        slides_file=slides_name(part),
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )


def options_dict(options: BuildOptions, *, for_fingerprint: bool = False) -> dict[str, Any]:
    """Every option as plain data (``context_size`` resolved: the context patches' px); the fingerprint leaves out
    what does not change the output (``jobs``; the context options of a build without context, so that outputs
    begun before they existed resume)."""
    data = dataclasses.asdict(options)
    data["mpp_overrides"] = dict(options.mpp_overrides)
    data["labels"] = dict(options.labels)
    data["label_names"] = list(options.label_names)
    data["context_mpp"] = list(options.context_mpp)
    data["context_size"] = options.context_size_px
    if for_fingerprint:
        data.pop("jobs")
        data.pop("require_labels")  # a check, not a change to the output
        if not options.context_mpp:
            data.pop("context_mpp")
            data.pop("context_size")
    return data


def write_outputs(dest: Destination, manifest: Manifest, part: tuple[int, int] | None, *, qc: bool) -> Manifest:
    """Write what a build writes last: its index summary, then its manifest and slide records (the manifest last of
    all: an output with a manifest is finished), then (a whole build with ``qc``) its QC page. Returns the manifest
    as written (with its summary's digest)."""
    summary = write_summary(dest, [s.name for s in manifest.shards], summary_name(part))
    manifest = dataclasses.replace(manifest, index_sha256=summary.digest() if summary is not None else "")
    for name, data in manifest_files(manifest, part):
        dest.write_bytes(name, data)
    if qc and part is None:  # a cluster build's parts would overwrite each other's: inspect --html
        dest.write_bytes(QC_INDEX_NAME, qc_index(manifest).encode())
    return manifest
