"""The few DICOM header fields that tell which whole-slide series a ``.dcm`` file belongs to, read from the file's
first bytes alone (a few ranged reads in object storage, never its pixels), without a DICOM library.

A DICOM file is a 128-byte preamble, ``DICM``, a file meta group (explicit VR little endian) that names the data
set's transfer syntax, then the data set's elements in tag order. The fields wanted all come before the pixel data,
so reading stops at the first element past the last of them. Implicit and explicit VR little endian are read (what
whole-slide images use: their pixels are encapsulated JPEG or JPEG 2000 frames after these fields); a big-endian or
deflated data set, a file that is not DICOM, or one cut short yields nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

_MAGIC_AT = 128
_IMPLICIT_LE = "1.2.840.10008.1.2"
_READABLE = (_IMPLICIT_LE, "1.2.840.10008.1.2.1")  # implicit / explicit VR little endian data sets
_COMPRESSED_PREFIX = "1.2.840.10008.1.2.4."  # encapsulated pixels (JPEG, JPEG 2000): the data set is explicit VR LE
_LONG_VRS = frozenset({b"OB", b"OD", b"OF", b"OL", b"OV", b"OW", b"SQ", b"SV", b"UC", b"UN", b"UR", b"UT", b"UV"})
_UNDEFINED = 0xFFFFFFFF
_ITEM, _ITEM_END, _SEQ_END = 0xFFFEE000, 0xFFFEE00D, 0xFFFEE0DD
_WANTED = {
    0x00080016: "sop_class",
    0x0020000D: "study",
    0x0020000E: "series",
    0x00400512: "container",
}
_LAST = max(_WANTED)
WSI_SOP_CLASS = "1.2.840.10008.5.1.4.1.1.77.1.6"  # VL Whole Slide Microscopy Image Storage


class _Short(Exception):
    """The bytes end before the fields wanted: read more."""


@dataclass(frozen=True)
class DicomHeader:
    """A ``.dcm`` file's series fields (empty strings where the file has none)."""

    sop_class: str = ""
    study: str = ""
    series: str = ""
    container: str = ""  # ContainerIdentifier: the glass slide's identifier (a barcode, a TCGA slide id)

    @property
    def is_slide(self) -> bool:
        """A whole-slide image of a known series."""
        return self.sop_class == WSI_SOP_CLASS and bool(self.study and self.series)


def read_header(
    read: Callable[[int], bytes], first_bytes: int = 64 << 10, max_bytes: int = 8 << 20
) -> DicomHeader | None:
    """The series fields of the DICOM file whose first ``n`` bytes ``read(n)`` returns (fewer at its end), or None
    where it is not DICOM or not readable here (see the module docstring). Reads ``first_bytes``, then twice as many
    while the fields are not all passed, up to ``max_bytes``."""
    size = first_bytes
    while True:
        data = read(size)
        try:
            return parse_header(data, complete=len(data) < size)
        except _Short:
            if len(data) < size or size >= max_bytes:
                return None
            size = min(2 * size, max_bytes)


def parse_header(data: bytes, complete: bool = True) -> DicomHeader | None:
    """The series fields in ``data``, a DICOM file's first bytes (``complete``: the whole file), or None.

    Raises:
        _Short: ``data`` ends before the fields wanted, and is not the whole file.
    """
    if data[_MAGIC_AT : _MAGIC_AT + 4] != b"DICM":
        if len(data) < _MAGIC_AT + 4 and not complete:
            raise _Short
        return None
    try:
        meta, pos = _elements(data, _MAGIC_AT + 4, explicit=True, stop=lambda tag: tag >> 16 != 0x0002)
        syntax = meta.get(0x00020010, "")
        if syntax not in _READABLE and not syntax.startswith(_COMPRESSED_PREFIX):
            return None
        found, _ = _elements(data, pos, explicit=syntax != _IMPLICIT_LE, stop=lambda tag: tag > _LAST)
    except _Short:
        if complete:
            return None
        raise
    except (struct.error, UnicodeDecodeError, ValueError):
        return None
    return DicomHeader(**{name: found.get(tag, "") for tag, name in _WANTED.items()})


def _elements(data: bytes, pos: int, *, explicit: bool, stop: Callable[[int], bool]) -> tuple[dict[int, str], int]:
    """The text values of the wanted elements (and the transfer syntax) from ``pos`` to the first tag ``stop``
    accepts (or the end of ``data``), and the position of that tag."""
    found: dict[int, str] = {}
    while pos + 8 <= len(data):
        group, element = struct.unpack_from("<HH", data, pos)
        tag = group << 16 | element
        if stop(tag):
            return found, pos
        value_at, length = _element_head(data, pos, explicit or group == 0x0002)
        if length == _UNDEFINED:
            pos = _skip_undefined(data, value_at, explicit)
            continue
        if value_at + length > len(data):
            raise _Short
        if tag in _WANTED or tag == 0x00020010:
            found[tag] = data[value_at : value_at + length].decode("ascii").strip("\0 ")
        pos = value_at + length
    raise _Short


def _element_head(data: bytes, pos: int, explicit: bool) -> tuple[int, int]:
    """Where an element's value starts, and its length (:data:`_UNDEFINED`: items up to a delimiter follow)."""
    if not explicit:
        (length,) = struct.unpack_from("<I", data, pos + 4)
        return pos + 8, length
    vr = data[pos + 4 : pos + 6]
    if vr in _LONG_VRS:
        if pos + 12 > len(data):
            raise _Short
        (length,) = struct.unpack_from("<I", data, pos + 8)
        return pos + 12, length
    (length,) = struct.unpack_from("<H", data, pos + 6)
    return pos + 8, length


def _skip_undefined(data: bytes, pos: int, explicit: bool) -> int:
    """The position after an undefined-length value starting at ``pos``: a sequence's items up to its delimiter (an
    item of undefined length: its elements up to the item's delimiter), or encapsulated fragments."""
    while True:
        if pos + 8 > len(data):
            raise _Short
        group, element, length = struct.unpack_from("<HHI", data, pos)
        if group << 16 | element == _SEQ_END:
            return pos + 8
        if group << 16 | element != _ITEM:
            raise ValueError(f"tag {group:04x},{element:04x} inside a sequence")
        if length != _UNDEFINED:
            pos += 8 + length
            continue
        pos += 8
        while True:  # an item of undefined length: its elements, to the item's delimiter
            if pos + 8 > len(data):
                raise _Short
            group, element = struct.unpack_from("<HH", data, pos)
            if group << 16 | element == _ITEM_END:
                pos += 8
                break
            value_at, inner = _element_head(data, pos, explicit)
            pos = _skip_undefined(data, value_at, explicit) if inner == _UNDEFINED else value_at + inner
