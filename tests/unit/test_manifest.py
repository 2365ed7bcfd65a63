"""Reading a manifest (:mod:`wsishard.manifest`) that may be hostile: shard names that are paths or URLs, a shard
listed twice, counts that are no counts, a credential in a bad name; and the patch size it holds every image to."""

from __future__ import annotations

import pytest

from wsishard.errors import ManifestError
from wsishard.manifest import Manifest, expected_patch_size


def _manifest(names: list[str], options: dict | None = None) -> dict:
    shards = [{"name": n, "samples": 1, "bytes": 10240, "sha256": "0" * 64} for n in names]
    return {"format": "wsishard", "version": 1, "options": options or {}, "shards": shards, "slides": []}


def test_shard_names_are_checked_when_a_manifest_is_read() -> None:
    assert len(Manifest.from_dict(_manifest(["shard-000000.tar", "shard-1234567.tar"])).shards) == 2
    for bad in (
        "../../x.tar",
        "/etc/x.tar",
        "s3://other/x.tar",
        "sub/shard-000001.tar",
        "shard-000001.tar/..",
        "shard-1.tar",
        "",
        "shard-000001.tar\n",
    ):
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


def test_index_digests_are_sha256_or_absent() -> None:
    data = _manifest(["shard-000000.tar"])
    assert Manifest.from_dict(data).shards[0].index_sha256 == "" and Manifest.from_dict(data).index_sha256 == ""
    data["shards"][0]["index_sha256"] = data["index_sha256"] = "ab" * 32
    back = Manifest.from_dict(Manifest.from_dict(data).to_dict())
    assert back.shards[0].index_sha256 == back.index_sha256 == "ab" * 32  # round trip
    for where in ("shard", "top"):
        for bad in (7, "AB" * 32, "ab" * 31, None):
            broken = _manifest(["shard-000000.tar"])
            (broken["shards"][0] if where == "shard" else broken)["index_sha256"] = bad
            with pytest.raises(ManifestError, match=r"index_sha256 .* not a sha256"):
                Manifest.from_dict(broken)


def test_expected_patch_size_comes_from_the_options() -> None:
    manifest = Manifest.from_dict(_manifest(["shard-000000.tar"], {"patch": {"patch_size_px": 224}}))
    assert expected_patch_size(manifest, "m") == 224
    for options in (
        {},
        {"patch": {}},
        {"patch": {"patch_size_px": "224"}},
        {"patch": {"patch_size_px": 0}},
        {"patch": 224},
        {"patch": {"patch_size_px": True}},
    ):
        with pytest.raises(ManifestError, match="patch_size_px") as info:
            expected_patch_size(Manifest.from_dict(_manifest(["shard-000000.tar"], options)), "out/manifest.json")
        assert info.value.location == "out/manifest.json"


def test_a_manifest_listing_a_shard_twice_is_refused() -> None:
    with pytest.raises(ManifestError, match=r"shard entry 2 \(shard-000000\.tar\) is entry 0 again: read twice"):
        Manifest.from_dict(_manifest(["shard-000000.tar", "shard-000001.tar", "shard-000000.tar"]), "m.json")
