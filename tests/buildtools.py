"""Helpers for build tests: read a build output back with the standard library's tar reader; list and plant files
in an output folder."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.scan.grid import PatchOptions
from wsishard.manifest import Manifest
from wsishard.shards.reader import group_members
from wsishard.storage.opener import load_manifest

# The small build shared by the resume, part/merge and object-storage tests (and ``cohort_build`` in conftest.py):
# 64 px patches, 25 samples per shard, groups of 3 slides, seed 5. The same options as API and CLI arguments.
SMALL_BUILD = BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=25, group_slides=3, seed=5, jobs=2)
SMALL_BUILD_ARGS = ("--patch-size", "64", "--shard-samples", "25", "--group-slides", "3", "--seed", "5", "-q")


@dataclass
class Sample:
    shard: str
    key: str
    members: dict[str, bytes]

    @property
    def meta(self) -> dict:
        return json.loads(self.members["json"])

    def image(self) -> np.ndarray:
        ext = next(e for e in ("jpg", "png", "webp") if e in self.members)
        return np.asarray(Image.open(io.BytesIO(self.members[ext])).convert("RGB"))


def read_output(root: str) -> tuple[Manifest, list[Sample]]:
    """The manifest and every sample of every listed shard, in shard order and in-shard order."""
    manifest, _ = load_manifest(root)  # with its slide records
    samples: list[Sample] = []
    for record in manifest.shards:
        path = os.path.join(root, record.name)
        with open(path, "rb") as fh:
            data = fh.read()
        assert len(data) == record.bytes and hashlib.sha256(data).hexdigest() == record.sha256
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # the standard library's tar reader, not wsishard's
            members = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
        shard_samples = [Sample(record.name, key, group) for key, group in group_members(members)]
        assert len(shard_samples) == record.samples
        samples.extend(shard_samples)
    return manifest, samples


def usage_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """Run ``wsishard build`` in this process; expect a usage error and return its one line on stderr."""
    from wsishard.cli import main

    try:
        code = main(["build", *args])
    except SystemExit as exc:  # argparse
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


def files_under(root: Path) -> list[str]:
    """Every file below ``root``, as sorted "/"-separated paths relative to it."""
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def put_files(root: Path, *names: str) -> None:
    """Plant a small file at each of ``names`` (relative to ``root``), folders made as needed."""
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")
