"""Decoding samples: ``decode_into`` against PIL's RGB decode, its errors, and batches in shared memory."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
import shardmaker as sm
import torch
from PIL import Image
from streamtools import COUNTS

from wsishard.errors import ShardError
from wsishard.storage.opener import StreamOpener
from wsishard.streaming.decode import DecodeIntoBatches, decode_into
from wsishard.streaming.stages import RawSample, ShardRef, read_shard


def _raw(data: bytes, ext: str = "jpg", key: str = "k") -> RawSample:
    return RawSample(key=key, shard="s.tar", image_ext=ext, image=data, meta=b'{"label": 3}', label=None)


def _encoded(image: Image.Image, fmt: str, **kw: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **kw)
    return buf.getvalue()


_RNG_IMAGE = Image.fromarray(np.random.default_rng(0).integers(0, 256, (24, 40, 3), dtype=np.uint8))


@pytest.mark.parametrize(
    ("fmt", "mode", "kw"),
    [
        ("JPEG", "RGB", {"quality": 90}),
        ("JPEG", "RGB", {"quality": 75, "subsampling": 0}),
        ("JPEG", "RGB", {"quality": 95, "progressive": True}),
        ("JPEG", "L", {}),
        ("JPEG", "CMYK", {}),
        ("PNG", "RGB", {}),
        ("PNG", "RGBA", {}),
        ("PNG", "P", {}),
        ("WEBP", "RGB", {"quality": 80}),
    ],
)
def test_decode_into_equals_pils_rgb_decode(fmt: str, mode: str, kw: dict) -> None:
    data = _encoded(_RNG_IMAGE.convert(mode), fmt, **kw)
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}[fmt]
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # PIL, converted to RGB
    assert reference.shape == (24, 40, 3)
    slot = np.full((24, 40, 3), 7, dtype=np.uint8)
    decode_into(_raw(data, ext), slot)
    assert int(np.abs(slot.astype(np.int16) - reference).max()) <= 1  # libjpeg-turbo both sides: in fact equal


def test_decode_into_rejects_another_size_and_a_truncated_jpeg() -> None:
    data = _encoded(_RNG_IMAGE, "JPEG")
    with pytest.raises(ShardError, match="is 40x24 px, not 24x40 px"):
        decode_into(_raw(data), np.empty((40, 24, 3), dtype=np.uint8))
    with pytest.raises(ShardError, match="does not decode"):  # libjpeg alone would return grey-filled pixels
        decode_into(_raw(data[: len(data) // 2]), np.empty((24, 40, 3), dtype=np.uint8))
    with pytest.raises(ShardError, match="does not decode"):
        decode_into(_raw(b"not an image at all\xff\xd9"), np.empty((24, 40, 3), dtype=np.uint8))


def test_decode_into_refuses_a_bomb_from_its_header() -> None:
    jpeg = bytearray(_encoded(_RNG_IMAGE, "JPEG"))
    sof = jpeg.index(b"\xff\xc0")
    jpeg[sof + 5 : sof + 9] = struct.pack(">HH", 30000, 30000)
    raw = RawSample(key="s_x0_y0", shard="shard-000003.tar", image_ext="jpg", image=bytes(jpeg), meta=b"{}", label=None)
    with pytest.raises(ShardError) as info:
        decode_into(raw, np.empty((24, 40, 3), dtype=np.uint8))
    assert info.value.shard == "shard-000003.tar" and "s_x0_y0" in info.value.reason
    assert "30000x30000" in info.value.reason and "40x24" in info.value.reason


def test_batches_are_in_shared_memory_only_in_workers(stream_out: sm.Output, monkeypatch: pytest.MonkeyPatch) -> None:
    task = ShardRef(url=stream_out.path(0), samples=COUNTS[0])
    stage = DecodeIntoBatches(4, (16, 16), drop_last=False)
    plain = list(stage(read_shard(task, StreamOpener())))
    assert not any(b["image"].is_shared() for b in plain)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())  # as inside a DataLoader worker
    shared = list(stage(read_shard(task, StreamOpener())))
    assert all(b["image"].is_shared() for b in shared)  # handed over as a file descriptor, not copied
    for a, b in zip(plain, shared, strict=True):
        assert torch.equal(a["image"], b["image"]) and a["key"] == b["key"]
    assert [len(b["key"]) for b in plain] == [4, 4, 2]
