"""Image sizes read from an encoded image's header alone (JPEG, PNG, WebP): nothing is decoded, so a
decompression bomb is measured at no cost. :mod:`wsishard.format` re-exports :func:`image_header`; the size every
image of a build is held to is :func:`wsishard.manifest.expected_patch_size`."""

from __future__ import annotations

import struct

ImageHeader = tuple[str, int, int]  # (image format "jpg" | "png" | "webp", width px, height px)
_JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}  # SOF markers (not DHT, JPG, DAC)
_JPEG_SEGMENTS = frozenset(range(0x100)) - _JPEG_FRAMES - {0xD9, 0xDA, 0xFF, 0x01} - set(range(0xD0, 0xD9))  # a length
_MARKER = struct.Struct(">BBH")
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def image_header(data: bytes) -> ImageHeader | None:
    """``(format, width, height)`` of an encoded image, read from its header alone: nothing is decoded, so a
    decompression bomb is measured at no cost. None when ``data`` is no JPEG, PNG or WebP, or its header is cut.

    A JPEG's size is its first frame header's (what libjpeg decodes); a WebP's is its canvas.
    """
    if data[:2] == b"\xff\xd8":
        return _jpeg_header(data)
    if data[:8] == _PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return "png", width, height
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_header(data[12:16], data[20:30])
    return None


def _jpeg_header(data: bytes) -> ImageHeader | None:
    """Walk the marker segments after SOI up to the first frame header (SOF)."""
    pos, n, unpack = 2, len(data), _MARKER.unpack_from
    while pos + 4 <= n:
        fill, marker, length = unpack(data, pos)  # 0xFF, the marker, the segment's length (if it has one)
        if fill != 0xFF:
            return None
        if marker in _JPEG_SEGMENTS:  # the common case first (APPn, DQT, DHT, ...): ~0.7 us a JPEG sooner
            pos += 2 + length
        elif marker == 0xFF:  # fill byte
            pos += 1
        elif 0xD0 <= marker <= 0xD8 or marker == 0x01:  # markers without a length
            pos += 2
        elif marker in _JPEG_FRAMES:
            if pos + 9 > n:
                return None
            height, width = struct.unpack_from(">HH", data, pos + 5)
            return "jpg", width, height
        else:  # EOI or SOS: the image ends, or its scan starts, before any frame header
            return None
    return None


def _webp_header(chunk: bytes, body: bytes) -> ImageHeader | None:
    """The size in a WebP's first chunk: lossy (``VP8 ``), lossless (``VP8L``) or extended (``VP8X``)."""
    if chunk == b"VP8 " and len(body) >= 10 and body[3:6] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", body[6:10])
        return "webp", width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        bits = int.from_bytes(body[1:5], "little")
        return "webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(body) >= 10:
        return "webp", int.from_bytes(body[4:7], "little") + 1, int.from_bytes(body[7:10], "little") + 1
    return None
