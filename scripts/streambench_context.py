"""bench_stream's context figure: the loader with one context scale against none, on the same samples.

Until the build writes context (``wsishard build --context-mpp``, the build side of issue 30), the context build is
made here from the benchmark's own build: each sample gains one member ``ctx0.jpg``, the JPEG of the sample after it
in its shard (the same size and kind of tissue JPEG a real context patch is, so the same decode cost), with
``context_mpp [2.0]`` and ``context_size`` the patch size in the manifest, as the build records them.
"""

from __future__ import annotations

import dataclasses
import json
import tarfile
from pathlib import Path

from streambench_resume import finish_copy, stale_copy  # this folder's module (scripts/ is on sys.path)

CONTEXT_MPP = 2.0


def context_copy(shards_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: the build ``shards_dir`` with one context member a sample (module docstring), shard for shard.
    Reused while the source's manifest is unchanged."""
    from wsishard.format import context_ext, split_member
    from wsishard.shards.writer import ShardWriter
    from wsishard.storage.opener import load_manifest
    from wsishard.storage.output import Destination

    digest = stale_copy(shards_dir, out_dir)
    if digest is None:
        return out_dir
    manifest, _ = load_manifest(str(shards_dir))
    dest = Destination(str(out_dir))
    dest.makedirs()
    records = []
    for rec in manifest.shards:
        samples: dict[str, dict[str, bytes]] = {}
        with tarfile.open(shards_dir / rec.name) as tar:
            for info in tar:
                name = split_member(info.name)
                if name is not None:
                    samples.setdefault(name[0], {})[name[1]] = tar.extractfile(info).read()  # type: ignore[union-attr]
        keys = list(samples)
        writer = ShardWriter(dest, rec.name)
        for i, key in enumerate(keys):
            own = samples[key]
            ctx = samples[keys[(i + 1) % len(keys)]][manifest.image_format]
            members = {manifest.image_format: own[manifest.image_format],
                       context_ext(0, manifest.image_format): ctx,
                       **{e: d for e, d in own.items() if e != manifest.image_format}}  # fmt: skip
            writer.write(key, members, json.loads(own["json"])["slide_id"])
        records.append(writer.commit())
    patch_px = manifest.options["patch"]["patch_size_px"]
    options = {**manifest.options, "context_mpp": [CONTEXT_MPP], "context_size": patch_px}
    finish_copy(shards_dir, out_dir, dataclasses.replace(manifest, shards=records, options=options), digest)
    return out_dir
