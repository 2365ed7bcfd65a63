"""A build output's files tampered with (issue 42, the stream and format side): JSON nested past the parser's depth,
numbers no parser converts, fields of the wrong type or out of range. Each is one ``ManifestError`` line naming the
file (exit status 2 from ``verify`` and ``inspect``), never a bare ``RecursionError`` or ``TypeError``."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import shardmaker as sm
from streamtools import keys_of as sm_keys

from wsishard.augment.stain import StainTable
from wsishard.cli import main
from wsishard.errors import ManifestError, ShardError
from wsishard.manifest import SlideRecord, manifest_files
from wsishard.streaming.sources import stream

DEEP = "[" * 300_000 + "]" * 300_000  # a JSON text Python's parser gives up on with RecursionError


def _split_output(root: Path) -> sm.Output:
    """A small output whose slide records are in ``slides.jsonl`` beside ``manifest.json``, as a build writes."""
    out = sm.make_output(str(root), (4, 4), slides=2)
    for name, data in manifest_files(out.manifest):
        (root / name).write_bytes(data)
    return out


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    status = main(list(args))
    return status, capsys.readouterr().err.strip()


@pytest.mark.parametrize("name", ["manifest.json", "slides.jsonl"])
def test_json_nested_too_deep_is_a_manifest_error_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    out = _split_output(tmp_path / "o")
    (tmp_path / "o" / name).write_text(DEEP if name == "manifest.json" else "\n" + DEEP + "\n")
    for command in ("verify", "inspect"):
        status, err = _cli(capsys, command, out.root)
        assert status == 2, err
        assert len(err.splitlines()) == 1 and name in err and "nested too deep" in err
        assert "RecursionError" not in err
    if name == "manifest.json":
        with pytest.raises(ManifestError, match="nested too deep") as info:
            stream(out.root, batch_size=2)
        assert info.value.location.endswith("manifest.json")
    with pytest.raises(ManifestError, match="nested too deep") as info:
        StainTable.from_build(out.root)
    assert info.value.location.endswith(name)
    if name == "slides.jsonl":
        assert info.value.reason.startswith("line 2 is JSON nested too deep")


@pytest.mark.parametrize("name", ["manifest.json", "slides.jsonl"])
def test_an_integer_too_long_to_convert_is_a_manifest_error(tmp_path: Path, name: str) -> None:
    out = _split_output(tmp_path / "o")
    path = tmp_path / "o" / name
    text = path.read_text()
    field = '"samples": 4' if name == "manifest.json" else '"width": 10000'
    assert field in text
    path.write_text(text.replace(field, field.split(":")[0] + ": " + "9" * 5000, 1))
    with pytest.raises(ManifestError, match="not valid JSON") as info:
        StainTable.from_build(out.root)
    assert info.value.location.endswith(name) and len(str(info.value)) < 400


def _with_mpp(root: Path, mpp: object, prefix: str) -> sm.Output:
    """A small output whose options record ``target_mpp`` ``mpp`` (deleted when None)."""
    out = sm.make_output(str(root), (4,), slide_prefix=prefix)
    patch = dict(out.manifest.options["patch"])
    if mpp is None:
        del patch["target_mpp"]
    else:
        patch["target_mpp"] = mpp
    out.manifest = type(out.manifest)(**{**vars(out.manifest), "options": {**out.manifest.options, "patch": patch}})
    sm.write_manifest(out)
    return out


def test_outputs_of_different_mpps_are_refused_unless_mixed_on_purpose(tmp_path: Path) -> None:
    half, one = _with_mpp(tmp_path / "a", 0.5, "a"), _with_mpp(tmp_path / "b", 1.0, "b")
    with pytest.raises(ManifestError, match="different mpps") as info:
        stream([half.root, one.root], batch_size=2)
    message = str(info.value)
    assert f"{half.root}: 0.5 mpp" in message and f"{one.root}: 1 mpp" in message and "mixed_mpp=True" in message
    mixed = stream([half.root, one.root], batch_size=2, resampled=False, mixed_mpp=True)
    assert sorted(sm_keys(mixed)) == sorted(half.keys["shard-000000-0000.tar"] + one.keys["shard-000000-0000.tar"])
    assert (
        len(sm_keys(stream([half.root, _with_mpp(tmp_path / "c", 0.5, "c").root], batch_size=2, resampled=False))) == 8
    )
    unknown = _with_mpp(tmp_path / "d", None, "d")
    with pytest.raises(ManifestError, match="mpp not recorded"):
        stream([half.root, unknown.root], batch_size=2)


def test_a_build_that_records_several_mpps_is_its_own_opt_in(tmp_path: Path) -> None:
    several = _with_mpp(tmp_path / "a", [1.0, 0.5], "a")
    assert len(sm_keys(stream(several.root, batch_size=2, resampled=False))) == 4
    same = _with_mpp(tmp_path / "b", [0.5, 1.0], "b")
    assert len(sm_keys(stream([several.root, same.root], batch_size=2, resampled=False))) == 8
    with pytest.raises(ManifestError, match=r"0\.5 and 1 mpp"):
        stream([several.root, _with_mpp(tmp_path / "c", 0.5, "c").root], batch_size=2)


@pytest.mark.parametrize("mpp", [math.nan, -0.5, 0, "0.5", True, [], [0.5, math.inf], {"x": 1}])
def test_a_target_mpp_that_is_no_mpp_is_a_manifest_error(tmp_path: Path, mpp: object) -> None:
    out = _with_mpp(tmp_path / "a", mpp, "a")
    with pytest.raises(ManifestError, match=r"options\.patch\.target_mpp is") as info:
        stream(out.root, batch_size=2)
    assert info.value.location == out.root and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("name", "before", "after", "field"),
    [
        ("manifest.json", '"sha256": "', '"sha256": 5, "x": "', "sha256"),
        ("manifest.json", '"slides": 2, "index_sha256"', '"slides": "x", "index_sha256"', "slides"),
        ("manifest.json", '\n "image_format": "jpg"', '\n "image_format": 3', "image_format"),
        ("slides.jsonl", '"slide_id": "slide0"', '"slide_id": ["slide0"]', "slide_id"),
        ("slides.jsonl", '"slide_mpp": 0.25', '"slide_mpp": "x"', "slide_mpp"),
    ],
)
def test_verify_and_inspect_name_a_field_of_the_wrong_kind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, before: str, after: str, field: str
) -> None:
    """Each of these was a TypeError or ValueError of Python's own in ``inspect`` or ``verify``: exit status 3."""
    out = _split_output(tmp_path / "o")
    path = tmp_path / "o" / name
    text = path.read_text()
    assert before in text
    path.write_text(text.replace(before, after, 1))
    for command in ("verify", "inspect"):
        status, err = _cli(capsys, command, out.root)
        assert status == 2 and name in err and field in err and len(err.splitlines()) == 1, err


def test_a_context_size_past_any_build_is_refused_before_a_stream_allocates_it(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "o"), (4,))
    options = {**out.manifest.options, "context_mpp": [2.0], "context_size": 10**6}
    out.manifest = type(out.manifest)(**{**vars(out.manifest), "options": options})
    sm.write_manifest(out)
    with pytest.raises(ManifestError, match=r"options\.context_size is 1000000"):
        stream(out.root, batch_size=2)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda meta: [1], ".json is [1], not a JSON object"),
        (lambda meta: {**meta, "slide_id": ["slide0"]}, ".json's slide_id is ['slide0'], not text"),
    ],
)
def test_a_sample_json_that_is_no_patch_record_is_a_shard_error_or_skipped(
    tmp_path: Path, change: Callable[[dict], object], said: str
) -> None:
    """A labelled sample's .json was parsed and passed on whatever it held: a list reached batch["meta"], and the
    Macenko collate failed on it with a bare TypeError."""
    out = sm.make_output(str(tmp_path / "o"), (4,))
    key = out.keys["shard-000000-0000.tar"][1]
    sm.rewrite_member(out, 0, key, "json", lambda b: json.dumps(change(json.loads(b))).encode())
    sm.refresh_record(out, 0)
    with pytest.raises(ShardError) as info:
        list(stream(out.root, batch_size=2, resampled=False))
    assert info.value.shard.endswith("shard-000000-0000.tar") and key in str(info.value) and said in str(info.value)
    kept = sm_keys(stream(out.root, batch_size=1, resampled=False, on_error="skip"))
    assert sorted(kept) == sorted(k for k in out.keys["shard-000000-0000.tar"] if k != key)


def test_a_slide_id_that_is_no_text_is_a_clear_key_error_in_the_table() -> None:
    stain = {"matrix": [[0.65, 0.18], [0.70, 0.85], [0.29, 0.49]], "max_conc": [2.1, 1.3], "source": "fitted"}
    table = StainTable([SlideRecord(slide_id="a", file="a.svs", status="ok", stain=stain)])
    assert table.rows(["a", "a"]).tolist() == [0, 0]
    for bad in (None, ["a"]):
        with pytest.raises(KeyError, match=rf"slide {re.escape(repr(bad))} has no stain matrix"):
            table.rows(["a", bad])  # type: ignore[list-item]
