"""Helpers for build tests: read a build output back with the standard library only."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from dataclasses import dataclass

import numpy as np
from PIL import Image

from wsishard.format import Manifest


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
    with open(os.path.join(root, "manifest.json"), encoding="utf-8") as fh:
        manifest = Manifest.from_json(fh.read())
    samples: list[Sample] = []
    for record in manifest.shards:
        path = os.path.join(root, record.name)
        with open(path, "rb") as fh:
            data = fh.read()
        assert len(data) == record.bytes and hashlib.sha256(data).hexdigest() == record.sha256
        shard_samples: list[Sample] = []
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            for member in tar:
                key, ext = member.name.split(".", 1)
                if not shard_samples or shard_samples[-1].key != key:
                    shard_samples.append(Sample(record.name, key, {}))
                fobj = tar.extractfile(member)
                assert fobj is not None
                shard_samples[-1].members[ext] = fobj.read()
        assert len(shard_samples) == record.samples
        samples.extend(shard_samples)
    return manifest, samples
