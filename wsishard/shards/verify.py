"""Check a build output against its manifest: every shard's presence, size, sha256 and sample count, and every
sample against the manifest's options.

Each shard listed in the manifest is read once, start to end (local file or any fsspec URL, through
:class:`~wsishard.storage.opener.StreamOpener`, so object storage gets large reads and retries): the bytes are hashed
and counted while the standard library's ``tarfile`` walks the members in stream mode, and samples are counted
as runs of members sharing a key, as the stream reader counts them. A shard that is missing, truncated, altered
(even zero-filled to its original length, which a tar reader takes for a clean end) or that holds another
number of samples is a problem. So is a shard with a sample that does not match the options
(:class:`~wsishard.shards.samplerules.SampleRules`), or whose per-sample index does not match it or the manifest
(:mod:`~wsishard.shards.verify_index`), and an index summary that does not. ``shard-*.tar`` files that the manifest
does not list, and temporary files of an interrupted build, are warnings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import tarfile
from collections import Counter
from collections.abc import Callable, Container, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import IO, Any, cast

from wsishard.format import (
    BAG_EXTS,
    KEYS_EXT,
    is_sample_member,
    is_shard_name,
    split_member,
    temp_target,
)
from wsishard.manifest import ShardRecord
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.shards.hashing import HashingFile
from wsishard.shards.index import index_name
from wsishard.shards.reader import group_members
from wsishard.shards.samplerules import SampleRules, sample_problems
from wsishard.shards.summary import SUMMARY_NAME
from wsishard.shards.verify_index import Counts, check_index, summary_problems
from wsishard.storage.opener import StreamOpener, list_names, load_manifest
from wsishard.storage.output import Destination
from wsishard.storage.secrets import describe, redact
from wsishard.storage.urls import StorageOptions, join

logger = logging.getLogger(__name__)

_MAX_READ = 1 << 20  # bytes read of a member: headers, .json and .cls are far smaller; the rest is only hashed


@dataclass(frozen=True)
class VerifyProgress:
    """What a progress callback receives after each shard checked."""

    done: int  # shards checked so far
    total: int
    bytes_done: int  # bytes read so far
    bytes_total: int  # bytes the manifest lists


@dataclass(frozen=True, kw_only=True)
class VerifyReport:
    """The outcome of :func:`verify`.

    Attributes:
        output: the build output checked (credentials redacted).
        shards_checked: shards the manifest lists (every one was read, or found missing).
        samples_checked: samples counted in the shards read.
        bytes_checked: bytes read.
        problems: ``(shard name, reason)`` for every shard that does not match the manifest (its index's problems
            among them), and ``("index.npz", reason)`` for an index summary that does not.
        warnings: ``(file name, reason)`` for stray or temporary files, or a folder that could not be listed.
    """

    output: str
    shards_checked: int
    samples_checked: int = 0
    bytes_checked: int = 0
    problems: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when no shard has a problem (warnings do not count)."""
        return not self.problems


@dataclass(frozen=True)
class ShardCheck:
    """One shard as read: samples counted, bytes read, and how it differs from the manifest (empty: it matches);
    ``keys_sha256`` of its keys in order (None: not read whole), ``counts`` its index's (None: no usable index)."""

    name: str
    samples: int
    nbytes: int
    reasons: list[str]
    keys_sha256: str | None = None
    counts: Counts | None = None


def verify(
    output: str,
    storage_options: StorageOptions | None = None,
    progress: ProgressCallback[VerifyProgress] = ignore_progress,
    *,
    jobs: int = 4,
) -> VerifyReport:
    """Re-read every shard of a build output and compare it with the manifest.

    Args:
        output: build output folder, ``manifest.json`` path, or URL prefix.
        storage_options: fsspec options for URLs (endpoint, credentials...).
        progress: called after each shard with a :class:`VerifyProgress`.
        jobs: shards read at the same time (threads).

    Returns:
        The report; ``report.ok`` is False when any shard is missing, truncated, altered or miscounted, or an index
        (or the summary) is missing where the build wrote one, or does not match its shard or the manifest.

    Raises:
        ManifestError: the manifest is missing or unreadable, names a shard that is no shard file name, or
            lacks the patch size.
        ValueError: ``jobs < 1``.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    manifest, root = load_manifest(output, storage_options)
    rules = SampleRules.of(manifest, redact(output, storage_options))
    opener = StreamOpener(dict(storage_options or {}))
    problems = [(name, "listed more than once in the manifest") for name in _duplicates(manifest.shards)]
    results: dict[str, ShardCheck] = {}  # by name: duplicates are read twice, reported once
    done, done_bytes, total_bytes = 0, 0, manifest.total_bytes
    summary = _read_or_none(opener, join(root, SUMMARY_NAME))
    indexed = summary is not None or bool(manifest.index_sha256)
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="wsishard-verify") as pool:
        futures = [pool.submit(_check_with_index, root, rec, opener, rules, indexed) for rec in manifest.shards]
        for future in as_completed(futures):
            result = future.result()
            results[result.name] = result
            logger.debug("%s: %s", result.name, "; ".join(result.reasons) or "ok")
            done, done_bytes = done + 1, done_bytes + result.nbytes
            progress(VerifyProgress(done, len(futures), done_bytes, total_bytes))
    listed = dict.fromkeys(rec.name for rec in manifest.shards)  # manifest order, each name once
    problems += [(name, "; ".join(results[name].reasons)) for name in listed if results[name].reasons]
    problems += summary_problems(manifest, summary, [results[rec.name].counts for rec in manifest.shards], indexed)
    return VerifyReport(
        output=redact(output, storage_options),
        shards_checked=len(manifest.shards),
        samples_checked=sum(r.samples for r in results.values()),
        bytes_checked=sum(r.nbytes for r in results.values()),
        problems=problems,
        warnings=_stray_files(root, listed, storage_options),
    )


def check_shard(
    location: str, record: ShardRecord, opener: Callable[[str], IO[bytes]], rules: SampleRules | None = None
) -> ShardCheck:
    """Read one shard and list how it differs from its manifest record and, with ``rules``, how its samples
    differ from the manifest's options (nothing when it matches)."""
    try:
        stream = opener(location)
    except FileNotFoundError:
        return ShardCheck(record.name, 0, 0, ["missing"])
    except OSError as exc:
        return ShardCheck(record.name, 0, 0, [f"cannot be opened ({describe(exc)})"])
    hashing = HashingFile(stream)
    samples, reasons, keys = 0, [], hashlib.sha256()
    found: dict[str, tuple[int, str, str]] = {}  # sample problem -> (samples, first key, its detail)
    try:
        try:
            for key, members in _samples(hashing, rules is not None and rules.bags):
                samples += 1
                keys.update(key.encode("utf-8", "surrogateescape") + b"\n")
                for problem, detail in sample_problems(key, members, rules):
                    count, first, first_detail = found.get(problem, (0, key, detail))
                    found[problem] = (count + 1, first, first_detail)
        except (tarfile.TarError, EOFError, ValueError) as exc:  # the bytes are still read, hashed and counted
            reasons.append(f"not a valid tar after {samples} samples ({describe(exc)})")
        hashing.drain()
    except OSError as exc:  # the stream itself broke: sizes and hashes would mean nothing
        return ShardCheck(
            record.name,
            samples,
            hashing.nbytes,
            [*reasons, f"cannot be read past byte {hashing.nbytes} ({describe(exc)})"],
        )
    finally:
        stream.close()
    reasons += _compare(record, samples, hashing.nbytes, hashing.hexdigest())
    for problem, (count, key, detail) in found.items():
        reasons.append(f"{count} {problem} (first: {key[:120]!r}{', ' + detail if detail else ''})")
    return ShardCheck(record.name, samples, hashing.nbytes, reasons, None if reasons else keys.hexdigest())


def _check_with_index(
    root: str, record: ShardRecord, opener: Callable[[str], IO[bytes]], rules: SampleRules, indexed: bool
) -> ShardCheck:
    """:func:`check_shard`, then the shard's index against it (:func:`~wsishard.shards.verify_index.check_index`)."""
    shard = check_shard(join(root, record.name), record, opener, rules)
    more, counts = check_index(join(root, index_name(record.name)), record, shard.keys_sha256, opener, indexed)
    return dataclasses.replace(shard, reasons=shard.reasons + more, counts=counts)


def recorded_shard_damage(
    dest: Destination, record: ShardRecord, stat: tuple[int, int | None] | None, recorded_ns: int | None
) -> str:
    """What is wrong with a shard a build recorded as written, in a few words ("": nothing seen), without reading an
    intact shard: ``stat`` is its ``(bytes, modification time in ns)`` from :meth:`Destination.file_stats` (None:
    missing), ``recorded_ns`` the record's time. The size is checked always; the sha256 only where the shard
    changed after its record was written (shards are written before their records)."""
    if stat is None:
        return "is missing"
    size, mtime_ns = stat
    if size != record.bytes:
        return f"holds {size} bytes, not the {record.bytes} recorded"
    if mtime_ns is None or recorded_ns is None or mtime_ns <= recorded_ns:
        return ""
    digest = hashlib.sha256()
    with open(dest.path(record.name), "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return "" if digest.hexdigest() == record.sha256 else "was altered since (its sha256 differs)"


def _compare(record: ShardRecord, samples: int, nbytes: int, sha256: str) -> list[str]:
    reasons = []
    if nbytes < record.bytes:
        reasons.append(f"truncated: {nbytes} bytes, the manifest says {record.bytes}")
    elif nbytes > record.bytes:
        reasons.append(f"{nbytes} bytes, the manifest says {record.bytes}")
    elif sha256 != record.sha256:
        reasons.append("sha256 differs from the manifest (altered)")
    if samples != record.samples:
        reasons.append(f"holds {samples} samples, the manifest says {record.samples}")
    return reasons


def _samples(fileobj: HashingFile, bags: bool = False) -> Iterator[tuple[str, dict[str, bytes]]]:
    """``(key, {ext: data})`` per sample: runs of wanted regular members (with ``bags``, an embeddings output's) sharing
    a key, in order; of each member its first :data:`_MAX_READ` bytes (the rest is read past, and hashed, by
    ``tarfile``)."""
    wants = _bag_member if bags else is_sample_member
    with tarfile.open(fileobj=cast(Any, fileobj), mode="r|") as tar:
        wanted = ((m.name, _head(tar, m)) for m in tar if m.isfile() and wants(m.name))
        yield from group_members(wanted)


def _bag_member(name: str) -> bool:
    parts = split_member(name)
    return parts is not None and parts[1] in (*BAG_EXTS, KEYS_EXT)


def _head(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    data = tar.extractfile(member)
    return data.read(_MAX_READ) if data is not None else b""


def _read_or_none(opener: Callable[[str], IO[bytes]], location: str) -> bytes | None:
    """The bytes at ``location``, or None where there is no such file (or it cannot be read: the summary check
    then reports it missing only where the manifest says the build wrote one)."""
    try:
        with opener(location) as fh:
            return fh.read()
    except OSError:
        return None


def _duplicates(shards: list[ShardRecord]) -> list[str]:
    counts = Counter(rec.name for rec in shards)
    return sorted(name for name, n in counts.items() if n > 1)


def _stray_files(root: str, listed: Container[str], storage_options: StorageOptions | None) -> list[tuple[str, str]]:
    """Warnings for shard files the manifest does not list and for leftover temporary shards."""
    try:
        names = list_names(root, storage_options)
    except OSError as exc:
        return [(redact(root, storage_options), f"cannot be listed to look for stray shards ({describe(exc)})")]
    warnings = []
    for name in names:
        target = temp_target(name)
        if is_shard_name(name) and name not in listed:
            warnings.append((name, "not in the manifest (stray shard)"))
        elif target is not None and is_shard_name(target):
            warnings.append((name, "temporary file of an interrupted build"))
    return warnings


def format_report(report: VerifyReport) -> str:
    """The report as lines of text for a terminal: a verdict, then each problem and warning."""
    size_mb = report.bytes_checked / 1e6
    shards = f"{report.shards_checked} shard{'' if report.shards_checked == 1 else 's'}"
    samples = f"{report.samples_checked} sample{'' if report.samples_checked == 1 else 's'}"
    lines = [f"{report.output}: {shards}, {samples}, {size_mb:.1f} MB checked"]
    lines += [f"  problem  {name}: {reason}" for name, reason in report.problems]
    lines += [f"  warning  {name}: {reason}" for name, reason in report.warnings]
    bad = len({name for name, _ in report.problems})
    lines.append("OK" if report.ok else f"FAILED: {bad} of {report.shards_checked} shards do not match the manifest")
    return "\n".join(lines)
