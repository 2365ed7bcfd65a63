"""Reading shards: a lean reader of tar members (plain USTAR, uncompressed) and the grouping of members into
samples, shared by the stream, ``verify`` and the tests.

webdataset's ``tar_file_iterator`` goes through ``tarfile`` in stream mode, whose per-member header objects and
small reads cost a loader worker a large share of its time next to the JPEG decode. Here headers are
parsed where they lie in large reads into one reused buffer (one ``struct`` call for their fields), with their
checksum verified; GNU and pax long names are still honoured, so any ordinary uncompressed tar reads correctly. The
stream reads samples through :class:`TarSamples`, which groups members into samples and keeps its reader's share in
the same pass, and reads the plain headers lying whole in its buffer in C (``scan`` of ``wsishard/_native.c``, built
with the package); every other header (long names, damage, a member cut by the end of a read) is read here, so
errors have one implementation.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, TypeVar

from wsishard._native import scan as _scan
from wsishard.format import split_member

T = TypeVar("T")
Sample = tuple[str, dict[str, bytes]]  # a sample's key and its members' data by extension


def tar_members(stream: IO[bytes], wanted: Callable[[str], bool]) -> Iterator[tuple[str, bytes]]:
    """``(name, data)`` of each regular file of an uncompressed tar whose name is ``wanted``, in order.

    Other members are read past, never kept. USTAR headers (the format wsishard writes) with their
    checksum verified; GNU long names (``L``) and pax ``path``/``size`` records (``x``) are honoured,
    global pax headers ignored. A zero block, or the end of the file at a block boundary, ends the archive
    (a shard cut there, or zeroed mid-way, reads as shorter: the manifest's count catches it).

    Raises:
        EOFError: the file ends inside a header or a member.
        ValueError: a header's checksum or a number does not parse (not a tar, or corrupt).
    """
    src = _Chunks(stream)
    for name, size, at in _files(src):
        if wanted(name):
            yield name, _take(src, name, size, at)


def tar_spans(stream: IO[bytes], wanted: Callable[[str], bool]) -> Iterator[tuple[str, int, int, bytes | None]]:
    """``(name, start, end, data)`` of each regular file of an uncompressed tar, in order: the byte offsets of its
    header and of the byte after its padded data (its records are ``[start, end)``), and its data where its name is
    ``wanted`` (None otherwise, read past). Raises as :func:`tar_members`."""
    src = _Chunks(stream)
    for name, size, at in _files(src):
        yield name, at, at + _BLOCK + size + (-size % _BLOCK), _take(src, name, size, at) if wanted(name) else None


class TarSamples:
    """The samples of an uncompressed tar, as :func:`group_members` groups :func:`tar_members`' members (runs of
    members sharing a key, ``(key, {ext: data})``), in one pass: only members named ``<key>.<ext>`` with ``ext``
    in ``exts`` are read, and of the samples they make (numbered from 0 in tar order) only those ``k`` with
    ``k % step == phase`` are kept, the others read past without a copy. ``seen`` counts every sample met (while
    iterating, up to the end of what the C scan has read ahead; where an error is raised and at the end, exactly).

    ``native=False`` reads every header in Python: the reference the C scan is tested against.

    Raises (while iterated): as :func:`tar_members`, and ``ValueError`` for a sample that holds an extension twice.
    """

    def __init__(
        self, stream: IO[bytes], exts: Iterable[str], phase: int = 0, step: int = 1, native: bool = True
    ) -> None:
        if step < 1 or not 0 <= phase < step:
            raise ValueError(f"a reader keeps samples k % step == phase: needs 0 <= phase < step, got {phase}, {step}")
        self.stream, self.exts, self.phase, self.step = stream, frozenset(exts), phase, step
        self.native = native
        self.seen = 0

    def __iter__(self) -> Iterator[Sample]:
        src = _Chunks(self.stream)
        state: list[Any] = [None, {}, False, 0]  # the open sample: key, {ext: data}, kept?, samples met so far
        src.fill(_BLOCK)  # the first read, for the C scan
        while True:
            if self.native:  # the plain headers lying whole in (a chunk of) the buffer, in C
                end = min(src.end, src.pos + _CHUNK)  # at most a chunk's samples at once, however large the buffer
                src.pos, done = _scan(src.buf, src.pos, end, self.exts, self.phase, self.step, state)
                self.seen = state[3]
                yield from done
            member = _next_file(src)  # one header the C scan did not take
            if member is None:
                break
            done, ext = self._add(state, member[0])
            self.seen = state[3]
            if done is not None:  # before this member's data is taken: a shard cut inside it keeps the sample before
                yield done
            if ext is not None:
                state[1][ext] = _take(src, *member)
            _finish(src, *member)
        if state[1]:
            yield state[0], state[1]

    def _add(self, state: list[Any], name: str) -> tuple[Sample | None, str | None]:
        """Group the regular file ``name`` into ``state``: the sample it completes, if any, and its extension if its
        data is to be taken (its sample is kept)."""
        parts = split_member(name)
        if parts is None or parts[1] not in self.exts:
            return None, None
        prefix, ext = parts
        key, group, keeps, seen = state
        done = None
        if prefix != key:
            if group:
                done = key, group
            key, group, seen = prefix, {}, seen + 1
            keeps = (seen - 1) % self.step == self.phase
            state[:] = key, group, keeps, seen
        if keeps and ext in group:
            raise ValueError(f"duplicate member {name}")
        return done, ext if keeps else None


def _files(src: _Chunks) -> Iterator[tuple[str, int, int]]:
    """``(name, size, offset of its header)`` of each regular file of the tar ``src`` reads; the consumer may take
    the file's data (:func:`_take`) before asking for the next, else it is read past."""
    while (member := _next_file(src)) is not None:
        yield member
        _finish(src, *member)


def _next_file(src: _Chunks) -> tuple[str, int, int] | None:
    """``(name, size, offset of its header)`` of the next regular file, long names and pax records applied, other
    members read past; None at the end of the archive. The caller may take the file's data (:func:`_take`), then
    calls :func:`_finish`."""
    long_name: str | None = None
    long_size: int | None = None
    while True:
        at = src.offset
        pos = src.block()  # the header's position in src.buf, read in place (no copy)
        if pos < 0:
            if pos == _CUT:
                raise EOFError(f"tar header cut short at byte {at}")
            return None
        name, size, kind = _header(src.buf, pos, at)
        if not kind:  # a zero block
            return None
        if kind in _EXTENSIONS:
            data = _take(src, name, size, at)
            if kind == b"L":
                long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif kind == b"x":
                records = _pax_records(data)
                long_name = records.get("path", long_name)
                long_size = _pax_size(records["size"]) if "size" in records else long_size
        else:
            name, size = long_name or name, size if long_size is None else long_size
            long_name, long_size = None, None
            if kind in _REGULAR:
                return name, size, at
        _finish(src, name, size, at)


def _finish(src: _Chunks, name: str, size: int, at: int) -> None:
    """Read past what is left of the member ``name`` (header at byte ``at``, ``size`` bytes) and its padding."""
    end = at + _BLOCK + size + (-size % _BLOCK)  # the next header
    left = end - src.offset  # what the consumer did not take, and the padding
    if left and src.skip(left) < left and src.offset < at + _BLOCK + size:
        raise EOFError(f"tar member {name!r} at byte {at} cut short ({size} bytes expected)")


def _take(src: _Chunks, name: str, size: int, at: int) -> bytes:
    """The ``size`` bytes of the member ``name`` whose header is at byte ``at``, from ``src``."""
    if size > _MAX_MEMBER:
        raise ValueError(f"tar member {name!r} at byte {at} claims {size} bytes (corrupt, or not a shard)")
    data = src.take(size)
    if len(data) < size:
        raise EOFError(f"tar member {name!r} at byte {at} cut short ({size} bytes expected)")
    return data


def group_members(members: Iterable[tuple[str, T]]) -> Iterator[tuple[str, dict[str, T]]]:
    """Samples from tar members in order: runs of members sharing a key, as ``(key, {ext: data})``.

    Keys and extensions split as webdataset splits them (:func:`wsishard.format.split_member`); a member name
    without an extension is a key of its own with the extension ``""``.

    Raises:
        ValueError: a sample holds the same extension twice.
    """
    key: str | None = None
    group: dict[str, T] = {}
    for name, data in members:
        prefix, ext = split_member(name) or (name, "")
        if prefix != key:
            if key is not None:
                yield key, group
            key, group = prefix, {}
        if ext in group:
            raise ValueError(f"duplicate member {name}")
        group[ext] = data
    if key is not None:
        yield key, group


_BLOCK = 512
_END, _CUT = -1, -2  # what _Chunks.block says at the end of the file, and inside a block cut short
_ZERO_BLOCK = bytes(_BLOCK)
_CHUNK = 1 << 20  # bytes per read from the file
_MAX_MEMBER = 1 << 28  # bytes: larger kept members are taken for a corrupt size field
_REGULAR = frozenset((b"0", b"\0", b"7"))
_EXTENSIONS = frozenset((b"L", b"K", b"x", b"g"))  # headers about the next member or the archive: no file


# a header's name, size, checksum, type flag, magic and prefix fields, unpacked in one call from where it lies
_FIELDS = struct.Struct("100s24x12s12x8sc100x6s2x80x155s12x")
_NO_NAME = b"\0" * 100


def _header(buf: bytearray, pos: int, at: int) -> tuple[str, int, bytes]:
    """``(name, size, type flag)`` of the USTAR/GNU/v7 header block at ``buf[pos:pos + 512]`` (byte ``at`` of the
    file); ``("", 0, b"")`` for a zero block (the end of the archive)."""
    name, size, stored, kind, magic, prefix = _FIELDS.unpack_from(buf, pos)
    if name == _NO_NAME and not any(stored) and buf[pos : pos + _BLOCK] == _ZERO_BLOCK:
        return "", 0, b""  # the end of the archive (anything else without a checksum fails it below)
    block = buf[pos : pos + _BLOCK]
    checksum = _number(stored)
    unsigned = sum(block) - sum(stored) + 8 * 32  # the checksum field counts as 8 spaces
    signed = unsigned - 256 * sum(1 for b in block[:148] + block[156:] if b > 127)  # old tars summed signed bytes
    if checksum not in (unsigned, signed):
        raise ValueError(f"tar header at byte {at} fails its checksum (not a tar, or corrupt)")
    name = name.partition(b"\0")[0]
    if magic == b"ustar\0" and prefix[0]:  # POSIX: a long name is split into prefix / name
        name = prefix.partition(b"\0")[0] + b"/" + name
    return name.decode("utf-8", "surrogateescape"), _number(size), kind


def _number(field: bytes) -> int:
    """An octal header number (NUL or space terminated), or GNU base-256 for large values."""
    if field[0] == 0x80:
        return int.from_bytes(field[1:], "big")
    digits = field.split(b"\0", 1)[0].strip()
    if digits and not digits.isdigit():  # int() would take a sign, "_" or "0o": a negative size reads backwards
        raise ValueError(f"tar header number {bytes(field)!r} is not octal")
    return int(digits, 8) if digits else 0


def _pax_size(value: str) -> int:
    """A pax ``size`` record: decimal digits only (a negative size would read backwards)."""
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"pax size {value[:40]!r} is not a size")
    return int(value)


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``length key=value\\n`` records of a pax extended header."""
    records, pos = {}, 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = data[pos:space]
        end = pos + int(length) if length.isdigit() else 0
        if end <= space or end > len(data):  # a record must hold its own length: none reads 0 bytes for ever
            raise ValueError(f"pax record {bytes(data[pos : pos + 40])!r} has a bad length")
        key, _, value = data[space + 1 : end - 1].partition(b"=")
        records[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = end
    return records


class _Chunks:
    """Forward-only reads from a binary file, fetched in large chunks into one reused buffer (``readinto``):
    few calls into the file object, and no fresh pages or joins per chunk; each ``take`` copies out its bytes.
    (Mapping a local file instead, ``mmap``, read slower here: its page faults cost more than the copy saved.)"""

    def __init__(self, stream: IO[bytes]) -> None:
        self._read = stream.read
        self._readinto: Callable[[memoryview], int | None] = getattr(stream, "readinto", None) or self._read_into
        self._buf = bytearray(_CHUNK)
        self._view = memoryview(self._buf)
        self._pos = 0  # next byte of the buffer to take
        self._end = 0  # bytes of the buffer filled
        self._base = 0  # file offset of ``_buf[0]``

    @property
    def offset(self) -> int:
        return self._base + self._pos

    @property
    def pos(self) -> int:
        """The next byte of :attr:`buf` to read."""
        return self._pos

    @pos.setter
    def pos(self, pos: int) -> None:
        self._pos = pos

    @property
    def end(self) -> int:
        """The bytes of :attr:`buf` filled."""
        return self._end

    @property
    def buf(self) -> bytearray:
        """The buffer :meth:`block` positions point into (replaced by reads that need a larger one)."""
        return self._buf

    def block(self) -> int:
        """Take the next 512-byte block where it lies: its position in :attr:`buf`; ``_END`` where the file ends
        at this block's start, ``_CUT`` where it ends inside it."""
        pos = self._pos
        if pos + _BLOCK > self._end:
            self.fill(_BLOCK)
            pos, left = self._pos, self._end - self._pos
            if left < _BLOCK:
                self._pos = self._end
                return _END if left == 0 else _CUT
        self._pos = pos + _BLOCK
        return pos

    def take(self, n: int) -> bytes:
        """The next ``n`` bytes; fewer only where the file ends."""
        if self._pos + n > self._end:
            self.fill(n)
        n = min(n, self._end - self._pos)
        out = bytes(self._view[self._pos : self._pos + n])
        self._pos += n
        return out

    def skip(self, n: int) -> int:
        """Read past the next ``n`` bytes; the number skipped (fewer only where the file ends)."""
        done = 0
        while done < n:
            if self._pos == self._end and not self.fill(1):
                break
            step = min(n - done, self._end - self._pos)
            self._pos += step
            done += step
        return done

    def fill(self, n: int) -> bool:
        """Keep the unread bytes, move them to the front, and read until ``n`` are there or the file ends."""
        rest = self._end - self._pos
        if n > len(self._buf):  # a member larger than a chunk: a buffer of its own size
            self._buf = bytearray(max(n, _CHUNK))
            self._buf[:rest] = self._view[self._pos : self._end]
            self._view = memoryview(self._buf)
        elif rest:
            self._view[:rest] = self._view[self._pos : self._end]  # a memoryview copy allows the overlap
        self._base += self._pos
        self._pos, self._end = 0, rest
        while self._end < n:
            try:
                got = self._readinto(self._view[self._end :])
            except NotImplementedError:  # io.RawIOBase's own readinto, in a file that has only read()
                self._readinto = self._read_into
                continue
            if not got:
                break
            self._end += got
        return self._end > self._pos

    def _read_into(self, view: memoryview) -> int:
        data = self._read(len(view))
        view[: len(data)] = data
        return len(data)
