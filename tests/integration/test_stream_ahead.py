"""Shards streamed from object storage read ahead (:class:`~wsishard.storage.opener.StreamOpener`): large ranges
fetched ahead of the reader, the next shard opened while the current one is read; the samples are those of the
local stream, and a request that fails mid-shard names the shard."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import shardmaker as sm
from streamtools import keys_of

from wsishard.errors import ShardError
from wsishard.storage.opener import _AHEAD, StreamOpener
from wsishard.storage.retry import RetryPolicy
from wsishard.streaming.sources import stream

if TYPE_CHECKING:
    from servers import HttpServer, S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(180)

STREAM = {"batch_size": 4, "resampled": False, "drop_last": False, "seed": 3, "shuffle": 0}


def test_a_stream_from_s3_yields_the_local_streams_samples_in_its_order(
    s3: S3Server, s3_bucket: str, stream_out: sm.Output
) -> None:
    url = f"s3://{s3_bucket}/stream"
    s3.fs().mkdir(url)
    s3.upload(stream_out.root, url)
    local = list(stream(stream_out.root, **STREAM))
    remote = list(stream(url, storage_options=s3.storage_options, **STREAM))
    assert keys_of(remote) == keys_of(local) and len(keys_of(local)) == sum(map(len, stream_out.keys.values()))
    assert all((a["image"] == b["image"]).all() for a, b in zip(remote, local, strict=True))


def test_the_next_shard_opened_ahead_is_the_reader_handed_out_and_asks_nothing_more(
    http_serve: Any, stream_out: sm.Output
) -> None:
    server: HttpServer = http_serve(stream_out.root)
    first, second = sorted(stream_out.keys)[:2]
    opener = StreamOpener(block_size=1 << 20)
    with opener(f"{server.url}/{first}") as fh:
        opener.ahead(f"{server.url}/{second}")
        deadline = time.monotonic() + 10
        while len(server.requests_to(second)) < 2 and time.monotonic() < deadline:  # its size, its first block
            time.sleep(0.01)
        fh.read()
    asked = len(server.requests_to(second))
    assert asked >= 2
    with opener(f"{server.url}/{second}") as fh:
        data = fh.read()
    assert data == Path(stream_out.root, second).read_bytes()
    assert len(server.requests_to(second)) == asked  # read from what was fetched ahead: no request of its own
    assert not [k for k in _AHEAD if k[1] == id(opener)]


def test_a_shard_opened_ahead_and_not_read_next_is_replaced_and_a_local_path_is_never_opened_ahead(
    http_serve: Any, stream_out: sm.Output
) -> None:
    server: HttpServer = http_serve(stream_out.root)
    names = sorted(stream_out.keys)
    opener = StreamOpener()
    opener.ahead(str(Path(stream_out.root, names[0])))
    assert not [k for k in _AHEAD if k[1] == id(opener)]
    opener.ahead(f"{server.url}/{names[0]}")
    opener.ahead(f"{server.url}/{names[1]}")  # the first is closed, the second kept
    (kept,) = [v for k, v in _AHEAD.items() if k[1] == id(opener)]
    assert kept[0] == f"{server.url}/{names[1]}"
    with opener(f"{server.url}/{names[2]}") as fh:  # another shard: opened as usual, the one ahead kept
        assert fh.read() == Path(stream_out.root, names[2]).read_bytes()
    assert [v for k, v in _AHEAD.items() if k[1] == id(opener)] == [kept]


def test_a_shards_first_block_is_asked_for_beside_its_size_not_after_it(
    http_serve: Any, stream_out: sm.Output, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One round trip to a shard's first byte, not two: the size's answer waits here until the server has the first
    block's GET (sent only after the size, it never would; the wait would end at its deadline)."""
    import wsishard.storage.remote

    server: HttpServer = http_serve(stream_out.root)
    name = max(stream_out.keys, key=lambda n: Path(stream_out.root, n).stat().st_size)
    seen: list[bool] = []
    info_size = wsishard.storage.remote._RemoteObject._info_size

    def slow_size(self: Any) -> int | None:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not any(m == "GET" and r for m, _, r in server.requests_to(name)):
            time.sleep(0.01)
        seen.append(any(m == "GET" and r for m, _, r in server.requests_to(name)))
        return info_size(self)  # type: ignore[no-any-return]

    monkeypatch.setattr(wsishard.storage.remote._RemoteObject, "_info_size", slow_size)
    with StreamOpener(block_size=4096)(f"{server.url}/{name}") as fh:
        assert fh.read() == Path(stream_out.root, name).read_bytes()  # the first block checked against the size
    assert seen == [True]
    server.log.clear()
    with StreamOpener(block_size=4096, prefetch=0)(f"{server.url}/{name}") as fh:  # no thread: size, then blocks
        assert fh.read() == Path(stream_out.root, name).read_bytes()
    assert seen == [True, False]


def test_a_request_failing_mid_shard_names_the_shard(http_serve: Any, stream_out: sm.Output) -> None:
    server: HttpServer = http_serve(stream_out.root)
    name = max(stream_out.keys, key=lambda n: Path(stream_out.root, n).stat().st_size)
    server.faults.fail, server.faults.match, server.faults.min_offset = 1000, name, 1  # every block after the first
    opener = StreamOpener(block_size=4096, retry=RetryPolicy(attempts=2, backoff_s=0.01, max_backoff_s=0.01))
    with pytest.raises(ShardError, match=f"{name}.*unreadable after"):
        list(stream(server.url, opener=opener, **STREAM))


def test_the_stream_opens_each_next_shard_ahead_while_the_current_one_is_read(
    http_serve: Any, stream_out: sm.Output
) -> None:
    server: HttpServer = http_serve(stream_out.root)
    events: list[tuple[str, str]] = []

    class Recording(StreamOpener):
        def __call__(self, location: str) -> Any:
            events.append(("open", location.rsplit("/", 1)[-1]))
            return super().__call__(location)

        def ahead(self, location: str) -> None:
            events.append(("ahead", location.rsplit("/", 1)[-1]))
            super().ahead(location)

    batches = list(stream(server.url, opener=Recording(), **STREAM))
    opened = [name for kind, name in events if kind == "open" and name.endswith(".tar")]
    assert sorted(opened) == sorted(stream_out.keys) and len(keys_of(batches)) > 0
    shards = [e for e in events if e[1].endswith(".tar")]
    for i, name in enumerate(opened[1:], 1):  # each shard but the first was asked for ahead, after the one before
        assert shards.index(("ahead", name)) > shards.index(("open", opened[i - 1]))
        assert shards.index(("ahead", name)) < shards.index(("open", name))
