"""Resume cost and the one-shard copy for ``bench_stream.py`` (kept apart so that script stays readable).

:func:`time_resume` times the first batch of a resampled loader resumed at a few steps (from a state made as the
training loop would have left it) and checks that a resumed batch is the uninterrupted run's. :func:`one_shard_copy`
rewrites a build output's samples, in order, into one shard, so the sample-level split (fewer shards than readers)
can be timed on the same samples as the shard-level split.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import tarfile
import time
from pathlib import Path
from typing import Any

_STAMP = "source-manifest.sha256"  # a copy's record of the source manifest it was made from


def resume_state(state: dict[str, Any], step: int, workers: int) -> dict[str, Any]:
    """``state`` (a fresh loader's :meth:`state_dict`) moved to after ``step`` batches taken round robin: worker
    ``w`` took ``ceil((step - w) / workers)`` batches, the last one came from ``(step - 1) % workers``; epoch 0."""
    taken = [max(math.ceil((step - w) / workers), 0) for w in range(workers)]
    return {**state, "epoch": 0, "batches": taken, "last_worker": (step - 1) % workers if step > 0 else None}


def _run(source: str, workers: int, batch: int, seed: int, n: int, step: int | None) -> tuple[float, list[list[str]]]:
    """Seconds from creating the loader (and loading the state of ``step``, if given) to its first batch, and the
    keys of its first ``n`` batches."""
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    t0 = time.perf_counter()
    dl = loader(stream(source, batch_size=batch, resampled=True, seed=seed), num_workers=workers)
    if step is not None:
        dl.load_state_dict(resume_state(dl.state_dict(), step, workers))
    it = iter(dl)
    keys = [list(next(it)["key"])]
    first_s = time.perf_counter() - t0
    keys += [list(next(it)["key"]) for _ in range(n - 1)]
    del it  # shuts the workers down
    return first_s, keys


def time_resume(source: str, *, workers: int, batch: int, seed: int, steps: tuple[int, int] = (10, 10_000),
                rounds: int = 2) -> dict[str, Any]:  # fmt: skip
    """First-batch seconds of a fresh loader and of loaders resumed at each of ``steps`` (best of ``rounds``,
    interleaved so that a shared machine's drift hits all alike), and whether the batches resumed at ``steps[0]``
    (one per worker) have the keys of the uninterrupted run's batches there."""
    check = steps[0]
    fresh: list[float] = []
    resumed: dict[int, list[float]] = {s: [] for s in steps}
    same = True
    for r in range(rounds):
        n = check + workers if r == 0 else 1  # the first fresh run is also the uninterrupted reference
        first_s, ref = _run(source, workers, batch, seed, n, None)
        fresh.append(first_s)
        for step in steps:
            first_s, keys = _run(source, workers, batch, seed, workers if r == 0 and step == check else 1, step)
            resumed[step].append(first_s)
            if r == 0 and step == check:
                same = keys == ref[check:]
    lo, hi = (min(resumed[s]) for s in steps)
    return {"workers": workers, "steps": list(steps), "rounds": rounds, "fresh_first_s": min(fresh),
            "resumed_first_s": {str(s): min(resumed[s]) for s in steps},
            "all_first_s": {"fresh": fresh, **{str(s): v for s, v in resumed.items()}}, "ratio": hi / lo,
            "check_step": check, "check_batches": workers, "check_keys_equal": same}  # fmt: skip


def one_shard_copy(shards_dir: Path, out_dir: Path) -> Path:
    """``out_dir``: the samples of the build output ``shards_dir``, in manifest and tar order, in ONE shard, with
    the source's manifest but that one shard record. Reused while the source's manifest is unchanged."""
    from wsishard.format import shard_name, split_member
    from wsishard.shards.writer import ShardWriter
    from wsishard.storage.opener import load_manifest
    from wsishard.storage.output import Destination

    digest = stale_copy(shards_dir, out_dir)
    if digest is None:
        return out_dir
    manifest, _ = load_manifest(str(shards_dir))
    dest = Destination(str(out_dir))
    dest.makedirs()
    writer = ShardWriter(dest, shard_name(0))
    for rec in manifest.shards:
        with tarfile.open(shards_dir / rec.name) as tar:
            key, members = "", dict[str, bytes]()
            for info in tar:
                name = split_member(info.name)
                if name is None:
                    continue
                if name[0] != key and members:
                    writer.write(key, members, json.loads(members["json"])["slide_id"])
                    members = {}
                key, members[name[1]] = name[0], tar.extractfile(info).read()  # type: ignore[union-attr]
            if members:
                writer.write(key, members, json.loads(members["json"])["slide_id"])
    record = writer.commit()
    if record.samples != manifest.total_samples:
        raise SystemExit(f"one-shard copy holds {record.samples} samples, the source {manifest.total_samples}")
    finish_copy(shards_dir, out_dir, dataclasses.replace(manifest, shards=[record]), digest)
    return out_dir


def stale_copy(shards_dir: Path, out_dir: Path) -> str | None:
    """The digest of ``shards_dir``'s manifest, where ``out_dir`` is not yet a copy made from it (None: it is one)."""
    from wsishard.format import MANIFEST_NAME

    digest = hashlib.sha256((shards_dir / MANIFEST_NAME).read_bytes()).hexdigest()
    stamp = out_dir / _STAMP
    fresh = stamp.exists() and stamp.read_text() == digest and (out_dir / MANIFEST_NAME).exists()
    return None if fresh else digest


def finish_copy(shards_dir: Path, out_dir: Path, manifest: Any, digest: str) -> None:
    """End a copy into ``out_dir``: the source's slide records, ``manifest``, then the stamp that lets
    :func:`stale_copy` reuse it."""
    from wsishard.format import MANIFEST_NAME, SLIDES_NAME
    from wsishard.storage.output import Destination

    dest = Destination(str(out_dir))

    if (shards_dir / SLIDES_NAME).exists():  # a version-2 manifest: its slide records beside it, written first
        dest.write_bytes(SLIDES_NAME, (shards_dir / SLIDES_NAME).read_bytes())
    dest.write_bytes(MANIFEST_NAME, manifest.to_json().encode())
    (out_dir / _STAMP).write_text(digest)
