"""The summary of every shard index, beside the manifest (``index.npz``, :func:`summary_name`): per shard, in
manifest order, the count of samples of each label and the sparse count of each slide, which class and slide
weights need without opening a shard index (:class:`Summary`). ``build`` and ``merge`` write it from the shard
indexes' own summaries (:func:`summarize`, :func:`write_summary`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import logging
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from wsishard.errors import IndexFileError
from wsishard.format import part_label
from wsishard.shards.index import (
    INDEX_VERSION,
    IndexWriter,
    index_bytes,
    index_digest,
    index_name,
    index_shard_file,
    load_index,
)
from wsishard.storage.output import Destination
from wsishard.storage.urls import manifest_location

logger = logging.getLogger(__name__)

SUMMARY_NAME = "index.npz"  # the summary of every shard index, beside the manifest


def summary_name(part: tuple[int, int] | None = None) -> str:
    """``index.npz``, or ``index.part-0002-of-0008.npz`` for part 2 of 8 of a cluster build."""
    return SUMMARY_NAME if part is None else f"index.{part_label(part)}.npz"


def is_summary_name(name: str) -> bool:
    """True for a name :func:`summary_name` makes."""
    return name == SUMMARY_NAME or re.fullmatch(r"index\.part-\d{4,}-of-\d{4,}\.npz", name) is not None


@dataclass(frozen=True, eq=False)
class Summary:
    """Per shard (in manifest order): samples per label (dense over ``labels``) and per slide (sparse, CSR).

    Attributes:
        shards: (n,) shard names.
        labels: (L,) the label values found, sorted.
        label_counts: (n, L) samples of each label in each shard.
        slides: (S,) slide ids (bytes).
        slide_ptr: (n + 1,) shard ``s``'s slides are entries ``slide_ptr[s]:slide_ptr[s + 1]``, in the order of that
            shard index's ``slide_names``.
        slide_index: (entries,) rows of ``slides``.
        slide_count: (entries,) samples of that slide in that shard.
    """

    shards: np.ndarray
    labels: np.ndarray
    label_counts: np.ndarray
    slides: np.ndarray
    slide_ptr: np.ndarray
    slide_index: np.ndarray
    slide_count: np.ndarray

    def to_bytes(self) -> bytes:
        out = io.BytesIO()
        np.savez_compressed(out, version=np.int64(INDEX_VERSION), **{k: getattr(self, k) for k in _SUMMARY_FIELDS})
        return out.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, location: str = "<summary>") -> Summary:
        """Parse a summary (never unpickling anything).

        Raises:
            IndexFileError: not a summary, or inconsistent arrays.
        """
        try:
            with np.load(io.BytesIO(data), allow_pickle=False) as npz:
                arrays = {name: npz[name] for name in _SUMMARY_FIELDS}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError) as exc:
            raise IndexFileError(location, f"not an index summary ({type(exc).__name__}: {exc})") from exc
        out = cls(**arrays)
        n = len(out.shards)
        if (
            out.label_counts.shape != (n, len(out.labels))
            or out.slide_ptr.shape != (n + 1,)
            or out.slide_index.shape != out.slide_count.shape
            or int(out.slide_ptr[-1]) != len(out.slide_index)
            or (len(out.slide_index) and int(out.slide_index.max()) >= len(out.slides))
        ):
            raise IndexFileError(location, "index summary arrays do not agree with each other")
        return out

    def digest(self) -> str:
        """:func:`~wsishard.shards.index.index_digest` of the summary's arrays (the manifest's ``index_sha256``)."""
        return index_digest({k: getattr(self, k) for k in _SUMMARY_FIELDS})

    @property
    def samples(self) -> np.ndarray:
        """(n,) samples per shard."""
        return np.asarray(self.label_counts.sum(axis=1), dtype=np.int64)


_SUMMARY_FIELDS = ("shards", "labels", "label_counts", "slides", "slide_ptr", "slide_index", "slide_count")


def shard_summary(npz: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(labels, label_counts, slide_names, slide_counts)`` of one shard index (a loaded ``.npz``: only these small
    arrays are read from it)."""
    return npz["labels"], npz["label_counts"], npz["slide_names"], npz["slide_counts"]


def summarize(shards: Sequence[str], read: Callable[[str], Any]) -> Summary:
    """The summary of the shards named ``shards`` (in that order); ``read(name)`` gives a shard index's ``.npz``
    (``np.load`` of its file or bytes: only its summary arrays are read)."""
    per_shard = [shard_summary(read(name)) for name in shards]
    return combine(shards, per_shard)


def combine(shards: Sequence[str], per_shard: Iterable[tuple[np.ndarray, ...]]) -> Summary:
    """A :class:`Summary` from each shard's ``(labels, label_counts, slide_names, slide_counts)``."""
    items = list(per_shard)
    labels = np.unique(np.concatenate([it[0] for it in items] or [np.zeros(0, np.int64)])).astype(np.int64)
    label_counts = np.zeros((len(items), len(labels)), dtype=np.int64)
    for s, (lab, cnt, _, _) in enumerate(items):
        label_counts[s, np.searchsorted(labels, lab)] = cnt
    names = [it[2].astype("S") for it in items]
    every = np.concatenate(names) if names else np.zeros(0, "S1")
    slides, inverse = np.unique(every, return_inverse=True)
    ptr = np.concatenate([[0], np.cumsum([len(n) for n in names])]).astype(np.int64)
    counts = np.concatenate([it[3] for it in items]) if items else np.zeros(0, np.int64)
    return Summary(
        shards=np.array(list(shards), dtype="S"),
        labels=labels,
        label_counts=label_counts,
        slides=slides,
        slide_ptr=ptr,
        slide_index=inverse.astype(np.int32).reshape(-1),
        slide_count=counts.astype(np.int64),
    )


def per_shard(summary: Summary) -> dict[str, tuple[np.ndarray, ...]]:
    """Each shard's ``(labels, label_counts, slide_names, slide_counts)`` as :func:`combine` takes them, by name."""
    out: dict[str, tuple[np.ndarray, ...]] = {}
    for s, name in enumerate(summary.shards.astype(str).tolist()):
        present = summary.label_counts[s] > 0
        lo, hi = int(summary.slide_ptr[s]), int(summary.slide_ptr[s + 1])
        out[name] = (
            summary.labels[present],
            summary.label_counts[s][present],
            summary.slides[summary.slide_index[lo:hi]],
            summary.slide_count[lo:hi],
        )
    return out


def write_summary(dest: Destination, shards: Sequence[str], name: str, parts: Sequence[Summary] = ()) -> Summary | None:
    """Write the summary of the shards named ``shards`` (manifest order) as ``name`` in ``dest``: from the ``parts``'
    summaries (``wsishard merge``) where they cover every shard, else from each shard index's summary arrays.

    Returns None, writing nothing and logging why, where a shard has no index (a build resumed from one made by a
    wsishard without indexes): such an output streams as before, and ``select=``/``weights=`` refuse it.
    """
    known: dict[str, tuple[np.ndarray, ...]] = {}
    for part in parts:
        known.update(per_shard(part))
    items = []
    for shard in shards:
        if shard in known:
            items.append(known[shard])
            continue
        data = dest.read_bytes(index_name(shard))
        if data is None:
            data = _rebuild_index(dest, shard)
        if data is None:
            logger.warning("%s has no index: no %s written (select= and weights= need one)", shard, name)
            return None
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            items.append(shard_summary(npz))
    summary = combine(shards, items)
    dest.write_bytes(name, summary.to_bytes())
    return summary


def _rebuild_index(dest: Destination, shard: str) -> bytes | None:
    """Index ``shard`` again from its tar records and write its ``.idx.npz`` (deleted, or lost by an interrupted
    build): the same rows, so the same digest as the manifest records. None where the shard itself is missing."""
    from wsishard.storage.opener import StreamOpener  # here: the opener is not needed to build

    try:
        with StreamOpener(dict(dest.storage_options or {}))(dest.path(shard)) as fh:
            data = index_shard_file(fh)
    except FileNotFoundError:
        return None
    logger.warning("%s had no index (%s): indexed again from the shard", shard, index_name(shard))
    dest.write_bytes(index_name(shard), data)
    return data


def index_build(output: str, storage_options: Mapping[str, Any] | None = None) -> Summary:
    """Write the per-sample index of every shard of the build in ``output``, and its summary: an output built by
    a wsishard without indexes can then be streamed with ``select=`` and ``weights=``. Reads every shard once. The
    manifest is written again with each index's digest and the summary's (``index_sha256``), binding them to it.

    Raises:
        ManifestError: no readable manifest in ``output``.
    """
    from wsishard.storage.opener import StreamOpener, load_manifest  # here: the opener is not needed to build

    manifest, root = load_manifest(output, storage_options)
    dest = Destination(root, storage_options)
    opener = StreamOpener(dict(storage_options or {}))
    records = []
    for rec in manifest.shards:
        with opener(dest.path(rec.name)) as fh:
            writer = IndexWriter()
            writer.add_stream(fh)
        arrays = writer.arrays()
        dest.write_bytes(index_name(rec.name), index_bytes(arrays))
        records.append(dataclasses.replace(rec, index_sha256=index_digest(arrays)))
    summary = write_summary(dest, [rec.name for rec in manifest.shards], SUMMARY_NAME)
    assert summary is not None  # every index was just written
    bound = dataclasses.replace(manifest, shards=records, index_sha256=summary.digest())
    dest.write_bytes(manifest_location(output)[0].rsplit("/", 1)[-1], bound.to_json().encode())
    return summary


def label_totals(root: str, storage_options: Mapping[str, Any] | None = None) -> dict[int, int] | None:
    """Samples of each label in the whole build at ``root`` (-1: unlabelled), from its ``index.npz``; None when
    the output has no summary (built by a wsishard without indexes) or it cannot be read."""
    dest = Destination(root, storage_options)
    data = dest.read_bytes(SUMMARY_NAME)
    if data is None:
        return None
    try:
        summary = Summary.from_bytes(data, SUMMARY_NAME)
    except IndexFileError as exc:
        logger.warning("%s", exc)
        return None
    totals = summary.label_counts.sum(axis=0) if len(summary.shards) else np.zeros(len(summary.labels), np.int64)
    return {int(label): int(n) for label, n in zip(summary.labels, totals, strict=True)}


def mpp_totals(
    root: str, shards: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> dict[float, int] | None:
    """Samples of each patch mpp (6 decimals, as the index's ``mpp`` column) in ``shards`` of the build at ``root``,
    from their per-sample indexes (a multi-mpp build's counts per scale); None when one cannot be read."""
    dest, totals = Destination(root, storage_options), collections.Counter[float]()
    for shard in shards:
        data = dest.read_bytes(index_name(shard))
        if data is None:
            return None
        try:
            mpps = load_index(data, index_name(shard)).table(shard)["mpp"]
        except IndexFileError as exc:
            logger.warning("%s", exc)
            return None
        values, counts = np.unique(mpps, return_counts=True)
        totals.update({float(v): int(n) for v, n in zip(values, counts, strict=True)})
    return dict(sorted(totals.items()))
