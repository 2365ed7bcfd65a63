"""Where shards and manifests live: local paths and fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...).

Credentials and endpoints come from the ecosystem's own sources (botocore's environment variables and config
files, ``AWS_ENDPOINT_URL``) plus explicit ``storage_options``; nothing here logs them.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

import fsspec

from wsishard.errors import ManifestError
from wsishard.format import MANIFEST_NAME, Manifest

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

StorageOptions = Mapping[str, Any]


def is_url(location: str) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    return bool(_SCHEME.match(location)) and not location.startswith("file://")


def local_path(location: str) -> str:
    """A local path for a local location (``file://`` stripped)."""
    return location[len("file://") :] if location.startswith("file://") else location


def join(base: str, name: str) -> str:
    """``base`` + ``/`` + ``name`` for paths and URLs alike."""
    if is_url(base):
        return base.rstrip("/") + "/" + name
    return os.path.join(local_path(base), name)


def manifest_location(source: str) -> tuple[str, str]:
    """Split a build output given as a folder, a manifest path or a URL prefix.

    Returns:
        ``(manifest_url, root)``: where ``manifest.json`` is and the root that shard names are relative to.
    """
    src = source.rstrip("/") if source not in ("/", "") else source
    if src.endswith(".json"):
        root = src.rsplit("/", 1)[0] if "/" in src else "."
        return src, root
    return join(src, MANIFEST_NAME), src


def read_bytes(location: str, storage_options: StorageOptions | None = None) -> bytes:
    """The whole content of a (small) file or object."""
    if not is_url(location):
        with open(local_path(location), "rb") as fh:
            return fh.read()
    with fsspec.open(location, "rb", **dict(storage_options or {})) as fh:
        data: bytes = fh.read()
        return data


def load_manifest(source: str, storage_options: StorageOptions | None = None) -> tuple[Manifest, str]:
    """Read the manifest of a build output.

    Args:
        source: output folder, path of a ``manifest.json``, or URL prefix / manifest URL.
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ...}``).

    Returns:
        ``(manifest, root)`` where shard ``name``s are relative to ``root``.

    Raises:
        ManifestError: no manifest there, or not a readable wsishard manifest.
    """
    url, root = manifest_location(source)
    try:
        text = read_bytes(url, storage_options).decode("utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(url, "not found (is this a wsishard build output?)") from exc
    except OSError as exc:
        raise ManifestError(url, f"cannot be read ({type(exc).__name__}: {exc})") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(url, "not UTF-8 text") from exc
    return Manifest.from_json(text, url), root


@dataclass(frozen=True)
class StreamOpener:
    """Opens a shard for one sequential read: local paths with ``open``, URLs through fsspec.

    Picklable (DataLoader workers receive it) and pluggable: any callable ``location -> binary file``
    can take its place in :func:`wsishard.stream.stream`. The caller closes the returned file.

    Args:
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ..., "anon": True}``).
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, location: str) -> IO[bytes]:
        if not is_url(location):
            return open(local_path(location), "rb")  # the caller closes it
        stream: IO[bytes] = fsspec.open(location, "rb", **dict(self.storage_options)).open()
        return stream


def _gopen_fsspec(
    url: str, mode: str = "rb", bufsize: int = 8192, *, storage_options: StorageOptions, **kw: Any
) -> IO[bytes]:
    stream: IO[bytes] = fsspec.open(url, mode, **dict(storage_options)).open()
    return stream


def register_gopen_schemes(
    schemes: Iterable[str] = ("s3", "gs", "gcs", "az", "abfs"), storage_options: StorageOptions | None = None
) -> None:
    """Let plain webdataset pipelines (``wds.WebDataset("s3://...")``) open ``schemes`` through fsspec.

    ``wds.gopen_schemes`` is per process: call this in every DataLoader worker (e.g. from
    ``worker_init_fn``). wsishard's own :func:`wsishard.stream.stream` does not need it: it opens shards
    with :class:`StreamOpener`.
    """
    import webdataset as wds

    opener = functools.partial(_gopen_fsspec, storage_options=dict(storage_options or {}))
    for scheme in schemes:
        wds.gopen_schemes[scheme] = opener
