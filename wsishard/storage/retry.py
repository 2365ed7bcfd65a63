"""Reading remote objects (any fsspec URL): large ranged reads with read-ahead, retries, no leaked secrets.

:func:`open_remote` asks for the object's size once, then fetches ``block_size`` byte ranges one after another
in a background thread that stays ``prefetch`` blocks ahead of the reader, so a DataLoader worker decodes while
the next block is in flight.

Transient failures (connection resets, timeouts, HTTP 408/429/5xx, S3 ``SlowDown``/``InternalError``) are
retried with exponential backoff (:class:`RetryPolicy`), at open time and mid-stream, where the failed block is
fetched again from the same offset. Missing objects (404, ``NoSuchKey``) and refused access (403) are not
retried. Whatever fails reaches the caller as an ``OSError`` (``FileNotFoundError``, ``PermissionError``,
``ConnectionError`` once retries are spent) with a one-line message.

Credentials never appear in reprs, log records or error messages: :func:`redact` removes option values under
secret-looking names, AWS secrets from the environment, URL user info and signed-URL query parameters; an error
whose original text held a secret is raised without that original chained to it.
"""

from __future__ import annotations

import asyncio
import errno
import functools
import http.client
import io
import logging
import os
import queue
import random
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import fsspec.core

logger = logging.getLogger(__name__)

_SECRET_NAME = re.compile(r"secret|token|passw|key|credential|auth|signature|session|sas", re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SIGNED_QUERY = re.compile(
    r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential"
    r"|signature|sig|token|access_token|key)=)[^&\s'\"]+"
)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_TRANSIENT_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError",
                              "ServiceUnavailable", "RequestLimitExceeded", "TooManyRequestsException",
                              "BandwidthLimitExceeded", "PriorRequestNotComplete"})  # fmt: skip
_TRANSIENT_ERRNO = frozenset(getattr(errno, name) for name in (
    "ECONNRESET", "ECONNABORTED", "ECONNREFUSED", "ENETRESET", "ENETUNREACH", "EHOSTUNREACH", "ETIMEDOUT", "EPIPE",
    "EAGAIN", "EBUSY", "EREMOTEIO") if hasattr(errno, name))  # fmt: skip

StorageOptions = Mapping[str, Any]
T = TypeVar("T")

# ---- secrets -------------------------------------------------------------------------------------------


def redacted_options(options: StorageOptions | None) -> dict[str, Any]:
    """``options`` with every value under a secret-looking name (``secret``, ``key``, ``token``...) as ``***``."""
    return {k: "***" if _SECRET_NAME.search(str(k)) else _redact_value(v) for k, v in (options or {}).items()}


def _redact_value(value: Any) -> Any:
    return redacted_options(value) if isinstance(value, Mapping) else value


def _secret_values(options: Any, secret: bool = False) -> Iterator[str]:
    if isinstance(options, Mapping):
        for k, v in options.items():
            yield from _secret_values(v, secret or bool(_SECRET_NAME.search(str(k))))
    elif isinstance(options, list | tuple):
        for v in options:
            yield from _secret_values(v, secret)
    elif secret and isinstance(options, str) and len(options) >= 4:
        yield options


def redact(text: str, storage_options: StorageOptions | None = None) -> str:
    """``text`` without credentials: option secrets, AWS secrets from the environment, URL user info and
    signed-URL query parameters become ``***``."""
    env = [os.environ.get(name, "") for name in _SECRET_ENV]  # real ones are 40+ characters; "testing" is not
    for value in sorted({*_secret_values(storage_options), *(v for v in env if len(v) >= 16)}, key=len, reverse=True):
        text = text.replace(value, "***")
    return _SIGNED_QUERY.sub(r"\1***", _USERINFO.sub("***@", text))


def describe(exc: BaseException, storage_options: StorageOptions | None = None) -> str:
    """``"<ExceptionType>: <message>"`` with credentials redacted, on one line."""
    return redact(f"{type(exc).__name__}: {exc}".replace("\n", " "), storage_options)


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in out:
        out.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return out


def _clean_cause(exc: BaseException, storage_options: StorageOptions | None) -> BaseException | None:
    """``exc`` to chain to a re-raised error, or None when some link's text holds a credential."""
    clean = all(redact(str(link), storage_options) == str(link) for link in _chain(exc))
    return exc if clean else None


# ---- transient or not ----------------------------------------------------------------------------------


def is_transient(exc: BaseException) -> bool:
    """True when retrying could help: network failures, timeouts, throttling, server errors (5xx).

    The innermost exception of the ``__cause__``/``__context__`` chain with a verdict decides, so a
    ``FileNotFoundError`` that fsspec raised for a 503 is transient and one raised for a 404 is not.
    """
    return _deciding(exc)[1]


def _deciding(exc: BaseException) -> tuple[BaseException, bool]:
    """The innermost link of ``exc``'s chain with a verdict, and that verdict (``exc, False`` when none has)."""
    for link in reversed(_chain(exc)):
        verdict = _verdict(link)
        if verdict is not None:
            return link, verdict
    return exc, False


def _status_and_code(exc: BaseException) -> tuple[int | None, str | None]:
    """The HTTP status and service error code of an aiohttp or botocore error, if it is one."""
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):
        return int(exc.status), None
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping) and "Error" in response:
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return (int(status) if status is not None else None), response["Error"].get("Code")
    return None, None


def _verdict(exc: BaseException) -> bool | None:
    if isinstance(exc, FileNotFoundError | PermissionError | IsADirectoryError | NotADirectoryError):
        return False
    status, code = _status_and_code(exc)
    if status is not None or code is not None:
        return code in _TRANSIENT_CODES or status in _TRANSIENT_STATUS or (status or 0) >= 500
    if isinstance(exc, ConnectionError | TimeoutError | asyncio.TimeoutError | http.client.IncompleteRead):
        return True
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO:
        return True
    aiohttp, botocore = sys.modules.get("aiohttp"), sys.modules.get("botocore.exceptions")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientPayloadError):
        return True
    if botocore is not None and isinstance(exc, botocore.HTTPClientError | botocore.ConnectionError):
        return True
    return None


def _is_past_end(exc: BaseException) -> bool:
    """A "range not satisfiable" answer (HTTP 416, S3 ``InvalidRange``): the read started past the end."""
    return any(status == 416 or code == "InvalidRange" for status, code in map(_status_and_code, _chain(exc)))


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How transient storage errors are retried.

    Attributes:
        attempts: tries in all, the first included (1: never retry).
        backoff_s: seconds before the second try; doubles with each further try (with 50-100 % jitter).
        max_backoff_s: cap on one wait, seconds.
    """

    attempts: int = 5
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError(f"invalid retry policy: {self}")

    def delay_s(self, failed_tries: int) -> float:
        """Seconds to wait after ``failed_tries`` failures in a row."""
        # jitter keeps many workers throttled together from retrying in lockstep; it touches no data
        return min(self.max_backoff_s, self.backoff_s * 2 ** (failed_tries - 1)) * random.uniform(0.5, 1.0)


def call_with_retries(
    call: Callable[[], T],
    what: str,
    *,
    policy: RetryPolicy,
    storage_options: StorageOptions | None = None,
    stop: threading.Event | None = None,
) -> T:
    """``call()``, retried on transient errors as ``policy`` says.

    Args:
        what: the object and offset, for messages (credentials are redacted from it).
        stop: when set, waiting for the next try ends early with an error.

    Raises:
        FileNotFoundError, PermissionError, OSError: a non-transient failure (not retried).
        ConnectionError: transient failures ``policy.attempts`` times in a row.
    """
    what, tries = redact(what, storage_options), 0
    while True:
        tries += 1
        try:
            return call()
        except Exception as exc:  # the storage stack raises many unrelated types; sorted out here
            error = _give_up(exc, what, tries, policy, storage_options)
            if error is not None:
                raise error from _clean_cause(exc, storage_options)
            delay = policy.delay_s(tries)
            text = describe(_deciding(exc)[0], storage_options)
            logger.info("%s: %s; retrying in %.2f s (attempt %d of %d)", what, text, delay, tries + 1,
                        policy.attempts)  # fmt: skip
            if stop is not None and stop.wait(delay):
                raise ConnectionError(f"{what}: closed while retrying ({text})") from None
            if stop is None:
                time.sleep(delay)


def _give_up(exc: Exception, what: str, tries: int, policy: RetryPolicy,
             storage_options: StorageOptions | None) -> OSError | None:  # fmt: skip
    """The error to raise for ``exc`` after ``tries`` tries, or None to try again."""
    link, transient = _deciding(exc)
    text = describe(link, storage_options)
    if transient and tries < policy.attempts:
        return None
    if transient:
        return ConnectionError(f"gave up on {what} after {tries} attempts ({text})")
    if _status_and_code(link)[0] in (401, 403):
        return PermissionError(text)
    for kind in (FileNotFoundError, PermissionError, IsADirectoryError):
        if isinstance(exc, kind):
            return kind(redact(str(exc), storage_options) if link is exc else text)
    return OSError(text)


# ---- remote reading ------------------------------------------------------------------------------------


class _Remote:
    """One object on an fsspec filesystem, fetched by byte ranges with retries."""

    def __init__(self, url: str, options: StorageOptions, policy: RetryPolicy, stop: threading.Event) -> None:
        self.url, self.options, self.policy, self.stop = url, options, policy, stop
        try:
            self.fs, self.path = fsspec.core.url_to_fs(url, **dict(options))
        except (ImportError, TypeError, ValueError) as exc:  # unknown protocol, bad option
            raise OSError(f"cannot use {redact(url, options)}: {describe(exc, options)}") from None
        self.size: int | None = self._retrying(self._info_size, 0)

    def _retrying(self, call: Callable[[], T], offset: int) -> T:
        return call_with_retries(call, f"{self.url} at byte {offset}", policy=self.policy,
                                 storage_options=self.options, stop=self.stop)  # fmt: skip

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
            if start > 0 and _is_past_end(exc):
                return b""
            raise
        if len(data) > length:  # the server ignored the Range header and sent the whole object
            data = data[start:]
        if self.size is not None and len(data) < min(length, self.size - start):
            raise http.client.IncompleteRead(data[:0], min(length, self.size - start) - len(data))
        return data


def _blocks(remote: _Remote, block_size: int) -> Iterator[bytes]:
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

    def __init__(self, remote: _Remote, block_size: int, prefetch: int) -> None:
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
    remote = _Remote(url, dict(storage_options or {}), retry or RetryPolicy(), threading.Event())
    return RemoteReader(remote, block_size, prefetch)
