"""Byte-identical slide files under other names: copies of one slide that a build would build twice."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Sequence

from wsishard.storage.urls import is_url

logger = logging.getLogger(__name__)

_ENDS_BYTES = 1 << 20  # a copy is told by its size and a hash of its first and last MB


def warn_copies(paths: Sequence[str]) -> None:
    """Warn about local files with the same bytes under other names (a copy, not a link: built twice): files of
    one size are compared by a hash of their first and last MB, so only files of equal sizes are read at all."""
    by_size: dict[int, list[str]] = {}
    for path in paths:
        with contextlib.suppress(OSError):
            if not is_url(path):
                by_size.setdefault(os.path.getsize(path), []).append(path)
    for size, same_size in by_size.items():
        by_hash: dict[bytes, list[str]] = {}
        for path in same_size if len(same_size) > 1 and size > 0 else ():
            with contextlib.suppress(OSError), open(path, "rb") as fh:
                digest = hashlib.sha256(fh.read(_ENDS_BYTES))
                fh.seek(max(0, size - _ENDS_BYTES))
                digest.update(fh.read(_ENDS_BYTES))
                by_hash.setdefault(digest.digest(), []).append(path)
        for copies in (c for c in by_hash.values() if len(c) > 1):
            logger.warning(
                "%s hold the same bytes (size and first and last MB): copies of one slide, each built as its own",
                ", ".join(copies),
            )
