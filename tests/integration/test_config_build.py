"""A build's recipe end to end: ``inspect OLD --options`` -> TOML -> ``build --config`` of the same slides writes the
same shards, byte for byte; a flag given with the file overrides it."""

from __future__ import annotations

import hashlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import wsishard
from wsishard.builder.options.config import tomllib  # tomli before Python 3.11
from wsishard.cli import main
from wsishard.testing.synthetic import make_slides

pytest_plugins = ("servers",)

NON_DEFAULT = [
    *("--mpp", "0.75", "--patch-size", "192", "--min-tissue", "0.4", "--seed", "3", "--quality", "80"),
    *("--shard-samples", "20", "--keep-dark-artefacts", "--tissue-median-um", "16", "--max-dark-pixels", "0.9"),
    *("--he-hue-from", "230", "--group-slides", "2", "--jobs", "2"),
]


def _digests(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(out.glob("shard-*.tar"))}


def _options(out: Path) -> dict[str, object]:
    options: dict[str, object] = json.loads((out / "manifest.json").read_text())["options"]
    return options


@pytest.fixture(scope="module")
def old(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("recipe")
    make_slides(root / "slides", 3, seed=4, width=4096, height=4096)
    (root / "labels.csv").write_text("slide,label\nslide-000.svs,tumour\nslide-001.tif,normal\nslide-002.svs,normal\n")
    args = ["build", str(root / "slides"), "-o", str(root / "old"), "--labels", str(root / "labels.csv"), "-q"]
    assert main([*args, *NON_DEFAULT]) == 0
    return root


def _inspect_options(out: Path | str, capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(["inspect", str(out), "--options"]) == 0
    return capsys.readouterr().out


def test_inspect_options_then_build_config_writes_the_same_shards(
    old: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _inspect_options(old / "old", capsys)
    data = tomllib.loads(text)
    assert (data["patches"]["mpp"], data["patches"]["patch_size"], data["patches"]["min_tissue"]) == (0.75, 192, 0.4)
    assert data["output"]["labels"] == {"slide-000.svs": "tumour", "slide-001.tif": "normal", "slide-002.svs": "normal"}
    assert data["artefacts"]["keep_dark_artefacts"] is True and data["run"]["seed"] == 3
    (tmp_path / "old.toml").write_text(text)
    args = ["build", str(old / "slides"), "-o", str(tmp_path / "new"), "--config", str(tmp_path / "old.toml")]
    assert main(args) == 0
    shards = _digests(old / "old")
    assert len(shards) >= 3 and _digests(tmp_path / "new") == shards
    assert _options(tmp_path / "new") == _options(old / "old")
    wsishard.build(old / "slides", tmp_path / "api", config=tmp_path / "old.toml")  # the Python API alike
    assert _digests(tmp_path / "api") == shards and _options(tmp_path / "api") == _options(old / "old")


def test_the_recipe_through_a_shell_pipe_as_the_docs_write_it(old: Path, tmp_path: Path) -> None:
    cli = f"{shlex.quote(sys.executable)} -m wsishard.cli"
    line = (
        f"{cli} build {shlex.quote(str(old / 'slides'))} -o {shlex.quote(str(tmp_path / 'new'))} -q "
        f"--config <({cli} inspect {shlex.quote(str(old / 'old'))} --options)"
    )
    proc = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert _digests(tmp_path / "new") == _digests(old / "old")


def test_a_flag_overrides_the_recipe(old: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.toml").write_text(_inspect_options(old / "old", capsys))
    args = ["build", str(old / "slides"), "-o", str(tmp_path / "new"), "--config", str(tmp_path / "old.toml")]
    assert main([*args, "--seed", "4", "-q"]) == 0
    options, before = _options(tmp_path / "new"), _options(old / "old")
    assert options["seed"] == 4 and {**options, "seed": 3} == before  # only the seed differs
    assert _digests(tmp_path / "new") != _digests(old / "old")  # and the shards mix differently


def test_a_misspelt_key_in_a_recipe_is_one_line_with_the_closest_key(
    old: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _inspect_options(old / "old", capsys).replace("\nmin_tissue = ", "\nmin_tisue = ")
    (tmp_path / "bad.toml").write_text(text)
    args = ["build", str(old / "slides"), "-o", str(tmp_path / "new"), "--config", str(tmp_path / "bad.toml")]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        f"wsishard build: error: config {tmp_path / 'bad.toml'}: unknown key 'min_tisue' in [patches]; "
        "did you mean 'min_tissue'?\n"
    )
    assert not (tmp_path / "new").exists()


def test_the_recipe_of_a_build_read_over_http_names_no_credentials(
    old: Path, http_serve: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    server = http_serve(old)
    url = server.url.replace("http://", "http://reader:s3cret@") + "/old"
    text = _inspect_options(url, capsys)
    assert "s3cret" not in text and f"the options of the build in {server.url}/old (" in text
    assert tomllib.loads(text)["patches"]["patch_size"] == 192
