"""Image sizes read from the header alone (:mod:`wsishard.imageheader`): equal to PIL's, a decompression bomb's
declared size read without decoding it, garbage and cut headers None."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from wsishard.imageheader import image_header

_RNG_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8))


def _encoded(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("fmt", "mode", "kw"),
    [
        ("JPEG", "RGB", {"quality": 90}),
        ("JPEG", "RGB", {"progressive": True}),
        ("JPEG", "L", {}),
        ("JPEG", "CMYK", {}),
        ("JPEG", "RGB", {"exif": b"Exif\x00\x00" + b"\x00" * 3000}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "P", {}),
        ("WEBP", "RGB", {"quality": 80}),
        ("WEBP", "RGB", {"lossless": True}),
        ("WEBP", "RGBA", {"quality": 80}),
        ("WEBP", "RGBA", {"lossless": True}),
    ],
)
def test_image_header_matches_pil(fmt: str, mode: str, kw: dict) -> None:
    data = _encoded(_RNG_IMAGE.convert(mode), fmt, **kw)
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
    with Image.open(io.BytesIO(data)) as img:
        assert image_header(data) == (ext, *img.size) == (ext, 40, 24)


def test_image_header_reads_a_bombs_declared_size_without_decoding() -> None:
    jpeg = bytearray(_encoded(_RNG_IMAGE, "JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 30000, 40000)
    assert image_header(bytes(jpeg)) == ("jpg", 40000, 30000)
    png = bytearray(_encoded(_RNG_IMAGE, "PNG"))
    png[16:24] = struct.pack(">II", 50000, 60000)
    png[29:33] = struct.pack(">I", zlib.crc32(bytes(png[12:29])))
    assert image_header(bytes(png)) == ("png", 50000, 60000)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"not an image",
        b"\xff\xd8\xff",
        b"\xff\xd8\xff\xe0\x00\x10JFIF",
        b"\x89PNG\r\n\x1a\n\x00\x00",
        b"RIFF\x00\x00\x00\x00WEBPVP8 ",
        b"\xff\xd9" * 40,
    ],
)
def test_image_header_of_garbage_or_a_cut_header_is_none(data: bytes) -> None:
    assert image_header(data) is None


def test_image_header_of_a_cut_real_image_is_none() -> None:
    for fmt in ("JPEG", "PNG", "WEBP"):
        data = _encoded(_RNG_IMAGE, fmt)
        assert image_header(data[:12]) is None
