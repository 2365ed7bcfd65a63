"""A multi-mpp build (``--mpp 0.5 1.0 2.0``) against three builds of one mpp each, on synthetic slides at real
scanners' level-0 mpp: the same (slide, x, y) per mpp, the same pixels, unique keys naming their scale, the index's
``mpp`` column for ``select=``/``weights=``, the list through ``--config`` and ``inspect``, bad lists refused."""

from __future__ import annotations

import collections
import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from buildtools import Sample, read_output, usage_error

import wsishard
from wsishard.builder.options.config import tomllib  # tomli before Python 3.11
from wsishard.cli import main
from wsishard.errors import OptionError
from wsishard.format import is_sample_key, key_slide, mpp_tag
from wsishard.testing.synthetic import make_slide

MPPS = (0.5, 1.0, 2.0)
Builds = dict[object, tuple[Path, list[Sample]]]  # "multi" and each mpp -> (output, its samples)
SCANNERS = (0.2520, 0.2631, 0.2265)  # Aperio AT2, GT450, NanoZoomer level-0 mpp


@pytest.fixture(scope="module")
def slides(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("multimpp") / "slides"
    root.mkdir()
    for i, mpp in enumerate(SCANNERS):
        make_slide(root / f"scanner-{i}.svs", width=6144, height=5120, mpp=mpp, seed=40 + i, tissue_fraction=0.4)
    return root


@pytest.fixture(scope="module")
def builds(slides: Path) -> Builds:
    """The 3-mpp build (key "multi") and one build per mpp (keys 0.5, 1.0, 2.0): 128 px patches, shards of 60
    samples, one job."""
    out: Builds = {}
    for name, mpp in [("multi", list(MPPS)), *((m, m) for m in MPPS)]:
        root = slides.parent / f"out-{name}"
        wsishard.build([str(slides)], str(root), mpp=mpp, patch_size=128, shard_samples=60, jobs=1)
        out[name] = (root, read_output(str(root))[1])
    return out


def _by_mpp(samples: list[Sample]) -> dict[float, dict[tuple[str, int, int], Sample]]:
    got: dict[float, dict[tuple[str, int, int], Sample]] = collections.defaultdict(dict)
    for s in samples:
        meta = s.meta
        got[round(meta["patch_mpp"], 6)][(meta["slide_id"], meta["x"], meta["y"])] = s
    return got


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10 * np.log10(255.0**2 / mse)


def test_each_scale_has_the_samples_and_pixels_of_its_own_build(builds: Builds) -> None:
    multi = _by_mpp(builds["multi"][1])
    assert sorted(multi) == list(MPPS)
    for mpp in MPPS:
        single = _by_mpp(builds[mpp][1])
        assert list(single) == [mpp]
        both = multi[mpp].keys() & single[mpp].keys()
        overlap = len(both) / max(len(multi[mpp].keys() | single[mpp].keys()), 1)
        assert len(single[mpp]) >= 8 and overlap == 1.0, (mpp, overlap)  # the same scan: every (slide, x, y)
        worst = min(_psnr(multi[mpp][k].image(), single[mpp][k].image()) for k in both)
        assert worst >= 40.0, (mpp, worst)
        same_bytes = sum(multi[mpp][k].members["jpg"] == single[mpp][k].members["jpg"] for k in both)
        assert same_bytes == len(both), (mpp, same_bytes, len(both))  # the same code path: the same JPEG bytes
        for k in both:
            m, s = dict(multi[mpp][k].meta), dict(single[mpp][k].meta)
            assert m == s  # every .json field, patch_mpp included


def test_keys_are_unique_and_name_their_scale(builds: Builds) -> None:
    samples = builds["multi"][1]
    keys = [s.key for s in samples]
    assert len(set(keys)) == len(keys)
    for s in samples:
        meta = s.meta
        assert is_sample_key(s.key) and f"_{mpp_tag(meta['patch_mpp'])}_x" in s.key
        assert key_slide(s.key, multi_mpp=True) == meta["slide_id"]
    assert all(s.key == f"{s.meta['slide_id']}_x{s.meta['x']}_y{s.meta['y']}" for s in builds[0.5][1])  # plain
    shards = {s.shard for s in samples}
    mixed = [sh for sh in shards if len({s.meta["patch_mpp"] for s in samples if s.shard == sh}) > 1]
    assert mixed  # the scales' blocks are dealt to shards together


def test_manifest_records_the_list_and_a_one_item_list_is_the_plain_build(builds: Builds, slides: Path) -> None:
    root = builds["multi"][0]
    options = json.loads((root / "manifest.json").read_text())["options"]
    assert options["patch"]["target_mpp"] == list(MPPS)
    assert main(["verify", str(root)]) == 0  # every sample checked against the manifest
    one = slides.parent / "out-one-item"
    wsishard.build([str(slides)], str(one), mpp=[0.5], patch_size=128, shard_samples=60, jobs=1)
    single = builds[0.5][0]
    assert (
        json.loads((one / "manifest.json").read_text())["options"]
        == json.loads((single / "manifest.json").read_text())["options"]
    )
    for shard in sorted(single.glob("shard-*.tar")):
        assert (one / shard.name).read_bytes() == shard.read_bytes()


def _stream_keys(root: Path, **kw: object) -> list[str]:
    ds = wsishard.stream(str(root), batch_size=4, seed=1, **kw)  # type: ignore[arg-type]
    return [k for batch in ds for k in batch["key"]]


def test_select_on_mpp_streams_that_magnification_only(builds: Builds) -> None:
    root, samples = builds["multi"]
    per_mpp = collections.Counter(round(s.meta["patch_mpp"], 6) for s in samples)
    for mpp in MPPS:
        keys = _stream_keys(root, resampled=False, drop_last=False, select=lambda t, m=mpp: t["mpp"] == m)
        assert keys and all(f"_{mpp_tag(mpp)}_x" in k for k in keys)
        assert len(keys) == per_mpp[mpp] and len(set(keys)) == len(keys)


def test_weights_on_mpp_draw_in_proportion(builds: Builds) -> None:
    root, _ = builds["multi"]

    def weights(t: dict[str, np.ndarray]) -> np.ndarray:
        return np.where(t["mpp"] == 2.0, 1.0, 0.0)  # only 2 mpp

    ds = wsishard.stream(str(root), batch_size=4, seed=1, weights=weights)
    keys = [k for batch in itertools.islice(iter(ds), 25) for k in batch["key"]]
    assert len(keys) == 100 and all(f"_{mpp_tag(2.0)}_x" in k for k in keys)


def test_config_round_trip_with_a_list(
    builds: Builds, slides: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = builds["multi"][0]
    capsys.readouterr()
    assert main(["inspect", str(root), "--options"]) == 0
    text = capsys.readouterr().out
    assert tomllib.loads(text)["patches"]["mpp"] == list(MPPS)
    (tmp_path / "multi.toml").write_text(text)
    out = tmp_path / "again"
    assert main(["build", str(slides), "-o", str(out), "--config", str(tmp_path / "multi.toml"), "-q"]) == 0
    for shard in sorted(root.glob("shard-*.tar")):
        assert (out / shard.name).read_bytes() == shard.read_bytes()
    flags = tmp_path / "flags"
    args = ["build", str(slides), "-o", str(flags), "--mpp", "2.0", "0.5", "1.0", "--patch-size", "128"]
    args += ["--shard-samples", "60"]
    assert main([*args, "--jobs", "1", "-q"]) == 0
    assert json.loads((flags / "manifest.json").read_text())["options"]["patch"]["target_mpp"] == list(MPPS)
    for shard in sorted(root.glob("shard-*.tar")):
        assert (flags / shard.name).read_bytes() == shard.read_bytes()


@pytest.mark.parametrize(
    ("value", "says"),
    [([], "invalid target_mpp: []"), ([0.5, -1.0], "invalid target_mpp: -1.0"), ([0.5, 1, 0.5], "0.5 is given twice")],
)
def test_a_bad_list_is_one_line_naming_the_value(tmp_path: Path, value: list[float], says: str) -> None:
    with pytest.raises(OptionError, match=says.replace("[", r"\[").replace("]", r"\]")) as info:
        wsishard.build([str(tmp_path)], str(tmp_path / "out"), mpp=value)
    assert "\n" not in str(info.value)
    assert not (tmp_path / "out").exists()


def test_bad_lists_on_the_command_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "--mpp: must be > 0: '-2'" in usage_error(capsys, "S", "-o", "O", "--mpp", "0.5", "-2")
    twice = usage_error(capsys, "S", "-o", "O", "--mpp", "1", "0.5", "1")
    assert "1.0 is given twice" in twice and len(twice.strip().splitlines()) == 1
    assert "expected at least one argument" in usage_error(capsys, "S", "-o", "O", "--mpp")
    config = tmp_path / "bad.toml"
    config.write_text('[patches]\nmpp = [0.5, "x"]\n')
    said = usage_error(capsys, "S", "-o", "O", "--config", str(config))
    assert "mpp" in said and "'x'" in said and len(said.strip().splitlines()) == 1


def test_a_rerun_rewrites_a_deleted_shard_from_the_saved_scans(builds: Builds, slides: Path, tmp_path: Path) -> None:
    root = builds["multi"][0]
    out = tmp_path / "out"
    shutil.copytree(root, out)
    scans = sorted((out / ".wsishard" / "scan").glob("*.npz"))
    assert scans and all("scales" in json.loads(decode_meta(p)) for p in scans)  # every scale's grid saved
    victim = sorted(out.glob("shard-*.tar"))[1]
    victim.unlink()
    wsishard.build([str(slides)], str(out), mpp=list(MPPS), patch_size=128, shard_samples=60, jobs=1)
    assert victim.read_bytes() == (root / victim.name).read_bytes()


def decode_meta(path: Path) -> bytes:
    with np.load(path, allow_pickle=False) as arrays:
        return arrays["meta"].tobytes()


def test_inspect_counts_the_samples_of_each_mpp(builds: Builds, capsys: pytest.CaptureFixture[str]) -> None:
    root, samples = builds["multi"]
    per_mpp = collections.Counter(round(s.meta["patch_mpp"], 6) for s in samples)
    capsys.readouterr()
    assert main(["inspect", str(root)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("samples per mpp: "))
    assert line == "samples per mpp: " + ", ".join(f"{m:g} mpp {per_mpp[m]} patches" for m in MPPS)
    assert main(["inspect", str(builds[0.5][0])]) == 0
    assert "samples per mpp" not in capsys.readouterr().out  # a build of one mpp: its one mpp is in the options line


def test_a_labelled_multi_mpp_build_verifies(slides: Path, tmp_path: Path) -> None:
    labels = {f"scanner-{i}.svs": i % 2 for i in range(len(SCANNERS))}
    out = tmp_path / "labelled"
    wsishard.build([str(slides)], str(out), mpp=[1.0, 2.0], labels=labels, patch_size=128, jobs=1)
    _, samples = read_output(str(out))
    assert {(s.meta["slide_id"], s.members["cls"]) for s in samples} == {
        (f"scanner-{i}", str(i % 2).encode()) for i in range(len(SCANNERS))
    }
    assert main(["verify", str(out)]) == 0  # each key's slide (its scale tag left out) has its label


def test_the_shards_are_the_same_whatever_the_jobs(builds: Builds, slides: Path, tmp_path: Path) -> None:
    """Every scale's blocks are dealt and read by the plan alone: two jobs write the same bytes."""
    root, _ = builds["multi"]
    wsishard.build([str(slides)], str(tmp_path / "two"), mpp=list(MPPS), patch_size=128, shard_samples=60, jobs=2)
    shards = sorted(root.glob("shard-*.tar"))
    assert len(shards) >= 2 and [p.name for p in shards] == sorted(p.name for p in (tmp_path / "two").glob("*.tar"))
    for shard in shards:
        assert (tmp_path / "two" / shard.name).read_bytes() == shard.read_bytes(), shard.name
