"""A loader sample's checks in the workers (its JSON parsed, its label, its image's header and size): what a batch
keeps and what it names as broken; and the batch's lazily parsed ``Metas``."""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

import numpy as np
import pytest
from PIL import Image

from wsishard.errors import ShardError
from wsishard.streaming.decode import DecodeIntoBatches, Metas
from wsishard.streaming.stages import RawSample

META = {
    "background": 0.4836,
    "dark": 0.0,
    "extent": 512,
    "file": "slide-001.tif",
    "level": 0,
    "patch_mpp": 0.5,
    "patch_size": 256,
    "sharpness": 1163.2102,
    "slide_id": "slide-001",
    "tissue": 0.5039,
    "x": 10240,
    "y": 4608,
}


def _jpeg(h: int = 24, w: int = 40, seed: int = 0, **kw: Any) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **kw)
    return buf.getvalue()


JPEG = _jpeg()


def _raw(key: str, meta: bytes, image: bytes = JPEG, label: bytes | None = None) -> RawSample:
    return RawSample(key=key, shard="s.tar", image_ext="jpg", image=image, meta=meta, label=label)


def _samples() -> list[RawSample]:
    png = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(png, "PNG")
    plain = json.dumps(META).encode()
    return [
        _raw("a", plain),
        _raw("b", json.dumps({**META, "label": 4}).encode()),  # the label in the JSON
        _raw("c", plain, label=b"7"),
        _raw("d", json.dumps({**META, "label": 4}).encode(), label=b"2"),  # .cls wins
        _raw("e", plain, image=png.getvalue()),
        _raw("f", json.dumps({"file": "\u00e9.svs"}, ensure_ascii=False).encode()),  # raw UTF-8: Python reads it
        _raw("g", b'{"\\u0061": 1e400}', image=_jpeg(seed=3)),
        _raw("h", plain, image=_jpeg(seed=4, progressive=True)),
        _raw("i", b'{"a": '),
        _raw("j", plain, image=JPEG[:-100]),
        _raw("k", plain, label=b"x"),
        _raw("l", b'{"label": "x"}'),
        _raw("m", b"[" * 50_000),
        _raw("n", plain, image=_jpeg(40, 24)),
    ]


def _run(on_error: str) -> list[dict[str, Any]]:
    stage = DecodeIntoBatches(3, (24, 40), drop_last=False, on_error=on_error)  # type: ignore[arg-type]
    return [
        {"image": b["image"].clone(), "label": b["label"].tolist(), "meta": list(b["meta"]), "key": b["key"]}
        for b in stage(iter(_samples()))
    ]


def test_batches_keep_the_good_samples_with_their_labels_and_metadata() -> None:
    """Labels: ``.cls``, else the JSON's, else -1; broken samples skipped; the metadata as json.loads reads it."""
    batches = _run("skip")
    assert [b["key"] for b in batches] == [["a", "b", "c"], ["d", "e", "f"], ["g", "h"]]
    assert [b["label"] for b in batches] == [[-1, 4, 7], [2, -1, -1], [-1, -1]]
    assert batches[0]["meta"][0] == META and batches[2]["meta"][0] == {"a": float("inf")}
    want = {"a": JPEG, "e": None, "g": _jpeg(seed=3), "h": _jpeg(seed=4, progressive=True)}
    for b in batches:
        for key, image in zip(b["key"], b["image"], strict=True):
            if want.get(key) is not None:
                assert np.array_equal(image.numpy(), np.asarray(Image.open(io.BytesIO(want[key])).convert("RGB")))


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("i", "does not decode"),
        ("j", "does not decode"),
        ("k", "does not decode"),
        ("m", "does not decode"),
        ("n", "is 24x40 px, not 40x24 px"),
    ],
)
def test_a_broken_sample_is_named(key: str, message: str) -> None:
    sample = next(s for s in _samples() if s["key"] == key)
    with pytest.raises(ShardError, match=f"sample {key} {message}"):
        list(DecodeIntoBatches(1, (24, 40))(iter([sample])))


def test_metas_parse_when_read_and_keep_what_was_changed() -> None:
    texts = [json.dumps({"i": i}).encode() for i in range(5)]
    metas = Metas(texts)
    assert len(metas) == 5 and all(isinstance(x, bytes) for x in metas._items)  # nothing parsed yet
    assert metas[1] == {"i": 1} and sum(isinstance(x, bytes) for x in metas._items) == 4
    assert metas[-1] == {"i": 4} and metas[1:3] == [{"i": 1}, {"i": 2}] and next(iter(metas)) == {"i": 0}
    assert metas == [{"i": i} for i in range(5)] and metas != [{"i": 0}] and metas != "abc"
    assert metas != tuple(metas)  # as a list is never equal to a tuple
    metas[2]["seen"] = True
    assert metas[2] is metas[2] and metas[2]["seen"]
    back = pickle.loads(pickle.dumps(metas))
    assert back == metas and back[2]["seen"] and repr(back).startswith("Metas([{'i': 0}")
    with pytest.raises(IndexError):
        metas[5]
    with pytest.raises(TypeError):
        hash(metas)


def test_metas_survive_pytorchs_rebuilding_of_sequences() -> None:
    """DataLoader's pin_memory (a loader without workers on CUDA, .repeat(), a user's collate_fn) and
    default_convert rebuild a sequence as ``type(data)([...items...])``: the items are then dicts, not texts."""
    from torch.utils.data._utils.collate import default_convert
    from torch.utils.data._utils.pin_memory import pin_memory

    metas = Metas([b'{"x": 1}', b'{"x": [2, 3]}'])
    metas[0]["y"] = 4  # read and changed before the rebuild
    for rebuilt in (default_convert(metas), pin_memory(metas), Metas(list(metas))):
        assert isinstance(rebuilt, Metas) and rebuilt == [{"x": 1, "y": 4}, {"x": [2, 3]}]
