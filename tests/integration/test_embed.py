"""``wsishard embed``: a user's model over every patch of a real (small) build, one sample per slide out.

The model is ``embedmodels:mean_linear`` (tests/embedmodels.py): per-channel means of the normalized image, then a
fixed linear layer, so each patch's features are computed here by hand from its decoded JPEG.
"""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from buildtools import read_output
from embedmodels import DIM, MeanLinear, make_source
from PIL import Image

from wsishard.embedding.options import IMAGENET_MEAN, IMAGENET_STD, EmbedOptions
from wsishard.embedding.run import EmbedProgress, embed
from wsishard.errors import ManifestError, ModelError, OptionError

LABELS = {"slide-000": 1, "slide-001": 0}  # slide-002 unlabelled
OPTS = EmbedOptions(device="cpu", batch_size=16, num_workers=1, part_samples=60)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three generated slides built into shards of 40 patches or fewer (64 px), two of them labelled."""
    return make_source(tmp_path_factory.mktemp("embed-src"), LABELS)


@pytest.fixture(scope="module")
def embedded(source: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("embed-out") / "emb"
    embed(source, out, model="embedmodels:mean_linear", options=OPTS)
    return out


def _expected(jpeg: bytes) -> np.ndarray:
    """The model applied by hand to a patch's decoded JPEG: (D,) float64."""
    image = np.asarray(Image.open(io.BytesIO(jpeg)).convert("RGB"), dtype=np.float64) / 255  # (h, w, 3)
    x = ((image - IMAGENET_MEAN) / IMAGENET_STD).mean(axis=(0, 1))  # (3,)
    linear = MeanLinear().linear
    return linear.weight.detach().double().numpy() @ x + linear.bias.detach().double().numpy()


def _slides(out: Path) -> dict[str, dict]:
    _, samples = read_output(str(out))
    slides = {}
    for s in samples:
        feats = np.load(io.BytesIO(s.members["features.npy"]), allow_pickle=False)
        coords = np.load(io.BytesIO(s.members["coords.npy"]), allow_pickle=False)
        cls = int(s.members["cls"]) if "cls" in s.members else None
        keys = json.loads(s.members["keys.json"])
        slides[s.key] = {"features": feats, "coords": coords, "keys": keys, "cls": cls, **s.meta}
    return slides


def test_every_patch_is_embedded_once_with_the_models_features_and_its_coords(source: Path, embedded: Path) -> None:
    _, patches = read_output(str(source))
    by_key = {p.key: p for p in patches}
    slides = _slides(embedded)
    assert sorted(slides) == sorted({p.meta["slide_id"] for p in patches})
    keys = [k for s in slides.values() for k in s["keys"]]
    assert sorted(keys) == sorted(by_key) and len(keys) == len(set(keys))  # every source patch exactly once
    for slide_id, s in slides.items():
        n = len(s["keys"])
        assert s["features"].shape == (n, DIM) and s["features"].dtype == np.float16
        assert s["coords"].shape == (n, 2) and s["coords"].dtype == np.int32
        assert s["patches"] == n and s["dim"] == DIM and s["model"] == "embedmodels:mean_linear"
        assert s["slide_id"] == slide_id and s["patch_size"] == 64
        assert s["cls"] == s.get("label") == LABELS.get(slide_id)  # .cls only where labelled
        for row, key in enumerate(s["keys"]):
            meta = by_key[key].meta
            assert meta["slide_id"] == slide_id
            assert s["coords"][row].tolist() == [meta["x"], meta["y"]]
            want = _expected(by_key[key].members["jpg"])
            np.testing.assert_allclose(s["features"][row].astype(np.float64), want, rtol=2e-3, atol=2e-3)


def test_the_manifest_marks_an_embeddings_output_and_its_source(source: Path, embedded: Path) -> None:
    from wsishard.embedding.parts import source_id
    from wsishard.storage.opener import load_manifest

    manifest, _ = load_manifest(str(embedded))
    src, _ = load_manifest(str(source))
    assert manifest.extra["kind"] == "embeddings"
    assert manifest.extra["embed"]["source_id"] == source_id(src) and manifest.extra["embed"]["dim"] == DIM
    assert manifest.options["embed"]["mean"] == list(IMAGENET_MEAN)
    assert {s.slide_id: s.patches for s in manifest.slides} == {s.slide_id: s.patches for s in src.slides}


class _Killed(Exception):
    pass


def test_a_killed_run_resumes_and_embeds_only_what_it_had_not(source: Path, embedded: Path, tmp_path: Path) -> None:
    out = tmp_path / "emb"
    first = out / ".wsishard" / "embed" / "part-000000.npz"

    def kill_once_a_part_is_written(event: EmbedProgress) -> None:
        if first.exists():
            raise _Killed  # as if the process died in the middle of the next part

    with pytest.raises(_Killed):
        embed(source, out, model="embedmodels:mean_linear", options=OPTS, progress=kill_once_a_part_is_written)
    assert not (out / "manifest.json").exists()
    assert sorted(p.name for p in first.parent.iterdir()) == ["part-000000.npz"]
    n_first = len(json.loads(np.load(first, allow_pickle=False)["info"].tobytes())["keys"])

    events: list[EmbedProgress] = []
    embed(source, out, model="embedmodels:mean_linear", options=OPTS, progress=events.append)
    assert events[0].done == n_first  # the part written before is read back, not embedded again
    assert _same(_slides(out), _slides(embedded))  # and the output is the uninterrupted run's


def test_a_part_of_another_pass_is_embedded_again(source: Path, embedded: Path, tmp_path: Path) -> None:
    out = tmp_path / "emb"
    embed(source, out, model="embedmodels:mean_linear", options=replace(OPTS, resize_px=32))
    events: list[EmbedProgress] = []
    embed(source, out, model="embedmodels:mean_linear", options=OPTS, progress=events.append)
    assert events[0].done < OPTS.part_samples  # the first event is a batch of a part being embedded, not a part kept
    assert _same(_slides(out), _slides(embedded))


def _same(a: dict[str, dict], b: dict[str, dict]) -> bool:
    return a.keys() == b.keys() and all(
        a[k]["keys"] == b[k]["keys"] and np.array_equal(a[k]["features"], b[k]["features"]) for k in a
    )


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("no_such_module_xyz:make", "module 'no_such_module_xyz' does not import (ModuleNotFoundError"),
        ("embedmodels:nothing_here", "has no callable 'nothing_here'"),
        ("embedmodels:not_a_module", "not_a_module() returned a str, not a torch.nn.Module"),
        ("embedmodels", "expected MODULE:CALLABLE"),
        ("embedmodels:wrong_shape", "returned shape (16, 3, 64) torch.float32 for a batch of 16: want (16, D) float"),
    ],
)
def test_a_bad_model_is_one_line_and_writes_nothing(source: Path, tmp_path: Path, model: str, message: str) -> None:
    with pytest.raises(ModelError) as err:
        embed(source, tmp_path / "emb", model=model, options=OPTS)
    assert message in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "emb" / "manifest.json").exists()
    assert not list((tmp_path / "emb").rglob("*.npz"))


def test_an_embeddings_output_is_refused_by_embed(embedded: Path, tmp_path: Path) -> None:
    import wsishard

    with pytest.raises(ManifestError, match="an embeddings output") as err:
        wsishard.embed(embedded, tmp_path / "again", model="embedmodels:mean_linear", options=OPTS)
    assert "\n" not in str(err.value) and not (tmp_path / "again").exists()


def test_an_output_holding_a_build_is_refused_and_left_as_it_was(source: Path) -> None:
    before = {p.name: p.stat().st_mtime_ns for p in source.iterdir()}
    with pytest.raises(ManifestError, match="holds a build of pixel patches"):
        embed(source, source, model="embedmodels:mean_linear", options=OPTS)
    assert {p.name: p.stat().st_mtime_ns for p in source.iterdir()} == before


def test_fp16_on_a_cpu_is_refused(source: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="dtype fp16 on a CPU"):
        embed(source, tmp_path / "emb", model="embedmodels:mean_linear", options=replace(OPTS, dtype="fp16"))
    assert not (tmp_path / "emb").exists()


def test_bf16_on_a_cpu_runs_autocast_within_its_rounding(source: Path, embedded: Path, tmp_path: Path) -> None:
    embed(source, tmp_path / "emb", model="embedmodels:mean_linear", options=replace(OPTS, dtype="bf16"))
    a, b = _slides(tmp_path / "emb"), _slides(embedded)
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["keys"] == b[k]["keys"]
        np.testing.assert_allclose(a[k]["features"], b[k]["features"], rtol=3e-2, atol=3e-2)


def test_the_cli_embeds_and_a_bad_model_is_one_line(
    source: Path, embedded: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wsishard.cli import main

    out = tmp_path / "emb"
    args = ["embed", str(source), "-o", str(out), "--device", "cpu", "--batch-size", "16", "--num-workers", "1", "-q"]
    assert main([*args, "--part-samples", "60", "--model", "embedmodels:mean_linear"]) == 0
    assert _same(_slides(out), _slides(embedded))
    assert main([*args[:3], str(tmp_path / "bad"), *args[4:], "--model", "embedmodels:wrong_shape"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("wsishard embed: error: model 'embedmodels:wrong_shape' returned shape")
    assert not (tmp_path / "bad" / "manifest.json").exists()


def test_export_h5_writes_one_file_per_slide_in_the_trident_layout(embedded: Path, tmp_path: Path) -> None:
    import h5py

    from wsishard.cli import main
    from wsishard.storage.opener import load_manifest

    assert main(["export", str(embedded), "--format", "h5", "-o", str(tmp_path / "h5")]) == 0
    slides = _slides(embedded)
    manifest, _ = load_manifest(str(embedded))
    records = {s.slide_id: s for s in manifest.slides}
    assert sorted(p.name for p in (tmp_path / "h5").iterdir()) == sorted(f"{k}.h5" for k in slides)
    for slide_id, s in slides.items():
        with h5py.File(tmp_path / "h5" / f"{slide_id}.h5", "r") as f:
            assert np.array_equal(f["features"][:], s["features"]) and f["features"].shape == (len(s["keys"]), DIM)
            assert np.array_equal(f["coords"][:], s["coords"]) and f["coords"].dtype == np.int32
            attrs = dict(f["coords"].attrs)
            rec = records[slide_id]
            assert attrs["patch_size"] == 64 and attrs["patch_level"] == 0 and attrs["name"] == slide_id
            assert attrs["patch_size_level0"] == round(64 * rec.patch_mpp / rec.slide_mpp)
            assert attrs["patch_mpp"] == pytest.approx(rec.patch_mpp)


def test_export_refuses_a_pixel_build(source: Path, tmp_path: Path) -> None:
    from wsishard.embedding.export import export_h5

    with pytest.raises(ManifestError, match="not an embeddings output"):
        export_h5(source, tmp_path / "h5")
    assert not (tmp_path / "h5").exists()


def test_verify_checks_an_embeddings_outputs_slide_samples(embedded: Path) -> None:
    from buildtools import read_output

    from wsishard.shards.samplerules import SampleRules, sample_problems
    from wsishard.shards.verify import verify
    from wsishard.storage.opener import load_manifest

    assert verify(str(embedded)).ok
    manifest, _ = load_manifest(str(embedded))
    rules = SampleRules.of(manifest, str(embedded))
    assert rules.bags
    sample = next(s for s in read_output(str(embedded))[1] if s.key == "slide-000")  # labelled 1
    assert sample_problems(sample.key, sample.members, rules) == []
    pickled = io.BytesIO()
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    broken = {**sample.members, "features.npy": pickled.getvalue()}
    assert "not (N, D) and (N, 2) plain npy arrays" in sample_problems(sample.key, broken, rules)[0][0]
    unlabelled = {k: v for k, v in sample.members.items() if k != "cls"}
    assert sample_problems(sample.key, unlabelled, rules)  # its slide has a label: .cls is missing
    assert sample_problems("../evil", sample.members, rules)[0][0].startswith("samples are not named <slide_id>")
