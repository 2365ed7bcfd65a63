"""``verify`` of an output on object storage: S3 (moto's server) and HTTP, both on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import shardmaker as sm

from wsishard.format import shard_name
from wsishard.shards.verify import verify

if TYPE_CHECKING:  # imported by pytest_plugins below, with assertion rewriting
    from servers import HttpServer, S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(120)

COUNTS = sm.SMALL_COUNTS


def test_verify_on_s3(s3: S3Server, s3_bucket: str, small_output: sm.Output) -> None:
    url = f"s3://{s3_bucket}/out"
    s3.upload(small_output.root, url)
    report = verify(url, storage_options=s3.storage_options)
    assert report.ok and report.samples_checked == sum(COUNTS) and report.warnings == []
    fs = s3.fs()
    fs.rm(f"{url}/{shard_name(1)}")
    data = bytearray(Path(small_output.path(2)).read_bytes())
    data[len(data) // 3] ^= 0x01
    fs.pipe(f"{url}/{shard_name(2)}", bytes(data))
    fs.pipe(f"{url}/{shard_name(9)}", b"stray")
    report = verify(url, storage_options=s3.storage_options)
    assert list(dict(report.problems)) == [shard_name(1), shard_name(2)]
    assert dict(report.problems)[shard_name(1)] == "missing"
    assert [name for name, _ in report.warnings] == [shard_name(9)]


def test_verify_over_http(http_serve: Any, small_output: sm.Output) -> None:
    server: HttpServer = http_serve(Path(small_output.root).parent)
    assert verify(f"{server.url}/out").ok
    sm.truncate(small_output.path(3), 0.5)
    shutil.copy(small_output.path(0), os.path.join(small_output.root, shard_name(8)))
    report = verify(f"{server.url}/out")
    assert list(dict(report.problems)) == [shard_name(3)]
    assert [name for name, _ in report.warnings] == [shard_name(8)]  # from the server's index page
