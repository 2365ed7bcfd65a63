"""Streaming from an fsspec URL (the in-memory filesystem), with wsishard and with plain webdataset."""

from __future__ import annotations

from pathlib import Path

import fsspec
import shardmaker as sm
import webdataset as wds
from streamtools import keys_of

from wsishard.streaming.plain import register_gopen_schemes
from wsishard.streaming.sources import stream


def test_streams_from_an_fsspec_url_and_plain_webdataset_can_too(stream_out: sm.Output) -> None:
    fs = fsspec.filesystem("memory")
    for name in [*stream_out.keys, "manifest.json"]:
        fs.pipe(f"/wsishard-test/{name}", Path(stream_out.root, name).read_bytes())
    keys = keys_of(list(stream("memory://wsishard-test", batch_size=4, resampled=False, drop_last=False, seed=0)))
    assert sorted(keys) == sorted(stream_out.shard_of)
    register_gopen_schemes(["memory"])
    first = next(iter(wds.WebDataset("memory://wsishard-test/shard-000000-0000.tar", shardshuffle=False)))
    assert first["__key__"] == stream_out.keys["shard-000000-0000.tar"][0]
