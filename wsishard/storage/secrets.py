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

from wsishard.errors import OptionError
from wsishard.storage.urls import StorageOptions, is_url

_SECRET_NAME = re.compile(r"secret|token|passw|key|credential|auth|signature|session|sas", re.IGNORECASE)
# user info after a scheme; a password may hold "/" (AWS secrets do), a port (":8080/") is not a password
_USERINFO = re.compile(r"(?<=://)(?:[^/@\s'\"]*:(?!\d*(?:/|$))[^@\s'\"]*|[^/@\s'\"]+)@")
# ``KEY:SECRET@bucket`` without its scheme, as botocore quotes a bucket name ("Invalid bucket name ..."); not a
# scheme's "://"
_BARE_USERINFO = re.compile(r"(?<![\w./:%+~*-])[\w.%+~-]+:(?!//)[^\s@'\"]+@(?=[\w.-])")
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
    """``text`` without credentials: option secrets, AWS secrets from the environment, URL user info (also
    without its scheme: ``KEY:SECRET@bucket``) and signed-URL query parameters become ``***``."""
    env = [os.environ.get(name, "") for name in _SECRET_ENV]  # real ones are 40+ characters; "testing" is not
    for value in sorted({*_secret_values(storage_options), *(v for v in env if len(v) >= 16)}, key=len, reverse=True):
        text = text.replace(value, "***")
    return _SIGNED_QUERY.sub(r"\1***", _BARE_USERINFO.sub("***@", _USERINFO.sub("***@", text)))


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


def refuse_url_credentials(location: str) -> None:
    """Refuse credentials written into an object-storage URL (``s3://KEY:SECRET@bucket/...``): fsspec would take
    them for a bucket name and show them in its errors. HTTP(S) user info is basic authentication and allowed
    (never stored: :func:`~wsishard.storage.urls.public_location`).

    Raises:
        OptionError: ``location`` has user info and is not ``http(s)://``; the message shows it redacted.
    """
    if not is_url(location) or location.lower().startswith(("http://", "https://")):
        return
    if _USERINFO.match(location, location.index("://") + 3):
        raise OptionError(
            f"{redact(location)}: credentials in an {location.split(':', 1)[0]}:// URL are not read "
            "(nor shown): give them as --storage-option key=... secret=... (storage_options in Python) "
            "or through the standard AWS sources"
        )
