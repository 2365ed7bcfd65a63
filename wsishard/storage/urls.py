"""Locations: local paths (plain or ``file://``) and fsspec URLs (``s3://``, ``gs://``, ``http(s)://``, ...).

The one place that tells a URL from a local path and joins names onto either.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from wsishard.format import MANIFEST_NAME

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")

StorageOptions = Mapping[str, Any]  # fsspec options for URLs (endpoint, credentials...); never logged or stored


def is_url(location: str) -> bool:
    """True for ``scheme://...`` locations other than ``file://``."""
    return bool(_SCHEME.match(location)) and not location.startswith("file://")


def public_location(location: str) -> str:
    """``location`` as a build may store or show it: a URL without user info, query string or fragment (a presigned
    URL's signature, a basic-auth password); a local path as it is."""
    if not is_url(location):
        return location
    parts = urlsplit(location)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


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
