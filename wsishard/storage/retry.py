"""Transient storage errors retried with backoff; everything else turned into a one-line ``OSError``.

Transient failures (connection resets, timeouts, HTTP 408/429/5xx, S3 ``SlowDown``/``InternalError``) are
retried with exponential backoff (:class:`RetryPolicy`). Missing objects (404, ``NoSuchKey``) and refused access
(403) are not retried. Whatever fails reaches the caller as an ``OSError`` (``FileNotFoundError``,
``PermissionError``, ``ConnectionError`` once retries are spent) with a one-line message and no credential.
"""

from __future__ import annotations

import asyncio
import errno
import http.client
import logging
import random
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from wsishard.storage.secrets import clean_cause, describe, exception_chain, redact
from wsishard.storage.urls import StorageOptions

logger = logging.getLogger(__name__)

_TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "InternalError",
        "ServiceUnavailable",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "PriorRequestNotComplete",
    }
)
_TRANSIENT_ERRNO = frozenset(
    getattr(errno, name)
    for name in (
        "ECONNRESET",
        "ECONNABORTED",
        "ECONNREFUSED",
        "ENETRESET",
        "ENETUNREACH",
        "EHOSTUNREACH",
        "ETIMEDOUT",
        "EPIPE",
        "EAGAIN",
        "EBUSY",
        "EREMOTEIO",
    )
    if hasattr(errno, name)
)

T = TypeVar("T")


def is_transient(exc: BaseException) -> bool:
    """True when retrying could help: network failures, timeouts, throttling, server errors (5xx).

    The innermost exception of the ``__cause__``/``__context__`` chain with a verdict decides, so a
    ``FileNotFoundError`` that fsspec raised for a 503 is transient and one raised for a 404 is not.
    """
    return _deciding(exc)[1]


def _deciding(exc: BaseException) -> tuple[BaseException, bool]:
    """The innermost link of ``exc``'s chain with a verdict, and that verdict (``exc, False`` when none has)."""
    for link in reversed(exception_chain(exc)):
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


def is_past_end(exc: BaseException) -> bool:
    """A "range not satisfiable" answer (HTTP 416, S3 ``InvalidRange``): the read started past the end."""
    return any(status == 416 or code == "InvalidRange" for status, code in map(_status_and_code, exception_chain(exc)))


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
                raise error from clean_cause(exc, storage_options)
            delay = policy.delay_s(tries)
            text = describe(_deciding(exc)[0], storage_options)
            logger.info("%s: %s; retrying in %.2f s (attempt %d of %d)", what, text, delay, tries + 1, policy.attempts)
            if stop is not None and stop.wait(delay):
                raise ConnectionError(f"{what}: closed while retrying ({text})") from None
            if stop is None:
                time.sleep(delay)


def _give_up(
    exc: Exception, what: str, tries: int, policy: RetryPolicy, storage_options: StorageOptions | None
) -> OSError | None:
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
