"""Plain webdataset pipelines over wsishard outputs: ``wds.WebDataset("s3://...")`` through fsspec."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import IO, Any

import fsspec
import webdataset as wds

from wsishard.storage.opener import StreamOpener
from wsishard.storage.urls import StorageOptions


def _gopen_fsspec(
    url: str, mode: str = "rb", bufsize: int = 8192, *, storage_options: StorageOptions, **kw: Any
) -> IO[bytes]:
    if mode == "rb":
        return StreamOpener(storage_options)(url)
    stream: IO[bytes] = fsspec.open(url, mode, **dict(storage_options)).open()
    return stream


def register_gopen_schemes(
    schemes: Iterable[str] = ("s3", "gs", "gcs", "az", "abfs"), storage_options: StorageOptions | None = None
) -> None:
    """Let plain webdataset pipelines (``wds.WebDataset("s3://...")``) open ``schemes`` through fsspec.

    Reads go through :class:`StreamOpener` (large blocks, read-ahead, retries). ``wds.gopen_schemes`` is per
    process: call this in every DataLoader worker (e.g. from ``worker_init_fn``). wsishard's own
    :func:`wsishard.stream` does not need it: it opens shards with :class:`StreamOpener`.
    """
    opener = functools.partial(_gopen_fsspec, storage_options=dict(storage_options or {}))
    for scheme in schemes:
        wds.gopen_schemes[scheme] = opener
