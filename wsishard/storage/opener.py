"""Reading shards, manifests and listings from local paths and fsspec URLs.

Remote objects are read by :func:`open_remote`: it asks for the object's size once, then fetches ``block_size``
byte ranges one after another in a background thread that stays ``prefetch`` blocks ahead of the reader, so a
DataLoader worker decodes while the next block is in flight; :meth:`StreamOpener.ahead` opens the next shard
(its size asked for, its first blocks fetched) while the current one is read: a shard's start waits for no request.
Transient failures are retried as :mod:`wsishard.storage.retry` says, at open time and mid-stream (the failed block
is fetched again from the same offset); errors are one-line ``OSError``s without credentials
(:mod:`wsishard.storage.secrets`). Credentials and endpoints come from the ecosystem's own sources (botocore's
environment variables and config files, ``AWS_ENDPOINT_URL``) plus explicit ``storage_options``.
"""

from __future__ import annotations

import dataclasses
import functools
import http.client
import io
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar, cast

import fsspec.asyn
import fsspec.core

from wsishard.errors import ManifestError
from wsishard.manifest import Manifest, parse_slide_lines
from wsishard.storage.holders import running_builds
from wsishard.storage.retry import RetryPolicy, call_with_retries, is_past_end
from wsishard.storage.secrets import describe, redact, redacted_options, refuse_url_credentials
from wsishard.storage.urls import StorageOptions, is_url, join, local_path, manifest_location

_MiB = 2**20
T = TypeVar("T")

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


# ---- remote reading ------------------------------------------------------------------------------------


class _RemoteObject:
    """One object on an fsspec filesystem, fetched by byte ranges with retries."""

    def __init__(self, url: str, options: StorageOptions, policy: RetryPolicy, stop: threading.Event) -> None:
        self.url, self.options, self.policy, self.stop = url, options, policy, stop
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url, **dict(options))
        except (ImportError, TypeError, ValueError) as exc:  # unknown protocol, bad option
            raise OSError(f"cannot use {redact(url, options)}: {describe(exc, options)}") from None
        self.size: int | None = self._retrying(self._info_size, 0)

    def _retrying(self, call: Callable[[], T], offset: int) -> T:
        return call_with_retries(
            call, f"{self.url} at byte {offset}", policy=self.policy, storage_options=self.options, stop=self.stop
        )

    def _info_size(self) -> int | None:
        self.fs.invalidate_cache(self.path)  # ask the server, not a listing cached before a change
        info = self.fs.info(self.path)
        if info.get("type") == "directory":
            raise IsADirectoryError(f"{self.path} is a folder")
        return int(info["size"]) if info.get("size") is not None else None

    def fetch(self, start: int, length: int) -> bytes:
        """Up to ``length`` bytes from ``start`` (more when the server ignores ranges; b"" past the end)."""
        return self._retrying(functools.partial(self._range, start, length), start)

    def _range(self, start: int, length: int) -> bytes:
        try:
            data: bytes = self.fs.cat_file(self.path, start=start, end=start + length)
        except Exception as exc:
            if start > 0 and is_past_end(exc):
                return b""
            raise
        if len(data) > length:  # the server ignored the Range header and sent the whole object
            data = data[start:]
        if self.size is not None and len(data) < min(length, self.size - start):
            raise http.client.IncompleteRead(data[:0], min(length, self.size - start) - len(data))
        return data


def _blocks(remote: _RemoteObject, block_size: int) -> Iterator[bytes]:
    """The object's bytes in blocks, in order (sizes unknown to the server end at the first short block)."""
    pos, size = 0, remote.size
    while size is None or pos < size:
        want = block_size if size is None else min(block_size, size - pos)
        block = remote.fetch(pos, want)
        if not block:
            return
        yield block
        pos += len(block)
        if size is None and len(block) < want:
            return


class _Blocks:
    """An object's blocks in order: fetched when asked for (``depth`` 0), or by a daemon thread that stays
    ``depth`` blocks ahead. The end, or an error, is sticky: every later :meth:`get` gives it again."""

    _END = object()

    def __init__(self, blocks: Iterator[bytes], depth: int, stop: threading.Event) -> None:
        self._blocks, self._stop = blocks, stop
        self._last: Any = None  # the end marker or the error, once met
        self._queue: queue.Queue[Any] | None = None
        if depth > 0:
            self._queue = queue.Queue(maxsize=depth)
            # the thread holds this object, not the reader: a reader dropped unclosed is still collected
            threading.Thread(target=self._run, name="wsishard-prefetch", daemon=True).start()

    def _run(self) -> None:
        while self._put(item := self._take_here()) and isinstance(item, bytes):
            pass

    def _take_here(self) -> Any:
        try:
            return next(self._blocks, self._END)
        except BaseException as exc:  # handed over to the reading thread, raised there
            return exc

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                cast("queue.Queue[Any]", self._queue).put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def get(self) -> bytes:
        """The next block; b"" at the end. Raises what fetching raised."""
        if self._last is None:
            item = self._queue.get() if self._queue is not None else self._take_here()
            if isinstance(item, bytes):
                return item
            self._last = item
        if isinstance(self._last, BaseException):
            raise self._last
        return b""


class RemoteReader(io.RawIOBase):
    """A forward-only binary file over a remote object: large ranged reads, read-ahead, retries.

    Made by :class:`StreamOpener`; not seekable. ``read(n)`` returns ``n`` bytes unless the object ends.
    """

    def __init__(self, remote: _RemoteObject, block_size: int, prefetch: int) -> None:
        super().__init__()
        self.name = redact(remote.url, remote.options)
        self._stop = remote.stop
        blocks = _blocks(remote, block_size)
        self._next = _Blocks(blocks, prefetch, self._stop).get
        self._buf = memoryview(b"")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _fill(self) -> bool:
        if not self._buf:
            self._buf = memoryview(self._next())
        return bool(self._buf)

    def readinto(self, buffer: Any) -> int:
        self._checkClosed()
        if not self._fill():
            return 0
        n = min(len(buffer), len(self._buf))
        buffer[:n] = self._buf[:n]
        self._buf, self._pos = self._buf[n:], self._pos + n
        return n

    def read(self, size: int | None = -1) -> bytes:
        self._checkClosed()
        parts: list[bytes] = []
        want = -1 if size is None or size < 0 else size
        while want != 0 and self._fill():
            n = len(self._buf) if want < 0 else min(want, len(self._buf))
            parts.append(bytes(self._buf[:n]))
            self._buf, self._pos = self._buf[n:], self._pos + n
            want = want if want < 0 else want - n
        return b"".join(parts)

    def readall(self) -> bytes:
        return self.read(-1)

    def close(self) -> None:
        self._stop.set()  # ends the prefetch thread and any backoff wait
        self._buf = memoryview(b"")
        super().close()


def open_remote(
    url: str,
    storage_options: StorageOptions | None = None,
    *,
    block_size: int = 8 * 2**20,
    prefetch: int = 2,
    retry: RetryPolicy | None = None,
) -> RemoteReader:
    """Open ``url`` for one sequential read (the size is asked for now, with retries).

    Args:
        storage_options: fsspec options (endpoint, credentials...).
        block_size: bytes per ranged request.
        prefetch: blocks fetched ahead in a background thread (0: fetch in the reading thread).
        retry: how transient errors are retried (default :class:`RetryPolicy`).

    Raises:
        FileNotFoundError, PermissionError, ConnectionError, OSError: as the module docstring says.
    """
    remote = _RemoteObject(url, dict(storage_options or {}), retry or RetryPolicy(), threading.Event())
    return RemoteReader(remote, block_size, prefetch)
