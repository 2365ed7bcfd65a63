"""``verify`` of an output on object storage: S3 (moto's server) and HTTP, both on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import shardmaker as sm

from wsishard.format import shard_name
from wsishard.shards.verify import VerifyReport, verify

if TYPE_CHECKING:  # imported by pytest_plugins below, with assertion rewriting
    from servers import HttpServer, S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(120)

COUNTS = (8, 6, 9, 7)


@pytest.fixture
def out(tmp_path: Path) -> sm.Output:
    return sm.make_output(str(tmp_path / "out"), COUNTS)


def _problem(report: VerifyReport) -> dict[str, str]:
    return dict(report.problems)


def test_verify_on_s3(s3: S3Server, s3_bucket: str, out: sm.Output) -> None:
    url = f"s3://{s3_bucket}/out"
    s3.upload(out.root, url)
    report = verify(url, storage_options=s3.storage_options)
    assert report.ok and report.samples_checked == sum(COUNTS) and report.warnings == []
    fs = s3.fs()
    fs.rm(f"{url}/{shard_name(1)}")
    data = bytearray(Path(out.path(2)).read_bytes())
    data[len(data) // 3] ^= 0x01
    fs.pipe(f"{url}/{shard_name(2)}", bytes(data))
    fs.pipe(f"{url}/{shard_name(9)}", b"stray")
    report = verify(url, storage_options=s3.storage_options)
    assert list(_problem(report)) == [shard_name(1), shard_name(2)]
    assert _problem(report)[shard_name(1)] == "missing"
    assert [name for name, _ in report.warnings] == [shard_name(9)]


def test_verify_over_http(http_serve: Any, out: sm.Output) -> None:
    server: HttpServer = http_serve(Path(out.root).parent)
    assert verify(f"{server.url}/out").ok
    sm.truncate(out.path(3), 0.5)
    shutil.copy(out.path(0), os.path.join(out.root, shard_name(8)))
    report = verify(f"{server.url}/out")
    assert list(_problem(report)) == [shard_name(3)]
    assert [name for name, _ in report.warnings] == [shard_name(8)]  # from the server's index page
