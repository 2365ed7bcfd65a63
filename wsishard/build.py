"""Orchestration: find slides, scan them, plan, extract shards in a process pool, write the manifest last.

``build()`` is the one catch-all boundary of wsishard: a slide's failure anywhere (open, mpp, tissue, a corrupt
tile deep in level 0) is recorded with its reason and every other slide is still built. A slide that fails
during extraction is dropped from every shard it touched (those shards are rewritten), so nothing of a failed
slide is left in the output.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import multiprocessing as mp
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from wsishard import __version__
from wsishard.errors import OptionError
from wsishard.extract import ShardOutcome, ShardTask, SlideWork, close_readers, extract_shard
from wsishard.format import IMAGE_FORMATS, MANIFEST_NAME, Manifest, ShardRecord, SlideRecord, unique_slide_ids
from wsishard.grid import PatchOptions
from wsishard.plan import Plan, ShardPlan, make_plan
from wsishard.scan import ScanResult, ScanTask, scan_slide
from wsishard.slide import SLIDE_SUFFIXES
from wsishard.tissue import TissueOptions

logger = logging.getLogger(__name__)

_LIST_SUFFIXES = (".txt", ".lst", ".list", ".csv")
_TAR_BYTES_PER_MEMBER = 512 + 256  # header + mean padding
T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """Every option of a build. Defaults live here only.

    Attributes:
        patch: grid, resolution and selection of patches.
        tissue: tissue detection.
        image_format: ``jpg`` (lossy, ``quality``), ``png`` or ``webp`` (lossless).
        quality: JPEG quality 1..100.
        shard_size_bytes: shards are planned to hold at most about this many bytes (None: no byte limit).
        shard_samples: at most this many samples per shard (None: no count limit).
        group_slides: slides per group; every shard mixes the slides of its group.
        seed: seeds every random choice of the build.
        jobs: worker processes (None: all cores).
        qc: write ``qc/<slide>.png`` pictures.
        fast_path: decode TIFF-family tiles directly instead of through OpenSlide.
        default_mpp: level-0 mpp for slides that report none.
        mpp_overrides: slide (path, file name or stem) -> level-0 mpp; wins over the slide's own value.
        labels: slide (path, file name or stem) -> integer label written as ``.cls``.
        label_names: class names when labels were given as names (label i is ``label_names[i]``).
    """

    patch: PatchOptions = field(default_factory=PatchOptions)
    tissue: TissueOptions = field(default_factory=TissueOptions)
    image_format: str = "jpg"
    quality: int = 90
    shard_size_bytes: int | None = 256 * 1000**2
    shard_samples: int | None = None
    group_slides: int = 32
    seed: int = 0
    jobs: int | None = None
    qc: bool = True
    fast_path: bool = True
    default_mpp: float | None = None
    mpp_overrides: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, int] = field(default_factory=dict)
    label_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        checks = {
            "image_format": self.image_format in IMAGE_FORMATS,
            "quality": 1 <= self.quality <= 100,
            "shard_size_bytes": self.shard_size_bytes is None or self.shard_size_bytes >= 1024,
            "shard_samples": self.shard_samples is None or self.shard_samples >= 1,
            "group_slides": self.group_slides >= 1,
            "jobs": self.jobs is None or self.jobs >= 1,
            "default_mpp": self.default_mpp is None or 0 < self.default_mpp < 1000,
        }
        for name, ok in checks.items():
            if not ok:
                raise OptionError(f"invalid {name}: {getattr(self, name)!r}")


@dataclass(frozen=True)
class BuildProgress:
    """What a progress callback receives after each slide scanned and each shard written."""

    stage: str  # "scan" | "extract"
    done: int  # slides scanned, or shards finished
    total: int
    patches_done: int = 0
    patches_total: int = 0


ProgressCallback = Callable[[BuildProgress], None]


def find_slides(inputs: Sequence[str]) -> list[str]:
    """Slide files from folders (recursive), slide files, and text files listing slides (one per line).

    Raises:
        OptionError: an input does not exist, or nothing that looks like a slide was found.
    """
    found: list[str] = []
    for item in inputs:
        if os.path.isdir(item):
            found.extend(_walk(item))
        elif os.path.isfile(item) and item.lower().endswith(_LIST_SUFFIXES):
            found.extend(_read_list(item))
        elif os.path.isfile(item):
            found.append(item)
        else:
            raise OptionError(f"no such file or folder: {item}")
    paths = sorted(dict.fromkeys(os.path.normpath(p) for p in found))
    if not paths:
        raise OptionError(f"no slide files ({', '.join(SLIDE_SUFFIXES)}) found in: {', '.join(inputs)}")
    return paths


def _walk(folder: str) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (os.path.join(root, f) for f in files if f.lower().endswith(SLIDE_SUFFIXES) and f[0] != ".")


def _read_list(list_path: str) -> list[str]:
    here = os.path.dirname(list_path)
    with open(list_path, encoding="utf-8") as fh:
        lines = [ln.split(",", 1)[0].strip() for ln in fh]
    return [p if os.path.isabs(p) else os.path.join(here, p) for p in lines if p and not p.startswith("#")]


def lookup(table: Mapping[str, T], path: str) -> T | None:
    """Find ``path`` in a per-slide table keyed by path, file name, or file name without extension."""
    name = os.path.basename(path)
    for key in (path, os.path.abspath(path), name, name.rsplit(".", 1)[0]):
        if key in table:
            return table[key]
    return None


def build(inputs: Sequence[str], output: str, options: BuildOptions | None = None, *,
          progress: ProgressCallback | None = None) -> Manifest:  # fmt: skip
    """Build mixed tissue-patch shards from slides into ``output`` and return the manifest it wrote.

    Raises:
        OptionError: bad inputs (nothing found, a missing path). Bad slides never raise: they are failed records.
    """
    options = options or BuildOptions()
    paths = find_slides(inputs)
    os.makedirs(output, exist_ok=True)
    _remove_leftovers(output)
    if options.qc:
        os.makedirs(os.path.join(output, "qc"), exist_ok=True)
    jobs = options.jobs or os.cpu_count() or 1
    with _Pool(jobs) as pool:
        scans = _scan_all(pool, paths, output, options, progress)
        plan = make_plan([s.block_sizes for s in scans], samples_per_shard=_samples_per_shard(options, scans),
                         group_slides=options.group_slides, seed=options.seed)  # fmt: skip
        outcomes, failed = _extract_all(pool, plan, scans, output, options, progress)
    manifest = _manifest(inputs, options, scans, outcomes, failed)
    _write_manifest(output, manifest)
    return manifest


def _scan_all(pool: _Pool, paths: list[str], output: str, options: BuildOptions,
              progress: ProgressCallback | None) -> list[ScanResult]:  # fmt: skip
    ids = unique_slide_ids(paths)
    measure = (options.image_format, options.quality) if options.shard_size_bytes else None
    tasks = [
        ScanTask(index=i, path=p, slide_id=sid, patch=options.patch, tissue=options.tissue,
                 mpp_override=lookup(options.mpp_overrides, p), default_mpp=options.default_mpp,
                 label=lookup(options.labels, p), seed=options.seed, fast_path=options.fast_path,
                 qc_path=os.path.join(output, "qc", f"{sid}.png") if options.qc else None, measure=measure)
        for i, (p, sid) in enumerate(zip(paths, ids, strict=True))
    ]  # fmt: skip
    scans = []
    for result in pool.imap(scan_slide, tasks):
        scans.append(result)
        if progress:
            progress(BuildProgress("scan", len(scans), len(tasks)))
    return scans


def _samples_per_shard(options: BuildOptions, scans: list[ScanResult]) -> int:
    limits = [options.shard_samples] if options.shard_samples else []
    measured = [s.bytes_per_patch for s in scans if s.bytes_per_patch]
    if options.shard_size_bytes and measured:
        members = 3 if options.labels else 2
        per_sample = sum(measured) / len(measured) + members * _TAR_BYTES_PER_MEMBER
        limits.append(max(1, int(options.shard_size_bytes // per_sample)))
    return min(limits) if limits else 2**31


def _extract_all(pool: _Pool, plan: Plan, scans: list[ScanResult], output: str, options: BuildOptions,
                 progress: ProgressCallback | None) -> tuple[dict[int, ShardOutcome], dict[int, str]]:  # fmt: skip
    """Write every planned shard; a slide failing mid-way is excluded and the shards it touched are redone."""
    works = {
        i: SlideWork(s.record.file, s.record.slide_id, s.record.level or 0, s.cands, s.blocks, s.record.label)
        for i, s in enumerate(scans) if s.cands is not None
    }  # fmt: skip
    failed: dict[int, str] = {}
    done: dict[int, ShardOutcome] = {}
    pending: list[ShardPlan] = list(plan.shards)
    total_patches = sum(sp.patches for sp in plan.shards)
    while pending:
        tasks = [_shard_task(sp, works, frozenset(failed), output, options) for sp in pending]
        new_failed: dict[int, str] = {}
        for outcome in pool.imap_unordered(extract_shard, tasks):
            if outcome.failed_slide is not None:
                new_failed.setdefault(outcome.failed_slide, outcome.reason)
                continue
            done[outcome.index] = outcome
            if progress:
                written = sum(o.record.samples for o in done.values() if o.record)
                progress(BuildProgress("extract", len(done), len(plan.shards), written, total_patches))
        failed.update(new_failed)
        pending = [sp for sp in plan.shards if any(s in new_failed for s, _ in sp.blocks)]
        for sp in pending:  # rewritten without the failed slides, or gone if nothing else was in them
            stale = done.pop(sp.index, None)
            if stale is not None and stale.record is not None:
                os.remove(os.path.join(output, stale.record.name))
    return done, failed


def _shard_task(sp: ShardPlan, works: dict[int, SlideWork], excluded: frozenset[int], output: str,
                options: BuildOptions) -> ShardTask:  # fmt: skip
    slides = {s: works[s] for s in {s for s, _ in sp.blocks}}
    return ShardTask(index=sp.index, blocks=sp.blocks, slides=slides, excluded=excluded, output=output,
                     target_mpp=options.patch.target_mpp, image_format=options.image_format,
                     quality=options.quality, fast_path=options.fast_path)  # fmt: skip


def _manifest(inputs: Sequence[str], options: BuildOptions, scans: list[ScanResult],
              outcomes: dict[int, ShardOutcome], failed: dict[int, str]) -> Manifest:  # fmt: skip
    patches: dict[int, int] = {}
    for outcome in outcomes.values():
        for slide, n in (outcome.patches_by_slide or {}).items():
            patches[slide] = patches.get(slide, 0) + n
    slides: list[SlideRecord] = []
    for i, scan in enumerate(scans):
        record = scan.record
        if i in failed:
            record = dataclasses.replace(record, status="failed", reason=f"extraction: {failed[i]}", patches=0)
        elif record.status == "ok":
            record = dataclasses.replace(record, patches=patches.get(i, 0))
        slides.append(record)
    shards: list[ShardRecord] = [o.record for _, o in sorted(outcomes.items()) if o.record is not None]
    return Manifest(
        options={"inputs": list(inputs), **_options_dict(options)}, shards=shards, slides=slides,
        image_format=options.image_format, wsishard_version=__version__,
        extra={"label_names": list(options.label_names)} if options.label_names else {},
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    )  # fmt: skip


def _options_dict(options: BuildOptions) -> dict[str, Any]:
    data = dataclasses.asdict(options)
    data["mpp_overrides"] = dict(options.mpp_overrides)
    data["labels"] = dict(options.labels)
    return data


def _write_manifest(output: str, manifest: Manifest) -> None:
    final = os.path.join(output, MANIFEST_NAME)
    tmp = f"{final}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(manifest.to_json())
    os.replace(tmp, final)


def _remove_leftovers(output: str) -> None:
    """Remove temporary shard files an interrupted build left behind (they are never listed anywhere)."""
    for name in os.listdir(output):
        if name.startswith(".shard-") and ".tmp-" in name:
            os.remove(os.path.join(output, name))


class _Pool:
    """A process pool of ``jobs`` workers, or plain in-process calls for ``jobs == 1``."""

    def __init__(self, jobs: int) -> None:
        self._pool = None
        if jobs > 1:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["wsishard.scan", "wsishard.extract"])
            self._pool = ctx.Pool(jobs)

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return self._pool.imap(fn, items) if self._pool else map(fn, items)

    def imap_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return self._pool.imap_unordered(fn, items) if self._pool else map(fn, items)

    def __enter__(self) -> _Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate() if exc[0] else self._pool.close()
            self._pool.join()
        close_readers()
