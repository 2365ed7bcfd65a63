"""Credentials never appear in reprs, log records or error messages.

:func:`redact` removes option values under secret-looking names, AWS secrets from the environment, URL user info
and signed-URL query parameters; :func:`clean_cause` says whether an original error may be chained to the one
raised in its place (not when any link of its chain holds a secret).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from wsishard.storage.urls import StorageOptions

_SECRET_NAME = re.compile(r"secret|token|passw|key|credential|auth|signature|session|sas", re.IGNORECASE)
_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SIGNED_QUERY = re.compile(
    r"(?i)([?&](?:x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential"
    r"|signature|sig|token|access_token|key)=)[^&\s'\"]+"
)
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")


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


def exception_chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its ``__cause__``/``__context__`` links, outermost first (each once)."""
    out: list[BaseException] = []
    link: BaseException | None = exc
    while link is not None and link not in out:
        out.append(link)
        link = link.__cause__ or (None if link.__suppress_context__ else link.__context__)
    return out


def clean_cause(exc: BaseException, storage_options: StorageOptions | None) -> BaseException | None:
    """``exc`` to chain to a re-raised error, or None when some link's text holds a credential."""
    clean = all(redact(str(link), storage_options) == str(link) for link in exception_chain(exc))
    return exc if clean else None
