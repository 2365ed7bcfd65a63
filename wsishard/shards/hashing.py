"""A file wrapper that hashes (sha256) and counts every byte written to or read from it.

The shard writer computes a shard's bytes and checksum while writing it, and ``verify`` while reading it back:
both through :class:`HashingFile`, so the manifest's figures and the check agree by construction.
"""

from __future__ import annotations

import hashlib
from typing import IO, Any

_CHUNK = 2**20


class HashingFile:
    """Wraps a binary file object; :attr:`nbytes` and :meth:`hexdigest` cover every byte that passed."""

    def __init__(self, fh: IO[bytes] | Any) -> None:
        self._fh = fh
        self._sha = hashlib.sha256()
        self.nbytes = 0

    def write(self, data: bytes) -> int:
        self._sha.update(data)
        self.nbytes += len(data)
        written: int = self._fh.write(data)
        return written

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._fh.read(size)
        self._sha.update(data)
        self.nbytes += len(data)
        return data

    def drain(self) -> None:
        """Read (and hash) whatever is left."""
        while self.read(_CHUNK):
            pass

    def flush(self) -> None:
        self._fh.flush()

    def hexdigest(self) -> str:
        return self._sha.hexdigest()
