"""Streaming from object storage against real servers on 127.0.0.1: moto's S3 server and a local HTTP server.

The same output streamed from S3, over HTTP and from the local folder gives the same batches; transient server
errors (503, connections dropped mid-body) are retried, missing shards and persistent failures are ShardErrors,
and credentials never show in reprs, errors or log records.
"""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import s3fs
import shardmaker as sm

from wsishard.errors import ManifestError, OptionError, ShardError
from wsishard.format import shard_name
from wsishard.storage.opener import StreamOpener, list_names, read_bytes
from wsishard.storage.retry import RetryPolicy, is_transient
from wsishard.storage.secrets import redact
from wsishard.streaming.loader import loader
from wsishard.streaming.sources import stream

if TYPE_CHECKING:  # imported by pytest_plugins below, with assertion rewriting
    from servers import HttpServer, S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(120)

COUNTS = (10, 7, 12, 5, 9, 6)
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRET"
FAST = RetryPolicy(attempts=5, backoff_s=0.01)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    return sm.make_output(str(tmp_path_factory.mktemp("site") / "out"), COUNTS)


@pytest.fixture
def s3_out(s3: S3Server, s3_bucket: str, out: sm.Output) -> str:
    """``out`` uploaded to a fresh bucket: its ``s3://`` URL."""
    url = f"s3://{s3_bucket}/builds/out"
    s3.upload(out.root, url)
    return url


def _samples(batches: Any) -> list[tuple[str, int, bytes]]:
    """(key, label, pixels) of every sample, in order."""
    return [
        (key, int(label), image.numpy().tobytes())
        for b in batches
        for key, label, image in zip(b["key"], b["label"], b["image"], strict=True)
    ]


def _epoch(source: str, *, num_workers: int | None = None, **kw: Any) -> list[tuple[str, int, bytes]]:
    ds = stream(source, batch_size=4, resampled=False, drop_last=False, shuffle=16, seed=3, **kw)
    return _samples(ds if num_workers is None else loader(ds, num_workers=num_workers))


def _check_truth(samples: list[tuple[str, int, bytes]], out: sm.Output) -> None:
    assert sorted(k for k, _, _ in samples) == sorted(out.shard_of)
    for key, label, pixels in samples:
        assert label == out.labels[key]
        assert pixels == np.ascontiguousarray(out.images[key]).tobytes()


# ---- the same samples from every place ---------------------------------------------------------------------


def test_s3_streams_the_same_samples_as_local_in_process_and_with_workers(
    s3: S3Server, s3_out: str, out: sm.Output
) -> None:
    local = _epoch(out.root)
    _check_truth(local, out)
    assert _epoch(s3_out, storage_options=s3.storage_options) == local
    assert _epoch(s3_out, storage_options=s3.storage_options, num_workers=2) == _epoch(out.root, num_workers=2)


def test_http_streams_the_same_samples_as_local(http_serve: Any, out: sm.Output) -> None:
    server: HttpServer = http_serve(Path(out.root).parent)
    assert _epoch(f"{server.url}/out") == _epoch(out.root)
    assert _epoch(f"{server.url}/out", num_workers=2) == _epoch(out.root, num_workers=2)
    ranged = [r for r in server.log if r[0] == "GET" and r[1].endswith(".tar")]
    assert ranged and all(r[2] is not None and r[2].startswith("bytes=0-") for r in ranged)  # one large read each


def test_aws_endpoint_url_from_the_environment(
    s3: S3Server, s3_out: str, out: sm.Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)
    s3fs.S3FileSystem.clear_instance_cache()  # so that no cached client with another endpoint is reused
    _check_truth(_epoch(s3_out), out)


def test_small_blocks_without_and_with_read_ahead_give_the_same_bytes(
    s3: S3Server, s3_out: str, out: sm.Output
) -> None:
    want = Path(out.path(2)).read_bytes()
    for prefetch in (0, 1, 3):
        opener = StreamOpener(s3.storage_options, block_size=5000, prefetch=prefetch)
        with opener(f"{s3_out}/shard-000000-0002.tar") as fh:
            got = fh.read(7) + fh.read(12_000) + fh.read()
            assert got == want and fh.tell() == len(want) and fh.read(10) == b""
    assert list_names(s3_out, s3.storage_options) == sorted(["manifest.json", *out.keys])


def test_closing_a_reader_early_stops_its_read_ahead_thread(s3: S3Server, s3_out: str) -> None:
    before = set(threading.enumerate())
    fh = StreamOpener(s3.storage_options, block_size=2000, prefetch=2)(f"{s3_out}/shard-000000-0000.tar")
    assert len(fh.read(10)) == 10
    mine = [t for t in set(threading.enumerate()) - before if t.name == "wsishard-prefetch"]
    assert len(mine) == 1
    fh.close()
    mine[0].join(timeout=5)
    assert not mine[0].is_alive()
    with pytest.raises(ValueError, match="closed"):
        fh.read(10)


def test_an_s3_stream_with_two_workers_prints_nothing(s3: S3Server, s3_out: str, tmp_path: Path) -> None:
    """Issue 12, item 8: in a fresh interpreter, so that stderr is whole, interpreter shutdown included."""
    code = f"""
from wsishard.streaming.sources import stream
from wsishard.streaming.loader import loader
ds = stream({s3_out!r}, batch_size=4, resampled=False, drop_last=False, shuffle=8, seed=0,
            storage_options={s3.storage_options!r})
for epoch in range(2):
    print(sum(len(b["key"]) for b in loader(ds, num_workers=2)))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=150)
    assert (run.returncode, run.stdout.split(), run.stderr) == (0, [str(sum(COUNTS))] * 2, "")


# ---- failures ----------------------------------------------------------------------------------------------


def test_missing_shard_on_s3_is_a_shard_error_naming_it(s3: S3Server, s3_out: str) -> None:
    s3.fs().rm(f"{s3_out}/shard-000000-0003.tar")
    with pytest.raises(ShardError) as info:
        list(stream(s3_out, batch_size=4, resampled=False, storage_options=s3.storage_options))
    assert info.value.shard == f"{s3_out}/shard-000000-0003.tar"
    assert "FileNotFoundError" in info.value.reason
    with pytest.raises(ShardError, match="shard-000000-0003"):
        list(loader(stream(s3_out, batch_size=4, resampled=False, storage_options=s3.storage_options), num_workers=2))


def test_missing_output_on_s3_is_a_manifest_error(s3: S3Server, s3_bucket: str) -> None:
    with pytest.raises(ManifestError, match="not found"):
        stream(f"s3://{s3_bucket}/nothing-here", batch_size=2, storage_options=s3.storage_options)


def test_transient_http_errors_are_retried_at_open_and_mid_stream(http_serve: Any, out: sm.Output) -> None:
    server: HttpServer = http_serve(Path(out.root).parent)
    reference = _epoch(out.root)
    server.faults.fail = 3  # 503 for the first three shard requests (HEAD/GET at open time)
    assert _epoch(f"{server.url}/out", opener=StreamOpener(retry=FAST)) == reference
    assert server.faults.fail == 0
    server.faults.reset, server.faults.min_offset = 4, 4096  # connections dropped half-way through a body
    del server.log[:]
    assert _epoch(f"{server.url}/out", opener=StreamOpener(block_size=4096, retry=FAST)) == reference
    assert server.faults.reset == 0
    gets = [(path, rng) for method, path, rng in server.log if method == "GET"]
    again = [g for g, previous in zip(gets[1:], gets, strict=False) if g == previous]
    assert again and all(not (rng or "").startswith("bytes=0-") for _, rng in again)  # re-read where it broke


def test_persistent_failures_end_in_a_shard_error(http_serve: Any, out: sm.Output) -> None:
    server: HttpServer = http_serve(Path(out.root).parent)
    server.faults.fail, server.faults.match = 10_000, "shard-000000-0001"
    with pytest.raises(ShardError, match=r"shard-000000-0001.*gave up .* after 5 attempts") as info:
        list(stream(f"{server.url}/out", batch_size=4, resampled=False, opener=StreamOpener(retry=FAST)))
    assert info.value.shard.endswith("shard-000000-0001.tar")


def test_not_found_and_forbidden_are_not_retried(http_serve: Any, out: sm.Output) -> None:
    server: HttpServer = http_serve(Path(out.root).parent)
    with pytest.raises(FileNotFoundError):
        StreamOpener(retry=FAST)(f"{server.url}/out/no-such-shard.tar")
    # the first block's GET (sent beside the size's request), fsspec's HEAD, then its GET: one attempt each
    assert len(server.requests_to("no-such-shard.tar")) <= 3
    server.faults.fail, server.faults.status = 10_000, 403
    with pytest.raises(PermissionError):
        StreamOpener(retry=FAST)(f"{server.url}/out/shard-000000-0000.tar")
    assert len(server.requests_to("shard-000000-0000.tar")) <= 3


def _client_error(code: str, status: int) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject"
    )


def _wrapped(outer: BaseException, cause: BaseException) -> BaseException:
    outer.__cause__ = cause
    return outer


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (_client_error("SlowDown", 503), True),
        (_client_error("InternalError", 500), True),
        (_client_error("NoSuchKey", 404), False),
        (_client_error("AccessDenied", 403), False),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (FileNotFoundError("x"), False),
        (_wrapped(OSError(16, "SlowDown"), _client_error("SlowDown", 503)), True),
        (_wrapped(FileNotFoundError("x"), _client_error("ServiceUnavailable", 503)), True),
        (_wrapped(PermissionError("x"), _client_error("AccessDenied", 403)), False),
        (ValueError("bad option"), False),
    ],
)
def test_transient_or_not(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


# ---- credentials -------------------------------------------------------------------------------------------


def test_credentials_never_in_reprs_errors_or_logs(
    s3: S3Server, s3_out: str, http_serve: Any, out: sm.Output, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="wsishard")
    options = {**s3.storage_options, "key": "AKIDEXAMPLE", "secret": SECRET}
    opener = StreamOpener(options)
    assert SECRET not in repr(opener) and "AKIDEXAMPLE" not in repr(opener)
    assert pickle.loads(pickle.dumps(opener)).storage_options == options  # workers still get them
    s3.fs().rm(f"{s3_out}/shard-000000-0000.tar")
    with pytest.raises(ShardError) as shard_error:
        list(stream(s3_out, batch_size=4, resampled=False, storage_options=options))
    with pytest.raises(ManifestError) as manifest_error:
        stream(f"{s3_out}-missing", batch_size=4, storage_options=options)
    server: HttpServer = http_serve(Path(out.root).parent)
    with_password = server.url.replace("http://", f"http://reader:{SECRET}@")
    server.faults.fail = 2  # retried: logged
    assert read_bytes(f"{with_password}/out/{shard_name(1)}") == Path(out.path(1)).read_bytes()
    with pytest.raises(FileNotFoundError) as not_found:
        StreamOpener()(f"{with_password}/out/none.tar?X-Amz-Signature={SECRET}")
    with pytest.raises(ManifestError) as http_manifest:
        stream(f"{with_password}/elsewhere", batch_size=2)
    texts = [str(e.value) for e in (shard_error, manifest_error, not_found, http_manifest)]
    assert all(SECRET not in text for text in texts), texts
    assert "retrying" in caplog.text and SECRET not in caplog.text
    assert redact(f"s3://b/k?X-Amz-Credential=AKID&X-Amz-Signature={SECRET}") == (
        "s3://b/k?X-Amz-Credential=***&X-Amz-Signature=***"
    )


def test_redaction_catches_user_info_without_a_scheme_and_secrets_holding_slashes() -> None:
    botocore = f'Invalid bucket name "AKIDEXAMPLE:{SECRET}@bucket": Bucket name must match the regex'
    assert redact(botocore) == 'Invalid bucket name "***@bucket": Bucket name must match the regex'
    assert redact("s3://AKIDEXAMPLE:wJal/rXUtn+FEMI@bucket/in/x.svs") == "s3://***@bucket/in/x.svs"
    assert redact("no such key: AKID:wJal/rXU@bucket/x") == "no such key: ***@bucket/x"
    for kept in ("http://host:8080/a/b.svs", "s3://bucket/dir/a@b.svs", "/data/slides/a.svs", "12:30 @ noon"):
        assert redact(kept) == kept


def test_stream_refuses_credentials_in_an_s3_url_without_showing_them() -> None:
    with pytest.raises(OptionError, match=r"s3://\*\*\*@bucket/out: credentials in an s3:// URL are not read") as info:
        stream(f"s3://AKIDEXAMPLE:{SECRET}@bucket/out", batch_size=2)
    assert SECRET not in str(info.value) and "AKIDEXAMPLE" not in str(info.value)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_an_empty_object_reads_as_empty_and_a_small_one_whole(s3: S3Server, s3_bucket: str, prefetch: int) -> None:
    """The first block is asked for before the size is known (prefetch): an empty object's refused range is its end."""
    fs = s3.fs()
    fs.pipe(f"{s3_bucket}/empty.json", b"")
    fs.pipe(f"{s3_bucket}/small.json", b"abc")
    opener = StreamOpener(s3.storage_options, prefetch=prefetch)
    with opener(f"s3://{s3_bucket}/empty.json") as fh:
        assert fh.read() == b""
    with opener(f"s3://{s3_bucket}/small.json") as fh:
        assert fh.read() == b"abc"
    assert read_bytes(f"s3://{s3_bucket}/empty.json", s3.storage_options) == b""
