"""Tar shard writing: samples go to a temporary name and appear under the final name only when complete.

Bytes and sha256 are computed while writing, so the manifest's checksums never need a second read. The archive
layout is webdataset's own ``TarWriter`` layout (USTAR, a sample's members in sorted order, fixed owner and
mode); the standard library's ``tarfile`` writes it directly because importing webdataset imports torch, which
would add seconds to every build worker's start.
"""

from __future__ import annotations

import io
import tarfile
from types import TracebackType

from wsishard.format import ShardRecord
from wsishard.shards.hashing import HashingFile
from wsishard.storage.output import Destination

_TAR_MTIME = 0  # fixed member mtime: the same samples give byte-identical shards


class ShardWriter:
    """Write one shard atomically: ``with ShardWriter(dest, name) as w: w.write(key, members, slide_id)``.

    The shard appears under ``name`` only on a clean exit (or :meth:`commit`); on an exception (or
    :meth:`abort`) nothing appears: see :class:`~wsishard.storage.output.Destination` for how each store does it.

    Args:
        dest: the build output.
        name: the shard's final name, relative to the output.
    """

    def __init__(self, dest: Destination, name: str) -> None:
        self.name = name
        self._out = dest.open_atomic(name)
        self._hashing = HashingFile(self._out)
        self._tar = tarfile.open(fileobj=self._hashing, mode="w|", format=tarfile.USTAR_FORMAT)  # type: ignore[call-overload]  # noqa: SIM115
        self._samples = 0
        self._slides: set[str] = set()
        self.record: ShardRecord | None = None

    def write(self, key: str, members: dict[str, bytes], slide_id: str) -> None:
        """Append one sample: ``members`` maps extensions (``jpg``, ``json``, ...) to encoded bytes."""
        for ext in sorted(members):
            data = members[ext]
            info = tarfile.TarInfo(f"{key}.{ext}")
            info.size, info.mtime, info.mode = len(data), _TAR_MTIME, 0o444
            info.uname = info.gname = "wsishard"
            self._tar.addfile(info, io.BytesIO(data))
        self._samples += 1
        self._slides.add(slide_id)

    def commit(self) -> ShardRecord:
        """Finish the archive, make it visible under its final name and return its manifest record."""
        self._tar.close()
        self._out.commit()
        self.record = ShardRecord(
            name=self.name,
            samples=self._samples,
            bytes=self._hashing.nbytes,
            sha256=self._hashing.hexdigest(),
            slides=len(self._slides),
        )
        return self.record

    def abort(self) -> None:
        """Drop everything written; nothing appears under the final name."""
        self._out.abort()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()
