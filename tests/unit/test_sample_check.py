"""A loader sample's common-case checks in C (wsishard/streaming/_samplecheck.c): what it calls valid, json.loads and
the Python header reader agree with, on hand-picked and on fuzzed input; batches equal with and without it; and the
batch's lazily parsed ``Metas``."""

from __future__ import annotations

import io
import json
import pickle
from typing import Any

import numpy as np
import pytest
from PIL import Image

from wsishard.errors import ShardError
from wsishard.imageheader import image_header
from wsishard.streaming import decode as decode_module
from wsishard.streaming.decode import DecodeIntoBatches, Metas
from wsishard.streaming.stages import RawSample

check = decode_module._check
META = {"background": 0.4836, "dark": 0.0, "extent": 512, "file": "slide-001.tif", "level": 0, "mpp": 0.5,
        "patch_size": 256, "sharpness": 1163.2102, "slide_id": "slide-001", "tissue": 0.5039, "x": 10240,
        "y": 4608}  # fmt: skip


def _jpeg(h: int = 24, w: int = 40, seed: int = 0, **kw: Any) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", **kw)
    return buf.getvalue()


JPEG = _jpeg()


def test_the_c_check_is_built() -> None:
    """The package builds it (``pip install -e .`` with a C compiler): CI must test the C path."""
    assert check is not None, ("wsishard.streaming._samplecheck was not built (no C compiler or Python headers when "
                               "pip installed the package?): the loader checks the same in Python, slower")  # fmt: skip


def _code(meta: bytes | str, image: bytes = JPEG) -> int:
    assert check is not None
    return int(check(image, meta.encode() if isinstance(meta, str) else meta, 24, 40))


@pytest.mark.parametrize(("text", "code"), [
    (json.dumps(META, sort_keys=True), 0), (json.dumps({**META, "label": 3}, sort_keys=True), 1),
    ('{"a": {"label": 1}}', 0), ('{"a": ["label"]}', 0), ('{"labels": 1, "xlabel": 2}', 0), ("{}", 0),
    (' \t\r\n{"a": [1, -2.5e-3, 0, true, false, null, {}, [], "s\\n\\u00e9\\"\\\\\\/"]} \n', 0),
    (json.dumps({"file": "sl\u00efde \u2603.svs"}), 0),  # escaped (json.dumps' ensure_ascii), as wsishard writes it
])  # fmt: skip
def test_valid_objects(text: str, code: int) -> None:
    assert _code(text) == code
    assert isinstance(json.loads(text), dict) and ("label" in json.loads(text)) == (code == 1)


@pytest.mark.parametrize("text", [
    "", " ", "[]", '"s"', "1", "null", '{"a": 1},', '{"a": 1}{}', '{"a": 1,}', '{"a" 1}', '{a: 1}', "{'a': 1}",
    '{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": 01}', '{"a": 1.}', '{"a": .5}', '{"a": 1e}',
    '{"a": +1}', '{"a": tru}', '{"a": "\x01"}', '{"a": "\\x"}', '{"a": "\\u12"}', '{"a": "', '{"a": 1',
    '{"lab\\u0065l": 1}', '{"\\n": 1}', "\ufeff{}", '{"a": "\u00e9"}', '{"a": ' + "[" * 70 + "]" * 70 + "}",
    '{"a": ' + "1" * 65 + "}", '{"a": 1}\x00', '{"a":\x0b1}',
])  # fmt: skip
def test_anything_else_is_left_to_python(text: str) -> None:
    """Invalid JSON, and valid JSON outside the strict subset (escaped top-level keys, non-ASCII, deep nesting,
    long numbers, NaN): -1, so the worker's Python path decides."""
    assert _code(text) == -1


def test_the_image_must_be_a_jpeg_of_the_size_ending_with_eoi() -> None:
    meta = json.dumps(META)
    assert _code(meta, JPEG) == 0
    assert check is not None
    assert check(JPEG, meta.encode(), 40, 24) == -1  # the other way round
    assert _code(meta, JPEG[:-2]) == -1 and _code(meta, JPEG[: len(JPEG) // 2]) == -1
    assert _code(meta, _jpeg(progressive=True)) == 0
    png = io.BytesIO()
    Image.new("RGB", (40, 24)).save(png, "PNG")
    assert _code(meta, png.getvalue()) == -1 and _code(meta, b"") == -1 and _code(meta, b"\xff\xd8\xff\xd9") == -1


def _mutants(seed: bytes, rng: np.random.Generator, n: int) -> list[bytes]:
    """``n`` random edits of ``seed``: bytes flipped to interesting values, deleted, inserted, cut."""
    alphabet = b'{}[]",:.-+eE0123456789 \t\n\\ulabtrfn\x00\x1f\x7f\x80\xff'
    out = []
    for _ in range(n):
        data = bytearray(seed)
        for _ in range(int(rng.integers(1, 4))):
            op, at = int(rng.integers(0, 4)), int(rng.integers(0, max(len(data), 1)))
            byte = alphabet[int(rng.integers(0, len(alphabet)))]
            if op == 0 and data:
                data[at] = byte
            elif op == 1 and data:
                del data[at]
            elif op == 2:
                data.insert(at, byte)
            else:
                data = data[:at]
        out.append(bytes(data))
    return out


def _python_reads(text: bytes) -> Any:
    try:
        return json.loads(text.decode("utf-8"))
    except (ValueError, RecursionError):
        return ValueError


def test_fuzzed_json_never_called_valid_when_python_refuses_it() -> None:
    rng = np.random.default_rng(0)
    seeds = [json.dumps(META, sort_keys=True).encode(), json.dumps({**META, "label": 2}).encode(),
             b'{"a": [1, {"b": "c\\u00e9"}, -0.5e+3, true, null], "label": "x"}']  # fmt: skip
    called_valid = 0
    for seed in seeds:
        for text in _mutants(seed, rng, 6000):
            code = _code(text)
            if code >= 0:
                value = _python_reads(text)
                assert isinstance(value, dict), text
                assert ("label" in value) == (code == 1), text
                called_valid += 1
    assert called_valid > 500  # the fuzz reaches valid mutants too, not only refusals


def test_fuzzed_jpeg_headers_never_called_valid_when_the_header_reader_disagrees() -> None:
    rng = np.random.default_rng(1)
    meta = json.dumps(META).encode()
    head = 700  # edits within the markers before the scan
    called_valid = 0
    for image in (JPEG, _jpeg(progressive=True, quality=50), _jpeg(subsampling=0)):
        for mutant in _mutants(image[:head], rng, 3000):
            data = mutant + image[head:]
            assert check is not None
            if check(data, meta, 24, 40) == 0:
                assert image_header(data) == ("jpg", 40, 24) and data.endswith(b"\xff\xd9")
                called_valid += 1
    assert called_valid > 100


def _raw(key: str, meta: bytes, image: bytes = JPEG, label: bytes | None = None) -> RawSample:
    return RawSample(key=key, shard="s.tar", image_ext="jpg", image=image, meta=meta, label=label)


def _samples() -> list[RawSample]:
    png = io.BytesIO()
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (24, 40, 3), dtype=np.uint8)).save(png, "PNG")
    plain = json.dumps(META).encode()
    return [
        _raw("a", plain), _raw("b", json.dumps({**META, "label": 4}).encode()),  # the label in the JSON
        _raw("c", plain, label=b"7"), _raw("d", json.dumps({**META, "label": 4}).encode(), label=b"2"),  # .cls wins
        _raw("e", plain, image=png.getvalue()),
        _raw("f", json.dumps({"file": "\u00e9.svs"}, ensure_ascii=False).encode()),  # raw UTF-8: Python reads it
        _raw("g", b'{"\\u0061": 1e400}', image=_jpeg(seed=3)), _raw("h", plain, image=_jpeg(seed=4, progressive=True)),
        _raw("i", b'{"a": '), _raw("j", plain, image=JPEG[:-100]), _raw("k", plain, label=b"x"),
        _raw("l", b'{"label": "x"}'), _raw("m", b"[" * 50_000), _raw("n", plain, image=_jpeg(40, 24)),
    ]  # fmt: skip


def _run(monkeypatch: pytest.MonkeyPatch, with_c: bool, on_error: str) -> list[dict[str, Any]]:
    with monkeypatch.context() as m:
        if not with_c:
            m.setattr(decode_module, "_check", None)
        stage = DecodeIntoBatches(3, (24, 40), drop_last=False, on_error=on_error)  # type: ignore[arg-type]
        return [{"image": b["image"].clone(), "label": b["label"].tolist(), "meta": list(b["meta"]), "key": b["key"]}
                for b in stage(iter(_samples()))]  # fmt: skip


def test_batches_are_the_same_with_and_without_the_c_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same samples kept, pixels, labels (``.cls``, else the JSON's, else -1) and metadata; the same broken
    samples skipped."""
    fast, slow = _run(monkeypatch, True, "skip"), _run(monkeypatch, False, "skip")
    assert [b["key"] for b in fast] == [["a", "b", "c"], ["d", "e", "f"], ["g", "h"]]
    assert [b["label"] for b in fast] == [[-1, 4, 7], [2, -1, -1], [-1, -1]]
    for a, b in zip(fast, slow, strict=True):
        assert a["key"] == b["key"] and a["label"] == b["label"] and a["meta"] == b["meta"]
        assert a["image"].equal(b["image"])
    assert fast[0]["meta"][0] == META and fast[2]["meta"][0] == {"a": float("inf")}  # as json.loads reads them


@pytest.mark.parametrize("with_c", [True, False])
@pytest.mark.parametrize(("key", "message"), [("i", "does not decode"), ("j", "does not decode"),
                                              ("k", "does not decode"), ("m", "does not decode"),
                                              ("n", "is 24x40 px, not 40x24 px")])  # fmt: skip
def test_a_broken_sample_is_named_with_or_without_it(monkeypatch: pytest.MonkeyPatch, with_c: bool, key: str,
                                                     message: str) -> None:  # fmt: skip
    with monkeypatch.context() as m:
        if not with_c:
            m.setattr(decode_module, "_check", None)
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
