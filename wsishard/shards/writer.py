"""Tar shard writing: samples go to a temporary name and appear under the final name only when complete.

Bytes and sha256 are computed while writing, so the manifest's checksums never need a second read. The archive
layout is webdataset's own ``TarWriter`` layout (USTAR, a sample's members in sorted order, fixed owner and
mode), byte for byte what ``tarfile`` writes in stream mode; it is made here directly because importing
webdataset imports torch, which would add seconds to every build worker's start.

A tar archive is its members' records one after another, then an end marker: so the records of consecutive
runs of samples (a shard's *segments*, made by different workers) concatenate into the shard, byte for byte the
same as writing the samples one by one (:func:`sample_records`, :meth:`ShardWriter.append`).
"""

from __future__ import annotations

import tarfile
from collections.abc import Iterable
from types import TracebackType

from wsishard.format import member_order
from wsishard.manifest import ShardRecord
from wsishard.shards.hashing import HashingFile
from wsishard.shards.index import IndexWriter, index_bytes, index_digest, index_name
from wsishard.storage.output import Destination

_TAR_MTIME = 0  # fixed member mtime: the same samples give byte-identical shards
_BLOCK = tarfile.BLOCKSIZE  # 512
_RECORD = tarfile.RECORDSIZE  # 10240: tarfile pads the archive to a multiple of this


def _tarfile_header(name: str, size: int) -> bytes:
    """A member's USTAR header as ``tarfile`` writes it (raises ``ValueError`` where it does)."""
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size, _TAR_MTIME, 0o444
    info.uname = info.gname = "wsishard"
    return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")


# A header is this template with the name (bytes 0-100), the size (124-136) and the checksum (148-156) filled in.
_TEMPLATE = _tarfile_header("", 0)
_BLANK_SUM = sum(_TEMPLATE) - sum(_TEMPLATE[124:136]) - sum(_TEMPLATE[148:156]) + 8 * ord(" ")  # without name, size
_NAME_MAX, _SIZE_MAX = 100, 8**11 - 1  # longer names (a prefix field) and larger sizes: tarfile's own way


def _header(name: str, size: int) -> bytes:
    """``_tarfile_header(name, size)`` without a ``TarInfo``: a tenth of its time (a build writes two per patch)."""
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) > _NAME_MAX or not 0 <= size <= _SIZE_MAX:
        return _tarfile_header(name, size)
    size_field = b"%011o\0" % size
    chksum = _BLANK_SUM + sum(raw) + sum(size_field)  # of the header with its checksum field blank (8 spaces)
    t = _TEMPLATE
    return b"".join(
        (raw, bytes(_NAME_MAX - len(raw)), t[100:124], size_field, t[136:148], b"%06o\0 " % chksum, t[156:])
    )


def sample_records(key: str, members: dict[str, bytes]) -> bytes:
    """The tar records of one sample: per member (``<key>.<ext>``, in :func:`~wsishard.format.member_order`) a USTAR
    header, the data and its padding to 512 bytes: byte for byte what ``tarfile`` writes."""
    parts = []
    for ext in sorted(members, key=member_order):
        data = members[ext]
        parts += [_header(f"{key}.{ext}", len(data)), data, bytes(-len(data) % _BLOCK)]
    return b"".join(parts)


class ShardWriter:
    """Write one shard atomically: ``with ShardWriter(dest, name) as w: w.write(key, members, slide_id)``.

    The shard appears under ``name`` only on a clean exit (or :meth:`commit`); on an exception (or
    :meth:`abort`) nothing appears: see :class:`~wsishard.storage.output.Destination` for how each store does it.
    Its per-sample index (:mod:`wsishard.shards.index`) is written beside it, atomically too, as it is committed.

    Args:
        dest: the build output.
        name: the shard's final name, relative to the output.
    """

    def __init__(self, dest: Destination, name: str) -> None:
        self.name = name
        self._out = dest.open_atomic(name)
        self._hashing = HashingFile(self._out)
        self._samples = 0
        self._slides: set[str] = set()
        self._dest = dest
        self._index = IndexWriter()
        self.record: ShardRecord | None = None

    def write(self, key: str, members: dict[str, bytes], slide_id: str) -> None:
        """Append one sample: ``members`` maps extensions (``jpg``, ``json``, ...) to encoded bytes."""
        self.append(sample_records(key, members), 1, (slide_id,))

    def append(self, records: bytes, samples: int, slide_ids: Iterable[str]) -> None:
        """Append the :func:`sample_records` of ``samples`` samples (made elsewhere) from ``slide_ids``."""
        self._index.add(records, self._hashing.nbytes)
        self._hashing.write(records)
        self._samples += samples
        self._slides.update(slide_ids)

    def commit(self) -> ShardRecord:
        """Finish the archive, make it visible under its final name and return its manifest record."""
        end = self._hashing.nbytes + 2 * _BLOCK  # two zero blocks end the archive...
        self._hashing.write(bytes(2 * _BLOCK + -end % _RECORD))  # ...padded to a whole record, as tarfile does
        self._out.commit()
        arrays = self._index.arrays()
        self._dest.write_bytes(index_name(self.name), index_bytes(arrays))
        self.record = ShardRecord(
            name=self.name,
            samples=self._samples,
            bytes=self._hashing.nbytes,
            sha256=self._hashing.hexdigest(),
            slides=len(self._slides),
            index_sha256=index_digest(arrays),
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
