"""The format's validation helpers against hostile input: image headers read without decoding (so a decompression
bomb is measured, never opened), the key grammar, shard names from a manifest, and the manifest's patch size."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from wsishard.errors import ManifestError, ShardError
from wsishard.format import image_header, is_sample_key, sample_key, sanitize_slide_id
from wsishard.manifest import Manifest, expected_patch_size

_RNG_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8))


def _encoded(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


@pytest.mark.parametrize(("fmt", "mode", "kw"), [
    ("JPEG", "RGB", {"quality": 90}), ("JPEG", "RGB", {"progressive": True}), ("JPEG", "L", {}),
    ("JPEG", "CMYK", {}), ("JPEG", "RGB", {"exif": b"Exif\x00\x00" + b"\x00" * 3000}),
    ("PNG", "RGB", {}), ("PNG", "RGBA", {}), ("PNG", "P", {}), ("WEBP", "RGB", {"quality": 80}),
    ("WEBP", "RGB", {"lossless": True}), ("WEBP", "RGBA", {"quality": 80}), ("WEBP", "RGBA", {"lossless": True}),
])  # fmt: skip
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


@pytest.mark.parametrize("data", [b"", b"not an image", b"\xff\xd8\xff", b"\xff\xd8\xff\xe0\x00\x10JFIF",
                                  b"\x89PNG\r\n\x1a\n\x00\x00", b"RIFF\x00\x00\x00\x00WEBPVP8 ",
                                  b"\xff\xd9" * 40])  # fmt: skip
def test_image_header_of_garbage_or_a_cut_header_is_none(data: bytes) -> None:
    assert image_header(data) is None


def test_image_header_of_a_cut_real_image_is_none() -> None:
    for fmt in ("JPEG", "PNG", "WEBP"):
        data = _encoded(_RNG_IMAGE, fmt)
        assert image_header(data[:12]) is None


def test_the_key_grammar() -> None:
    assert is_sample_key(sample_key(sanitize_slide_id("../../a b.svs"), 0, 1024))
    assert is_sample_key("TCGA-02-0001-01Z-00-DX1_x123_y456") and is_sample_key("s-1a2b3c4d_x0_y0")
    for bad in ("../../evil", "a/b_x1_y2", "a_x1_y2/..", "evil", "a_x1", "a_x-1_y2", "_a_x1_y2", "-a_x1_y2",
                "a_x1_y2 ", "a.b_x1_y2", "a_x1_y2\n", "", "a_x_y1"):  # fmt: skip
        assert not is_sample_key(bad), bad


def _manifest(names: list[str], options: dict | None = None) -> dict:
    shards = [{"name": n, "samples": 1, "bytes": 10240, "sha256": "0" * 64} for n in names]
    return {"format": "wsishard", "version": 1, "options": options or {}, "shards": shards, "slides": []}


def test_shard_names_are_checked_when_a_manifest_is_read() -> None:
    assert len(Manifest.from_dict(_manifest(["shard-000000.tar", "shard-1234567.tar"])).shards) == 2
    for bad in ("../../x.tar", "/etc/x.tar", "s3://other/x.tar", "sub/shard-000001.tar", "shard-000001.tar/..",
                "shard-1.tar", "", "shard-000001.tar\n"):  # fmt: skip
        with pytest.raises(ManifestError) as info:
            Manifest.from_dict(_manifest(["shard-000000.tar", bad]), "out/manifest.json")
        assert info.value.location == "out/manifest.json" and "entry 1" in info.value.reason
        assert repr(bad) in info.value.reason and "\n" not in str(info.value)
    with pytest.raises(ManifestError, match="entry 0"):
        Manifest.from_dict(_manifest([7]))  # type: ignore[list-item]


def test_a_credential_in_a_bad_shard_name_is_not_shown() -> None:
    with pytest.raises(ManifestError) as info:
        Manifest.from_dict(_manifest(["s3://AKIAEXAMPLE:wJalrXUtnFEMIsecret@bucket/x.tar"]))
    assert "wJalrXUtnFEMIsecret" not in str(info.value)


def test_shard_counts_must_be_counts() -> None:
    for bad in (-1, "7", 2.5, None):
        data = _manifest(["shard-000000.tar"])
        data["shards"][0]["samples"] = bad
        with pytest.raises(ManifestError, match="samples"):
            Manifest.from_dict(data)


def test_expected_patch_size_comes_from_the_options() -> None:
    manifest = Manifest.from_dict(_manifest(["shard-000000.tar"], {"patch": {"patch_size_px": 224}}))
    assert expected_patch_size(manifest, "m") == 224
    for options in ({}, {"patch": {}}, {"patch": {"patch_size_px": "224"}}, {"patch": {"patch_size_px": 0}},
                    {"patch": 224}, {"patch": {"patch_size_px": True}}):  # fmt: skip
        with pytest.raises(ManifestError, match="patch_size_px") as info:
            expected_patch_size(Manifest.from_dict(_manifest(["shard-000000.tar"], options)), "out/manifest.json")
        assert info.value.location == "out/manifest.json"


def test_decode_into_refuses_a_bomb_from_its_header() -> None:
    from wsishard.streaming.decode import decode_into
    from wsishard.streaming.stages import RawSample

    jpeg = bytearray(_encoded(_RNG_IMAGE, "JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 30000, 30000)
    raw = RawSample(key="s_x0_y0", shard="shard-000003.tar", image_ext="jpg", image=bytes(jpeg), meta=b"{}", label=None)
    with pytest.raises(ShardError) as info:
        decode_into(raw, np.empty((24, 40, 3), dtype=np.uint8))
    assert info.value.shard == "shard-000003.tar" and "s_x0_y0" in info.value.reason
    assert "30000x30000" in info.value.reason and "40x24" in info.value.reason


def test_a_manifest_listing_a_shard_twice_is_refused() -> None:
    with pytest.raises(ManifestError, match=r"shard entry 2 \(shard-000000\.tar\) is entry 0 again: read twice"):
        Manifest.from_dict(_manifest(["shard-000000.tar", "shard-000001.tar", "shard-000000.tar"]), "m.json")
