"""DICOM series fields read from a file's first bytes (:mod:`wsishard.slide.dicomheader`): explicit and implicit VR
little endian data sets, sequences of undefined length skipped, more bytes read while the fields are not passed, and
None (never an exception) for what is not DICOM, cut short, or in a transfer syntax not read here."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from wsishard.slide.dicom import group_series
from wsishard.slide.dicomheader import WSI_SOP_CLASS, DicomHeader, parse_header, read_header

EXPLICIT, IMPLICIT, BIG_ENDIAN = "1.2.840.10008.1.2.1", "1.2.840.10008.1.2", "1.2.840.10008.1.2.2"
UNDEFINED = 0xFFFFFFFF


def _text(value: str) -> bytes:
    data = value.encode()
    return data + b"\0" if len(data) % 2 else data


def _explicit(tag: int, vr: bytes, value: bytes, length: int | None = None) -> bytes:
    head = struct.pack("<HH", tag >> 16, tag & 0xFFFF) + vr
    size = len(value) if length is None else length
    if vr in (b"OB", b"SQ", b"UN", b"UT"):
        return head + b"\0\0" + struct.pack("<I", size) + value
    return head + struct.pack("<H", size) + value


def _implicit(tag: int, value: bytes, length: int | None = None) -> bytes:
    return struct.pack("<HHI", tag >> 16, tag & 0xFFFF, len(value) if length is None else length) + value


def _item(body: bytes, undefined: bool) -> bytes:
    if undefined:
        return struct.pack("<HHI", 0xFFFE, 0xE000, UNDEFINED) + body + struct.pack("<HHI", 0xFFFE, 0xE00D, 0)
    return struct.pack("<HHI", 0xFFFE, 0xE000, len(body)) + body


def _sequence_end() -> bytes:
    return struct.pack("<HHI", 0xFFFE, 0xE0DD, 0)


def _file(syntax: str, data_set: bytes) -> bytes:
    meta = _explicit(0x00020010, b"UI", _text(syntax))
    return b"\0" * 128 + b"DICM" + _explicit(0x00020000, b"UL", struct.pack("<I", len(meta))) + meta + data_set


def _fields(element: object, sop: str = WSI_SOP_CLASS, sequence: bytes = b"") -> bytes:
    """SOP class, a sequence (before the UIDs, as a real file's code sequences are), study, series, container, and
    pixel data of undefined length after them."""
    parts = [
        element(0x00080016, b"UI", _text(sop)),
        sequence,
        element(0x0020000D, b"UI", _text("1.2.3")),
        element(0x0020000E, b"UI", _text("1.2.3.4")),
        element(0x00400512, b"LO", _text("TCGA-AA-0001-01Z-00-DX1")),
        element(0x7FE00010, b"OB", b"", UNDEFINED),
    ]
    return b"".join(parts)


WANTED = DicomHeader(sop_class=WSI_SOP_CLASS, study="1.2.3", series="1.2.3.4", container="TCGA-AA-0001-01Z-00-DX1")


def test_explicit_vr_with_a_nested_sequence_of_undefined_length() -> None:
    inner = _explicit(0x00080100, b"SH", _text("433466003"))
    nested = _explicit(0x00400560, b"SQ", _item(inner, True) + _sequence_end(), UNDEFINED)
    sequence = _explicit(0x00080220, b"SQ", _item(nested, True) + _item(inner, False) + _sequence_end(), UNDEFINED)
    found = parse_header(_file(EXPLICIT, _fields(_explicit, sequence=sequence)))
    assert found == WANTED and found.is_slide


def test_implicit_vr_with_a_sequence_of_undefined_length() -> None:
    def element(tag: int, _vr: bytes, value: bytes, length: int | None = None) -> bytes:
        return _implicit(tag, value, length)

    inner = _implicit(0x00080100, _text("433466003"))
    sequence = _implicit(0x00080220, _item(inner, True) + _sequence_end(), UNDEFINED)
    assert parse_header(_file(IMPLICIT, _fields(element, sequence=sequence))) == WANTED


def test_more_bytes_are_read_while_the_fields_are_not_passed() -> None:
    data = _file(EXPLICIT, _fields(_explicit, sequence=_explicit(0x00080220, b"SQ", b"\0" * 5000 + b"", 5000)))
    asked: list[int] = []

    def read(n: int) -> bytes:
        asked.append(n)
        return data[:n]

    assert read_header(read, first_bytes=256) == WANTED
    assert asked[:3] == [256, 512, 1024] and asked[-1] >= len(data) - 16  # doubled until past the container
    asked.clear()
    assert read_header(read, first_bytes=256, max_bytes=1024) is None and asked[-1] == 1024  # never past the cap


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"GIF89a" + b"\0" * 300,  # no DICM at 128
        b"\0" * 128 + b"DICM" + b"\0" * 64,  # DICM, then nothing an element could be
        _file(BIG_ENDIAN, _fields(_explicit)),  # retired big-endian data set: not read here
        _file(EXPLICIT, _fields(_explicit))[:200],  # cut short inside the UIDs (the whole file)
        _file(EXPLICIT, _explicit(0x00080220, b"SQ", b"\x01\x02\x03\x04" * 4, UNDEFINED)),  # garbage in a sequence
    ],
)
def test_what_is_no_readable_dicom_is_none(data: bytes) -> None:
    assert parse_header(data) is None
    assert read_header(lambda n: data[:n], first_bytes=64) is None


def test_a_dicom_file_that_is_no_whole_slide_image_is_kept_unnamed(tmp_path: Path) -> None:
    report = tmp_path / "report.dcm"
    report.write_bytes(_file(EXPLICIT, _fields(_explicit, sop="1.2.840.10008.5.1.4.1.1.88.33")))  # an SR document
    slide = tmp_path / "a.dcm"
    slide.write_bytes(_file(EXPLICIT, _fields(_explicit)))
    paths = [str(slide), str(report)]
    assert group_series(paths) == (paths, {str(slide): "TCGA-AA-0001-01Z-00-DX1"})
