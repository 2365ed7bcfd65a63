"""Remote objects read by byte ranges for one sequential pass: :func:`open_remote` asks for the object's size once
(while its first block is already on its way: one round trip to the first byte, not two) and fetches ``block_size``
ranges one after another in a background thread that stays ``prefetch`` blocks ahead of the reader, so a
DataLoader worker decodes while the next block is in flight. Transient failures are retried as
:mod:`wsishard.storage.retry` says, at open time and mid-stream (the failed block is fetched again from the same
offset); errors are one-line ``OSError``s without credentials (:mod:`wsishard.storage.secrets`).
:class:`~wsishard.storage.opener.StreamOpener` opens shards with it.
"""

from __future__ import annotations

import functools
import http.client
import io
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, cast

import fsspec.core

from wsishard.storage.retry import RetryPolicy, call_with_retries, is_past_end
from wsishard.storage.secrets import describe, redact
from wsishard.storage.urls import StorageOptions

T = TypeVar("T")


class _RemoteObject:
    """One object on an fsspec filesystem, fetched by byte ranges with retries."""

    def __init__(self, url: str, options: StorageOptions, policy: RetryPolicy, stop: threading.Event) -> None:
        self.url, self.options, self.policy, self.stop = url, options, policy, stop
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url, **dict(options))
        except (ImportError, TypeError, ValueError) as exc:  # unknown protocol, bad option
            raise OSError(f"cannot use {redact(url, options)}: {describe(exc, options)}") from None
        self.size: int | None = None  # known once :meth:`ask_size` has answered
        self.sized = threading.Event()  # set when it has (or failed)

    def ask_size(self) -> None:
        """Ask for the object's size (with retries): run while its first block is already on its way."""
        try:
            self.size = self._retrying(self._info_size, 0)
        finally:
            self.sized.set()

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
            if is_past_end(exc):  # at 0: an empty object, its first block asked for before its size was known
                return b""
            raise
        if len(data) > length:  # the server ignored the Range header and sent the whole object
            data = data[start:]
        if self.size is not None and len(data) < min(length, self.size - start):
            raise http.client.IncompleteRead(data[:0], min(length, self.size - start) - len(data))
        return data


def _blocks(remote: _RemoteObject, block_size: int) -> Iterator[bytes]:
    """The object's bytes in blocks, in order (sizes unknown to the server end at the first short block). The first
    is asked for at once, beside the size (one round trip to a shard's first byte, not two), and checked after."""
    known_empty = remote.sized.is_set() and remote.size == 0  # (no prefetch thread: the size came first)
    block = b"" if known_empty else remote.fetch(0, block_size)
    remote.sized.wait()
    size = remote.size
    if size is not None and len(block) < min(block_size, size):  # cut short, unseen without the size: again
        block = remote.fetch(0, block_size)
    if not block:
        return
    yield block
    pos = len(block)
    if size is None and len(block) < block_size:
        return
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
    if prefetch == 0:  # fetched in the reading thread: nothing runs beside the size's request
        remote.ask_size()
        return RemoteReader(remote, block_size, prefetch)
    reader = RemoteReader(remote, block_size, prefetch)  # its first block asked for now, while the size is
    try:
        remote.ask_size()
    except BaseException:
        reader.close()
        raise
    return reader
