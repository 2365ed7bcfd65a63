"""An embeddings output streamed as bags: one slide per sample through the planner, padded with a mask, every mode
of the pixel stream (epochs, pad_last, weights, select, resume), ``max_patches`` seeded subsets."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from buildtools import read_output
from embedmodels import DIM, make_source

import wsishard
from wsishard.embedding.options import EmbedOptions
from wsishard.errors import ShardError

LABELS = {"slide-000": 1, "slide-001": 0, "slide-002": 0}


@pytest.fixture(scope="module")
def bags(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bags")
    source = make_source(root, LABELS)
    options = EmbedOptions(device="cpu", batch_size=32, num_workers=1)
    wsishard.embed(source, root / "emb", model="embedmodels:mean_linear", options=options)
    return root / "emb"


def _stored(out: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    _, samples = read_output(str(out))
    return {
        s.key: tuple(np.load(io.BytesIO(s.members[m]), allow_pickle=False) for m in ("features.npy", "coords.npy"))
        for s in samples
    }  # type: ignore[misc]


def test_an_epoch_with_pad_last_yields_every_slide_once_as_its_whole_bag(bags: Path) -> None:
    stored = _stored(bags)
    manifest, _ = wsishard.load_manifest(str(bags))
    patches = {s.slide_id: s.patches for s in manifest.slides}
    ds = wsishard.stream(str(bags), batch_size=2, resampled=False, pad_last=True, seed=1)
    seen = []
    for batch in wsishard.loader(ds, num_workers=2):
        b, nmax = batch["mask"].shape
        assert batch["features"].shape == (b, nmax, DIM) and batch["features"].dtype == torch.float32
        assert batch["coords"].shape == (b, nmax, 2)
        for i in np.flatnonzero(batch["valid"].numpy()).tolist():
            key, n = batch["key"][i], int(batch["mask"][i].sum())
            seen.append(key)
            assert n == patches[key] and bool(batch["mask"][i, :n].all())
            feats, coords = stored[key]
            assert torch.equal(batch["features"][i, :n], torch.from_numpy(feats.astype(np.float32)))
            assert not batch["features"][i, n:].any()  # zero-padded
            assert batch["coords"][i, :n].tolist() == coords.tolist()
            assert int(batch["label"][i]) == LABELS[key]
    assert sorted(seen) == sorted(patches)  # every slide exactly once


def _subsets(bags: Path, epoch: int, **kwargs: object) -> dict[str, list]:
    ds = wsishard.stream(str(bags), batch_size=1, resampled=False, seed=4, max_patches=10, **kwargs)  # type: ignore[arg-type]
    ds.set_epoch(epoch)
    out = {}
    for batch in ds:
        assert batch["mask"].shape[1] <= 10 and bool(batch["mask"].all())
        out[batch["key"][0]] = batch["coords"][0].tolist()
    return out


def test_max_patches_draws_a_seeded_subset_per_epoch(bags: Path) -> None:
    stored = _stored(bags)
    first, again, other = _subsets(bags, 0), _subsets(bags, 0), _subsets(bags, 1)
    assert first == again  # the same seed and epoch: the same subsets
    assert first != other  # another epoch: other subsets
    for key, coords in first.items():
        rows = [tuple(c) for c in stored[key][1].tolist()]
        assert len(coords) == 10 and len(set(map(tuple, coords))) == 10
        assert all(tuple(c) in rows for c in coords)  # real patches of that slide


def test_a_resumed_loader_draws_the_same_subsets(bags: Path) -> None:
    def loader():
        ds = wsishard.stream(str(bags), batch_size=1, resampled=False, seed=4, max_patches=10, pad_last=True)
        return wsishard.loader(ds, num_workers=1)

    whole = [(b["key"], b["coords"].tolist()) for b in loader()]
    first = loader()
    it = iter(first)
    head = [(b["key"], b["coords"].tolist()) for b in (next(it),)]
    state = first.state_dict()
    del it
    resumed = loader()
    resumed.load_state_dict(state)
    assert head + [(b["key"], b["coords"].tolist()) for b in resumed] == whole


def test_class_weights_balance_the_slides_labels(bags: Path) -> None:
    ds = wsishard.stream(str(bags), batch_size=4, resampled=False, seed=2, weights="class", epoch_size=400)
    labels = [int(x) for b in ds for x in b["label"]]
    assert len(labels) == 400
    assert abs(sum(labels) / 400 - 0.5) < 0.1  # one slide of label 1 among three, drawn half the time


def test_select_on_slide_columns(bags: Path) -> None:
    ds = wsishard.stream(
        str(bags), batch_size=2, resampled=False, drop_last=False, select=lambda t: t["slide_id"] != "slide-001"
    )
    assert sorted(k for b in ds for k in b["key"]) == ["slide-000", "slide-002"]


def test_max_patches_needs_an_embeddings_output_and_mixing_kinds_is_refused(bags: Path) -> None:
    source = bags.parent / "out"
    with pytest.raises(ValueError, match="max_patches=5"):
        wsishard.stream(str(source), batch_size=2, max_patches=5)
    with pytest.raises(wsishard.ManifestError, match="streamed with pixel builds"):
        wsishard.stream([str(bags), str(source)], batch_size=2)


def test_a_pickled_npy_member_is_never_unpickled() -> None:
    from wsishard.streaming.bags import decode_bag
    from wsishard.streaming.stages import RawSample

    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    raw = RawSample(key="s", shard="x.tar", image_ext="npy", image=buf.getvalue(), meta=b"{}", label=None, context=())
    raw["coords"] = buf.getvalue()
    with pytest.raises(ShardError, match=r"features\.npy is not a plain npy array"):
        decode_bag(raw, None, (0, 0))


def test_the_attention_mil_example_trains_and_validates_every_slide(bags: Path) -> None:
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    cmd = [sys.executable, str(root / "examples" / "train_mil.py"), str(bags), "--steps", "3", "--batch-size", "2"]
    done = subprocess.run([*cmd, "--max-patches", "16", "--device", "cpu"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 3 and report["slides"] == 3  # validation saw each slide once
    assert 0 <= report["val_correct"] <= 3 and report["loss"] > 0
