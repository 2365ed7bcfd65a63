"""Where shards and manifests live: local paths and fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...).

Remote reads go through :mod:`wsishard.remote`: large ranged reads with read-ahead, transient errors retried
with backoff (at open time and mid-stream), failures as ``OSError`` with one-line messages, credentials never in
reprs, logs or errors. Credentials and endpoints come from the ecosystem's own sources (botocore's environment
variables and config files, ``AWS_ENDPOINT_URL``) plus explicit ``storage_options``.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any, cast

import fsspec
import fsspec.core

from wsishard.errors import ManifestError
from wsishard.format import MANIFEST_NAME, Manifest
from wsishard.remote import RetryPolicy, call_with_retries, describe, open_remote, redact, redacted_options

__all__ = [
    "RetryPolicy",
    "StorageOptions",
    "StreamOpener",
    "is_url",
    "join",
    "list_names",
    "load_manifest",
    "local_path",
    "manifest_location",
    "read_bytes",
    "redact",
    "register_gopen_schemes",
]

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_MiB = 2**20

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


@dataclass(frozen=True)
class StreamOpener:
    """Opens a shard for one sequential read: local paths with ``open``, URLs with :func:`wsishard.remote.open_remote`.

    Picklable (DataLoader workers receive it) and pluggable: any callable ``location -> binary file``
    can take its place in :func:`wsishard.stream.stream`. The caller closes the returned file. Errors are
    ``OSError``s as :mod:`wsishard.remote` describes; the repr shows no credential.

    Args:
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ..., "anon": True}``).
        block_size: bytes per ranged request.
        prefetch: blocks fetched ahead in a background thread (0: fetch in the reading thread).
        retry: how transient errors are retried.
    """

    storage_options: Mapping[str, Any] = field(default_factory=dict)
    block_size: int = 8 * _MiB
    prefetch: int = 2
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.prefetch < 0:
            raise ValueError(f"block_size must be >= 1 and prefetch >= 0, got {self.block_size}, {self.prefetch}")

    def __repr__(self) -> str:
        return (f"StreamOpener(storage_options={redacted_options(self.storage_options)!r}, "
                f"block_size={self.block_size}, prefetch={self.prefetch}, retry={self.retry!r})")  # fmt: skip

    def __call__(self, location: str) -> IO[bytes]:
        if not is_url(location):
            return open(local_path(location), "rb")  # the caller closes it
        reader = open_remote(location, self.storage_options, block_size=self.block_size, prefetch=self.prefetch,
                             retry=self.retry)  # fmt: skip
        return cast(IO[bytes], reader)


# ---- small files, listings, manifests ------------------------------------------------------------------


def read_bytes(location: str, storage_options: StorageOptions | None = None) -> bytes:
    """The whole content of a (small) file or object; URLs with retries as :class:`StreamOpener` does."""
    if not is_url(location):
        with open(local_path(location), "rb") as fh:
            return fh.read()
    with StreamOpener(dict(storage_options or {}), prefetch=0)(location) as fh:
        return fh.read()


def list_names(folder: str, storage_options: StorageOptions | None = None) -> list[str]:
    """Names of the files directly in a folder or under a URL prefix, sorted (listings are not cached).

    Raises:
        OSError: the folder cannot be listed (HTTP servers list only where they serve an index page).
    """
    if not is_url(folder):
        path = local_path(folder)
        return sorted(n for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
    options = dict(storage_options or {})
    fs, path = fsspec.core.url_to_fs(folder, **options)

    def listing() -> list[str]:
        fs.invalidate_cache(path)
        entries = fs.ls(path, detail=True)
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") != "directory")

    return call_with_retries(listing, f"{folder} (listing)", policy=RetryPolicy(), storage_options=options)


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
    where = redact(url, storage_options)
    try:
        text = read_bytes(url, storage_options).decode("utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(where, "not found (is this a wsishard build output?)") from exc
    except OSError as exc:
        raise ManifestError(where, f"cannot be read ({describe(exc, storage_options)})") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(where, "not UTF-8 text") from exc
    return Manifest.from_json(text, where), root


def _gopen_fsspec(
    url: str, mode: str = "rb", bufsize: int = 8192, *, storage_options: StorageOptions, **kw: Any
) -> IO[bytes]:
    if mode == "rb":
        return StreamOpener(storage_options)(url)
    stream: IO[bytes] = fsspec.open(url, mode, **dict(storage_options)).open()
    return stream


def register_gopen_schemes(
    schemes: Iterable[str] = ("s3", "gs", "gcs", "az", "abfs"), storage_options: StorageOptions | None = None
) -> None:
    """Let plain webdataset pipelines (``wds.WebDataset("s3://...")``) open ``schemes`` through fsspec.

    Reads go through :class:`StreamOpener` (large blocks, read-ahead, retries). ``wds.gopen_schemes`` is per
    process: call this in every DataLoader worker (e.g. from ``worker_init_fn``). wsishard's own
    :func:`wsishard.stream.stream` does not need it: it opens shards with :class:`StreamOpener`.
    """
    import webdataset as wds

    opener = functools.partial(_gopen_fsspec, storage_options=dict(storage_options or {}))
    for scheme in schemes:
        wds.gopen_schemes[scheme] = opener
