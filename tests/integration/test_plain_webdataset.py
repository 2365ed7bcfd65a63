"""The design card's own pipeline: plain webdataset over a wsishard build, locally and from S3 (moto)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch
import webdataset as wds
from buildtools import read_output

import wsishard

if TYPE_CHECKING:
    from servers import S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(300)


def _pipeline(urls: list[str]) -> wds.WebDataset:
    return (
        wds.WebDataset(
            urls,
            resampled=True,
            shardshuffle=False,
            nodesplitter=wds.split_by_node,
            workersplitter=wds.split_by_worker,
            select_files=wsishard.is_sample_member,
            seed=0,
        )
        .decode("rgb8")
        .to_tuple("__key__", "jpg", "json")
    )


def _take(ds: wds.WebDataset, n: int, **loader: Any) -> list[tuple[str, Any, dict]]:
    out = []
    for item in wds.WebLoader(ds, batch_size=None, **loader):
        out.append(item)
        if len(out) == n:
            return out
    raise AssertionError("the stream ended")


def _check(samples: list[tuple[str, Any, dict]], build: Path) -> None:
    keys = {s.key for s in read_output(str(build))[1]}
    for key, image, meta in samples:
        assert key in keys and tuple(image.shape) == (64, 64, 3) and torch.as_tensor(image).dtype == torch.uint8
        assert meta["patch_size"] == 64 and key == f"{meta['slide_id']}_x{meta['x']}_y{meta['y']}"


def test_a_plain_webdataset_pipeline_reads_a_local_build_with_workers(cohort_build: Path) -> None:
    urls = wsishard.shard_urls(str(cohort_build))
    assert len(urls) == len(read_output(str(cohort_build))[0].shards) > 4 and all(Path(u).is_file() for u in urls)
    samples = _take(_pipeline(urls), 60, num_workers=2)
    _check(samples, cohort_build)


def _gopen_in_worker(storage_options: dict[str, Any], _worker: int) -> None:
    wsishard.register_gopen_schemes(["s3"], storage_options)


def test_a_plain_webdataset_pipeline_reads_a_build_in_s3(s3: S3Server, s3_bucket: str, cohort_build: Path) -> None:
    url = f"s3://{s3_bucket}/run"
    s3.upload(str(cohort_build), url)
    urls = wsishard.shard_urls(url, s3.storage_options)
    assert urls[0] == f"{url}/shard-000000-0000.tar"
    init = functools.partial(_gopen_in_worker, dict(s3.storage_options))
    samples = _take(_pipeline(urls), 40, num_workers=2, worker_init_fn=init)
    _check(samples, cohort_build)


def test_pickled_members_are_never_read_by_the_recipe(tmp_path: Path) -> None:
    import pickle

    import shardmaker as sm

    class Boom:
        def __reduce__(self) -> tuple[Any, tuple[str]]:
            return (exec, ("raise SystemExit('unpickled')",))

    out = sm.make_output(str(tmp_path / "out"), (4,), size_px=16, extra_members={"pyd": pickle.dumps(Boom())})
    ds = wds.WebDataset(
        wsishard.shard_urls(out.root), shardshuffle=False, select_files=wsishard.is_sample_member
    ).decode("rgb8")
    samples = list(ds)
    assert len(samples) == 4 and all("pyd" not in s for s in samples)
    assert samples[0]["jpg"].shape == (16, 16, 3) and isinstance(samples[0]["json"], dict)


def test_the_single_process_example_trains_from_a_one_shard_build_in_s3(
    s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """The issue's failing case: ``python examples/train_single.py s3://bucket/run --steps 5`` (2 workers) on a
    build that is one shard."""
    import os
    import subprocess
    import sys

    import shardmaker as sm

    one = sm.make_output(str(tmp_path / "one"), (37,), size_px=32)
    url = f"s3://{s3_bucket}/run"
    s3.upload(one.root, url)
    env = {**os.environ, "AWS_ENDPOINT_URL": s3.endpoint_url}
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(root / "examples" / "train_single.py"), url, "--steps", "5", "--batch-size", "8"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "samples/s" in done.stdout and "step 0: loss" in done.stdout
