"""Reading shards, manifests and listings from local paths and fsspec URLs.

Remote objects are read by :func:`~wsishard.storage.remote.open_remote` (large ranged reads fetched ahead, retries),
so a DataLoader worker decodes while the next block is in flight; :meth:`StreamOpener.ahead` opens the next shard
(its size asked for, its first blocks fetched) while the current one is read: a shard's start waits for no request.
Transient failures are retried as :mod:`wsishard.storage.retry` says, at open time and mid-stream (the failed block
is fetched again from the same offset); errors are one-line ``OSError``s without credentials
(:mod:`wsishard.storage.secrets`). Credentials and endpoints come from the ecosystem's own sources (botocore's
environment variables and config files, ``AWS_ENDPOINT_URL``) plus explicit ``storage_options``.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, cast

import fsspec.asyn
import fsspec.core

from wsishard.errors import ManifestError
from wsishard.manifest import Manifest, parse_slide_lines
from wsishard.storage.holders import running_builds
from wsishard.storage.remote import RemoteReader, open_remote
from wsishard.storage.retry import RetryPolicy, call_with_retries
from wsishard.storage.secrets import describe, redact, redacted_options, refuse_url_credentials
from wsishard.storage.urls import StorageOptions, is_url, join, local_path, manifest_location

_MiB = 2**20

if hasattr(os, "register_at_fork"):
    # A forked process (a DataLoader worker) inherits fsspec's I/O event loop without the thread that runs it: the
    # main process started it reading the manifest. fsspec >= 2025.3.2 resets it in the child itself; older ones
    # (s3fs >= 2023.6 allows them) hang for ever in the worker's first request, or run clean-up tasks on the wrong
    # loop ("Task exception was never retrieved ... attached to a different loop"). Resetting twice is harmless.
    os.register_at_fork(after_in_child=fsspec.asyn.reset_lock)


@dataclass(frozen=True)
class StreamOpener:
    """Opens a shard for one sequential read: local paths with ``open``, URLs with :func:`open_remote`.

    Picklable (DataLoader workers receive it) and pluggable: any callable ``location -> binary file``
    can take its place in :func:`wsishard.stream`. The caller closes the returned file. Errors are
    ``OSError``s as this module describes; the repr shows no credential.

    Args:
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ..., "anon": True}``).
        block_size: bytes per ranged request.
        prefetch: blocks fetched ahead in a background thread (0: fetch in the reading thread).
        retry: how transient errors are retried.
    """

    storage_options: StorageOptions = field(default_factory=dict)
    block_size: int = 8 * _MiB
    prefetch: int = 2
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.prefetch < 0:
            raise ValueError(f"block_size must be >= 1 and prefetch >= 0, got {self.block_size}, {self.prefetch}")

    def __repr__(self) -> str:
        return (
            f"StreamOpener(storage_options={redacted_options(self.storage_options)!r}, "
            f"block_size={self.block_size}, prefetch={self.prefetch}, retry={self.retry!r})"
        )

    def __call__(self, location: str) -> IO[bytes]:
        if not is_url(location):
            return open(local_path(location), "rb")  # the caller closes it
        key = (os.getpid(), id(self))
        opened = _AHEAD.get(key)
        if opened is not None and opened[0] == location:
            del _AHEAD[key]
            return cast(IO[bytes], opened[1].result())  # its errors are raised here, as open_remote's
        return cast(IO[bytes], self._open(location))

    def _open(self, location: str) -> RemoteReader:
        return open_remote(
            location, self.storage_options, block_size=self.block_size, prefetch=self.prefetch, retry=self.retry
        )

    def ahead(self, location: str) -> None:
        """Start opening ``location`` (a URL; nothing for a local path, nor with ``prefetch`` 0) in the background:
        the next call for it returns that reader, its size known and its first blocks fetched or on their way. One
        shard at a time per opener and process: a shard opened ahead and not read next is closed. Memory: one more
        reader's ``prefetch`` blocks."""
        if not is_url(location) or self.prefetch == 0:
            return
        key = (os.getpid(), id(self))  # a forked worker never takes its parent's (its thread is not there)
        stale = _AHEAD.pop(key, None)
        if stale is not None:
            stale[1].add_done_callback(_close_opened)
        future: Future[RemoteReader] = Future()

        def run() -> None:
            try:
                future.set_result(self._open(location))
            except BaseException as exc:  # raised in the reading thread when it asks for this shard
                future.set_exception(exc)

        threading.Thread(target=run, name="wsishard-open-ahead", daemon=True).start()
        _AHEAD[key] = (location, future)


_AHEAD: dict[tuple[int, int], tuple[str, Future[RemoteReader]]] = {}  # (pid, opener): the shard it opened ahead


def _close_opened(future: Future[RemoteReader]) -> None:
    if future.exception() is None:
        future.result().close()


# ---- small files, listings, manifests ------------------------------------------------------------------


def read_bytes(location: str, storage_options: StorageOptions | None = None) -> bytes:
    """The whole content of a (small) file or object; URLs with retries as :class:`StreamOpener` does."""
    if not is_url(location):
        with open(local_path(location), "rb") as fh:
            return fh.read()
    with StreamOpener(dict(storage_options or {}), prefetch=0)(location) as fh:
        return fh.read()


def list_names(folder: str, storage_options: StorageOptions | None = None, *, files_only: bool = True) -> list[str]:
    """Names directly in a folder or under a URL prefix, sorted (listings are not cached).

    Args:
        files_only: leave out folders (and prefixes that hold objects).

    Raises:
        FileNotFoundError: no such folder (locally).
        OSError: the folder cannot be listed (HTTP servers list only where they serve an index page).
    """
    if not is_url(folder):
        path = local_path(folder)
        return sorted(n for n in os.listdir(path) if not files_only or os.path.isfile(os.path.join(path, n)))
    options = dict(storage_options or {})
    fs, path = fsspec.core.url_to_fs(folder, **options)

    def listing() -> list[str]:
        fs.invalidate_cache(path)  # other processes (workers, other parts) write here too
        entries = fs.ls(path, detail=True)
        kept = (e for e in entries if not files_only or e.get("type") != "directory")
        return sorted(str(e["name"]).rstrip("/").rsplit("/", 1)[-1] for e in kept)

    return call_with_retries(listing, f"{folder} (listing)", policy=RetryPolicy(), storage_options=options)


def load_manifest(
    source: str, storage_options: StorageOptions | None = None, *, slides: bool = True
) -> tuple[Manifest, str]:
    """Read the manifest of a build output.

    Args:
        source: output folder, path of a ``manifest.json``, or URL prefix / manifest URL.
        storage_options: fsspec options for URLs (e.g. ``{"endpoint_url": ...}``).
        slides: also read the slide records file beside the manifest (``slides.jsonl``); False reads the options,
            totals and shard index alone (all a stream needs at start-up), and ``manifest.slides`` is then empty
            for a version-2 output.

    Returns:
        ``(manifest, root)`` where shard ``name``s are relative to ``root``.

    Raises:
        ManifestError: no manifest (or slide records file) there, or not a readable wsishard manifest.
        OptionError: credentials written into an object-storage URL (``s3://KEY:SECRET@bucket``).
    """
    refuse_url_credentials(source)
    url, root = manifest_location(source)
    try:
        text = _read_text(url, storage_options)
    except ManifestError as exc:
        running = running_builds(root, storage_options) if isinstance(exc.__cause__, FileNotFoundError) else []
        if running:
            reason = f"not written yet: {' and '.join(running)} is still writing this output; wait for it to end"
            raise ManifestError(exc.location, reason) from exc
        raise
    manifest = Manifest.from_json(text, redact(url, storage_options))
    if slides and manifest.slides_file:
        where = join(root, manifest.slides_file)
        records = parse_slide_lines(_read_text(where, storage_options), redact(where, storage_options))
        manifest = dataclasses.replace(manifest, slides=records)
    return manifest, root


def _read_text(url: str, storage_options: StorageOptions | None) -> str:
    where = redact(url, storage_options)
    try:
        return read_bytes(url, storage_options).decode("utf-8")
    except FileNotFoundError as exc:
        raise ManifestError(where, "not found (is this a wsishard build output?)") from exc
    except OSError as exc:
        raise ManifestError(where, f"cannot be read ({describe(exc, storage_options)})") from exc
    except UnicodeDecodeError as exc:
        raise ManifestError(where, "not UTF-8 text") from exc
