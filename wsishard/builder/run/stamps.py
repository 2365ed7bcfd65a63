"""What identifies a build: the fingerprint of its slide list and options, and the stamps that tell whether an input
changed since (without reading it)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import fsspec

from wsishard import format as fmt
from wsishard.storage.urls import StorageOptions, is_url, public_location

__all__ = ["Stamp", "build_identity", "fingerprint", "identity_change", "input_stamps"]

_TAGS = ("ETag", "etag", "VersionId", "LastModified", "mtime", "updated")  # what tells an object's version, best first

Stamp = dict[str, Any]  # {"size", "mtime_ns"} of a file, {"size", "tag"} of an object


def build_identity(slides: Sequence[str], options: dict[str, Any]) -> dict[str, Any]:
    """What determines the output: the slide list (URLs as stored: a presigned slide signed again is the same
    slide), every option, the format version and the build revision (recorded so that a refused resume can say what
    changed: :func:`identity_change`)."""
    return {
        "slides": [public_location(s) for s in slides],
        "options": options,
        "format": fmt.FORMAT_VERSION,
        "revision": fmt.BUILD_REVISION,
    }


def fingerprint(slides: Sequence[str], options: dict[str, Any]) -> str:
    """A digest of :func:`build_identity`."""
    text = json.dumps(build_identity(slides, options), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def identity_change(old: dict[str, Any], new: dict[str, Any], *, limit: int = 3) -> str:
    """What differs between two :func:`build_identity` records, in words (``option patch.target_mpp 0.5 -> 1.0;
    slides added: c.svs``), at most ``limit`` of each kind named; empty when nothing recorded differs."""
    changes = []
    old_opts, new_opts = _flat(old.get("options"), ""), _flat(new.get("options"), "")
    changed = [k for k in sorted(set(old_opts) | set(new_opts)) if old_opts.get(k, "unset") != new_opts.get(k, "unset")]
    for key in changed[:limit]:
        changes.append(f"option {key} {_short(old_opts.get(key, 'unset'))} -> {_short(new_opts.get(key, 'unset'))}")
    if len(changed) > limit:
        changes.append(f"{len(changed) - limit} more options")
    old_slides, new_slides = old.get("slides") or [], new.get("slides") or []
    for word, names in (("added", _missing(new_slides, old_slides)), ("removed", _missing(old_slides, new_slides))):
        if names:
            more = f" and {len(names) - limit} more" if len(names) > limit else ""
            changes.append(f"slides {word}: {', '.join(os.path.basename(n) for n in names[:limit])}{more}")
    for key, what in (("format", "format version"), ("revision", "build revision (how wsishard plans and resamples)")):
        if old.get(key) != new.get(key):
            changes.append(f"{what} {old.get(key)} -> {new.get(key)}")
    return "; ".join(changes)


def _flat(value: Any, prefix: str) -> dict[str, str]:
    """A nested options dict as ``{"patch.target_mpp": "0.5", ...}`` (values as JSON text)."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: json.dumps(value, sort_keys=True)} if prefix else {}


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else f"{text[: width - 3]}..."


def _missing(names: Sequence[str], of: Sequence[str]) -> list[str]:
    """The entries of ``names`` that ``of`` lacks, in order."""
    known = set(of)
    return [n for n in names if n not in known]


def input_stamps(paths: Sequence[str], storage_options: StorageOptions | None = None) -> dict[str, Stamp]:
    """What tells whether each input changed, without reading it: a file's size and modification time (ns), an
    object's size and ETag (or version or time where a store has none), from one fresh listing per prefix. A
    replacement of the same size and time (``cp -p``) goes unnoticed. Keyed by location as stored (URLs without query
    string or user info). An input that cannot be asked about (gone, a refused connection) gets an empty stamp: its
    scan records it failed with the reason."""
    options, listed, stamps = dict(storage_options or {}), {}, {}
    for parent in {p.rsplit("/", 1)[0] for p in paths if is_url(p)}:
        fs, root = fsspec.core.url_to_fs(parent, **options)
        fs.invalidate_cache(root)  # not what an earlier listing in this process saw
        with contextlib.suppress(Exception):  # cannot list (HTTP: its own error types)? info() asks, and raises
            listed.update({fs.unstrip_protocol(e["name"]): e for e in fs.ls(root, detail=True)})
    for path in paths:
        if is_url(path):
            fs, root = fsspec.core.url_to_fs(path, **options)
            try:
                info = listed.get(path) or fs.info(root)
            except OSError:  # not found, refused, forbidden: one slide its scan records failed, not the whole build
                stamps[public_location(path)] = {"size": 0, "tag": ""}
                continue
            tag = next(filter(None, map(info.get, _TAGS)), "")
            stamps[public_location(path)] = {"size": int(info.get("size") or 0), "tag": str(tag)}
        else:
            try:
                st = os.stat(path)
            except FileNotFoundError:  # a dangling symlink: its scan records it failed
                stamps[path] = {"size": 0, "mtime_ns": 0}
                continue
            stamps[path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    return stamps
