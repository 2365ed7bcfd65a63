"""Plain webdataset pipelines over wsishard outputs, for users who keep their own::

    urls = wsishard.shard_urls("s3://bucket/run", storage_options)  # from the manifest; local paths work too
    ds = (wds.WebDataset(urls, resampled=True, shardshuffle=False, nodesplitter=wds.split_by_node,
                         workersplitter=wds.split_by_worker,
                         select_files=wsishard.is_sample_member)  # read only jpg/png/webp, json, cls: no pickles
          .decode("rgb8").to_tuple("jpg", "cls"))
    loader = wds.WebLoader(ds, batch_size=64, num_workers=4,
                           worker_init_fn=lambda _: wsishard.register_gopen_schemes(storage_options=...))

``s3://`` and the other object-store schemes are opened through fsspec once :func:`register_gopen_schemes` has run
in each process that reads (DataLoader workers included).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import IO, Any

import fsspec
import webdataset as wds

from wsishard.storage.opener import StreamOpener, load_manifest
from wsishard.storage.urls import StorageOptions, join


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


def shard_urls(source: str, storage_options: StorageOptions | None = None) -> list[str]:
    """The shard locations of a build output, from its manifest, in manifest order (paths or URLs).

    Args:
        source: output folder, ``manifest.json`` path, or URL prefix.

    Raises:
        ManifestError: no readable manifest there.
    """
    manifest, root = load_manifest(source, storage_options, slides=False)
    return [join(root, record.name) for record in manifest.shards]
