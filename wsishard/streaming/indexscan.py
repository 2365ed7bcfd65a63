"""Reading the per-sample index at stream time: the index summary of each source (``index.npz``) and each shard's
``.idx.npz``, checked against what the manifest records of them (their counts and digests, which bind each index to
its shard), and the main process's scan of every shard index for ``select=`` and weight functions, alone or split
over the ranks of a DDP job (:func:`scan_shared`), where an error on one rank is raised on every rank.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from wsishard.errors import IndexFileError, ManifestError, ShardError
from wsishard.manifest import Manifest
from wsishard.shards.index import ShardIndex, load_index
from wsishard.shards.summary import SUMMARY_NAME, Summary
from wsishard.storage.opener import read_bytes
from wsishard.storage.secrets import redact
from wsishard.storage.urls import StorageOptions, join
from wsishard.streaming import sampling
from wsishard.streaming.stages import Opener

if TYPE_CHECKING:
    from wsishard.streaming.selection import SamplingPlan, Source

Share = tuple[int, int, Callable[[np.ndarray], np.ndarray] | None]  # (rank, size, sum over the processes)
_READERS = 8  # shard indexes read at once in the main process's scan


def shard_of(location: str) -> str:
    """The shard name an index location stands for (its last path part, ``.idx.npz`` made ``.tar``)."""
    return location.rsplit("/", 1)[-1].replace(".idx.npz", ".tar")


def read_summary(src: Source, storage_options: StorageOptions | None) -> Summary:
    """The index summary of ``src``, checked against its manifest (shards, per-shard counts, digest).

    Raises:
        ManifestError: ``src`` has none (built by a wsishard without indexes).
        IndexFileError: it is unreadable, or lists other shards, counts or a digest than the manifest records.
    """
    location = join(src.root, SUMMARY_NAME)
    try:
        data = read_bytes(location, storage_options)
    except FileNotFoundError as exc:
        raise ManifestError(
            src.where,
            f"has no per-sample index ({SUMMARY_NAME}): it was built by a wsishard "
            "without one; select= and weights= need it (rebuild it, or stream it without "
            "them)",
        ) from exc
    shown = redact(location, storage_options)
    summary = Summary.from_bytes(data, shown)
    names = [rec.name for rec in src.manifest.shards]
    if summary.shards.astype(str).tolist() != names:
        raise IndexFileError(shown, "lists other shards than the manifest (a stale index?)")
    _check_summary(src.manifest, summary, shown)
    return summary


def _check_summary(manifest: Manifest, summary: Summary, shown: str) -> None:
    """Raises IndexFileError where the summary's counts or digest differ from what the manifest records."""
    counts = [rec.samples for rec in manifest.shards]
    wrong = np.flatnonzero(summary.samples != np.asarray(counts, dtype=np.int64))
    if len(wrong):
        s = int(wrong[0])
        raise IndexFileError(
            shown, f"counts {int(summary.samples[s])} samples in {manifest.shards[s].name}, the manifest {counts[s]}"
        )
    if manifest.index_sha256 and summary.digest() != manifest.index_sha256:
        raise IndexFileError(
            shown,
            "is not the summary the build wrote (its label or slide counts differ from the digest the manifest "
            "records: edited, or another build's)",
        )


def scan_shared(
    plan: SamplingPlan, opener: Opener, n_labels: int, share: Share | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per shard its selected samples per label (n, L), per slide (in CSR order) and its total weight under a
    weight function (relative: the largest shard's is 1, so that weights of 1e308 a sample cannot overflow), from
    every shard index. With ``share`` (``(rank, size, sum)``: ``sum`` adds an array over the
    ``size`` processes, each calling it with the same shape) this process reads shards ``rank::size`` only, and an
    error on any process (an index that does not match its shard, a bad ``select``) is raised on every process: the
    sum carries a flag per process, so none waits in the collective for one that failed.

    Raises:
        IndexFileError: a shard index cannot be read or does not match its shard (here or on another process).
        ValueError: ``select`` or a weight function returned bad values (here or on another process).
    """
    rank, size, total = share or (0, 1, None)
    label_counts = np.zeros((len(plan.rows), n_labels), dtype=np.int64)
    slide_count = np.zeros(len(plan.slide_global), dtype=np.int64)
    totals = np.zeros(len(plan.rows))
    failed: _ScanFailure | None = None
    try:
        _scan_mine(plan, opener, (rank, size), label_counts, slide_count, totals)
    except _ScanFailure as exc:
        failed = exc
    if failed is not None and (total is None or size == 1):
        raise failed.error
    if total is None or size == 1:
        return label_counts, slide_count, sampling.from_log_totals(totals)
    # each entry is non-zero on exactly one process: the sums are exact and the same everywhere
    flags = np.zeros(size)  # per process: 0 ok, else +-(1 + the shard it failed on); + for an index's fault
    if failed is not None:
        flags[rank] = (1 + failed.shard) * (1 if isinstance(failed.error, ShardError) else -1)
    flat = total(np.concatenate([label_counts.ravel(), slide_count, totals, flags]).astype(np.float64))
    _raise_failed(plan, flat[-size:], failed)
    cut = label_counts.size + slide_count.size
    return (
        flat[: label_counts.size].astype(np.int64).reshape(label_counts.shape),
        flat[label_counts.size : cut].astype(np.int64),
        sampling.from_log_totals(flat[cut:-size]),
    )


class _ScanFailure(Exception):
    """A scan's error (``error``) at shard ``shard``, on its way to every process."""

    def __init__(self, shard: int, error: Exception) -> None:
        super().__init__(str(error))
        self.shard, self.error = shard, error


def _scan_mine(
    plan: SamplingPlan,
    opener: Opener,
    share: tuple[int, int],
    label_counts: np.ndarray,
    slide_count: np.ndarray,
    totals: np.ndarray,
) -> None:
    """Fill in the counts of shards ``rank::size``.

    Raises:
        _ScanFailure: an index or ``select``/weights error, with the shard it happened at.
    """
    rank, size = share
    n_labels = label_counts.shape[1]
    with ThreadPoolExecutor(_READERS) as pool:  # reads overlap (object stores: latency); masks in order, here
        for s, index in _read_ahead(pool, plan, opener, rank, size):
            try:
                table = index.table(shard_of(plan.index_urls[s]))
                mask = plan.mask(s, index, table)
                label_counts[s] = np.bincount(
                    np.searchsorted(plan.labels, index.columns["label"][mask]), minlength=n_labels
                )
                lo, hi = int(plan.slide_ptr[s]), int(plan.slide_ptr[s + 1])
                slide_count[lo:hi] = np.bincount(index.columns["slide"][mask], minlength=hi - lo)[: hi - lo]
                if callable(plan.weights):  # its log: 1e308 a sample would overflow a sum
                    totals[s] = sampling.log_total(plan.sample_weights(s, index, table)[mask])
            except Exception as exc:  # the user's select/weights too (a KeyError for a misspelt column): no rank
                raise _ScanFailure(s, exc) from exc  # may leave the collective below without the others knowing


def _raise_failed(plan: SamplingPlan, flags: np.ndarray, failed: _ScanFailure | None) -> None:
    """Raise this process's own scan error, or, where another process's failed, one naming that process's shard."""
    if failed is not None:
        raise failed.error
    bad = np.flatnonzero(flags)
    if not len(bad):
        return
    other, code = int(bad[0]), int(flags[bad[0]])
    s = abs(code) - 1
    where = redact(plan.index_urls[s]) if 0 <= s < len(plan.index_urls) else "(a shard index)"
    if code > 0:
        raise IndexFileError(where, f"rank {other} found this index unusable while scanning it (its error says why)")
    raise ValueError(f"rank {other} failed scanning {where} (select= or weights=: its error says why)")


def _read_ahead(
    pool: ThreadPoolExecutor, plan: SamplingPlan, opener: Opener, rank: int, size: int
) -> Iterator[tuple[int, ShardIndex]]:
    """``(s, index)`` of shards ``rank::size`` in order, up to ``2 * _READERS`` read ahead.

    Raises:
        _ScanFailure: an index that cannot be read or does not match its shard.
    """
    pending: deque[tuple[int, Future[ShardIndex]]] = deque()

    def done() -> tuple[int, ShardIndex]:
        s, future = pending.popleft()
        try:
            return s, future.result()
        except Exception as exc:
            raise _ScanFailure(s, exc) from exc

    for s in range(rank, len(plan.rows), size):
        pending.append((s, pool.submit(load_shard_index, plan, s, opener)))
        if len(pending) > 2 * _READERS:
            yield done()
    while pending:
        yield done()


def load_shard_index(plan: SamplingPlan, s: int, opener: Opener) -> ShardIndex:
    """Shard ``s``'s index, read whole through ``opener``, checked against what the manifest records of its shard.

    Raises:
        IndexFileError: it cannot be read, is no index, holds another number of samples than the shard, or is not
            the index the build wrote for this shard (its digest differs: another shard's or build's, or edited).
    """
    location = plan.index_urls[s]
    shown = redact(location)
    try:
        with opener(location) as fh:
            data = fh.read()
    except OSError as exc:
        raise IndexFileError(shown, f"cannot be read ({type(exc).__name__}: {exc})") from exc
    index = load_index(data, shown)
    if len(index) != int(plan.rows[s]):
        raise IndexFileError(shown, f"indexes {len(index)} samples, the manifest says its shard holds {plan.rows[s]}")
    recorded = plan.index_digests[s] if s < len(plan.index_digests) else ""
    if recorded and index.digest != recorded:
        raise IndexFileError(
            shown,
            f"is not the index the build wrote for {shard_of(shown)} (its digest {index.digest[:12]}... differs "
            f"from the manifest's {recorded[:12]}...: another shard's or build's index, or edited); "
            "wsishard.shards.summary.index_build (or re-running the build) writes it again from the shard",
        )
    return index
