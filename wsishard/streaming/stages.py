"""The pipeline's stages: each is picklable (DataLoader workers receive it) and maps an iterator to an iterator.

    shard list -> split by node -> split by worker -> (resample) -> read shards -> shuffle -> decode -> (budget)

Shard-level stages split and order :class:`ShardRef` s; :class:`ReadShards` turns them into :class:`RawSample` s
(still encoded: cheap to hold in the shuffle buffer), counted against the manifest. Only the members wsishard
writes are read (the image, ``.json``, ``.cls``); ``.pyd``/``.pth``/``.pickle`` members are ignored and nothing
is ever unpickled. Tar headers are parsed by :func:`wsishard.shards.reader.tar_members` rather than ``tarfile``,
which costs a worker much more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import IO, Generic, Literal, TypedDict, TypeVar

import numpy as np

from wsishard.errors import ShardError
from wsishard.format import IMAGE_FORMATS, LABEL_EXT, META_EXT, SAMPLE_EXTS, context_ext, context_exts, is_sample_key
from wsishard.shards.reader import TarSamples
from wsishard.storage.secrets import redact
from wsishard.streaming.partition import Slice, resample_order

logger = logging.getLogger(__name__)

ErrorMode = Literal["raise", "skip"]
Opener = Callable[[str], IO[bytes]]
B = TypeVar("B")  # a batch
SHUFFLE_STREAM = 1  # the seed word after a reader's (seed, rank, worker, epoch) that its shards' shuffles use


class RawSample(TypedDict):
    """A sample as read from the tar: still encoded bytes (cheap to hold in the shuffle buffer)."""

    key: str
    shard: str
    image_ext: str
    image: bytes
    meta: bytes
    label: bytes | None
    context: tuple[bytes, ...]  # the context members (ctx0, ctx1, ...) the stream reads; () without context


@dataclass(frozen=True)
class ShardRef:
    """One shard to read: its location, the sample count its manifest promises, and which samples to keep.

    A reader keeps samples ``k`` (0-based, in shard order) with ``k % step == phase``: all of them by default, or
    its own slice when a build has fewer shards than readers (:func:`wsishard.streaming.partition.reader_slices`).
    """

    url: str
    samples: int
    phase: int = 0
    step: int = 1

    @property
    def kept(self) -> int:
        """Samples this reader keeps of the shard."""
        return len(range(self.phase, self.samples, self.step))


Unit = tuple[int, ShardRef]  # a reader's shard (or slice of one) and its position in the reader's stream


def slice_refs(shards: Sequence[ShardRef], slices: Sequence[Slice]) -> tuple[ShardRef, ...]:
    """The shards a reader reads (:func:`~wsishard.streaming.partition.reader_slices`), each with its part kept."""
    return tuple(replace(shards[sl.shard], phase=sl.phase, step=sl.step) for sl in slices)


@dataclass(frozen=True)
class ShardList:
    """The pipeline's source: a reader's shards in order, numbered from 0, starting at position ``start``."""

    tasks: tuple[ShardRef, ...]
    start: int = 0

    def __call__(self) -> Iterator[Unit]:
        return ((i, self.tasks[i]) for i in range(self.start, len(self.tasks)))


@dataclass(frozen=True)
class Resample:
    """Endless passes over a reader's shards, pass ``p`` ordered by ``rng((seed, rank, worker, p))``, numbered on
    across passes (pass ``p``'s ``j``-th shard is at position ``p * n + j``); starts at position ``start``."""

    seed: int
    rank: int
    worker: int
    start: int = 0

    def __call__(self, src: Iterator[Unit]) -> Iterator[Unit]:
        tasks = [ref for _, ref in src]
        n = len(tasks)
        for pass_index in range(self.start // n, 2**62):
            order = resample_order(n, seed=self.seed, rank=self.rank, worker=self.worker, pass_index=pass_index)
            for j in range(self.start - pass_index * n if pass_index == self.start // n else 0, n):
                yield pass_index * n + j, tasks[int(order[j])]


@dataclass(frozen=True)
class Budget(Generic[B]):
    """Yield exactly ``batches`` batches (epoch mode: every rank's batch count stays equal).

    When the stream ends early (skipped shards under DDP), ``refill(p)`` for ``p = 1, 2, ...`` supplies
    batches re-read from the worker's own shards until the budget is met.
    """

    batches: int
    refill: Callable[[int], Iterator[B]] | None = None

    def __call__(self, src: Iterator[B]) -> Iterator[B]:
        count, pass_index = 0, 0
        for batch in src if self.batches > 0 else ():
            yield batch
            count += 1
            if count == self.batches:
                return
        while count < self.batches and self.refill is not None:
            pass_index += 1
            logger.warning(
                "%d batches short of the epoch budget after skipping; re-reading this worker's shards",
                self.batches - count,
            )
            got = 0
            for batch in self.refill(pass_index):
                yield batch
                count, got = count + 1, got + 1
                if count == self.batches:
                    return
            if got == 0:
                raise ShardError(
                    "(every shard of this worker)",
                    f"re-reading gave no batch; {count} of {self.batches} planned batches",
                )


@dataclass
class ReadShuffled:
    """Read each shard (or slice) and shuffle its samples, the buffer re-seeded at every shard: the samples a
    reader yields from position ``p`` on depend on ``p`` alone, so a resumed reader starts at any position by
    reading one shard again (``skip`` its first samples) instead of every shard before it.

    Args:
        opener: ``location -> binary file``.
        size: shuffle buffer, samples (0 or 1: shard order).
        seed: the reader's seed words; the shard at position ``p`` is shuffled by ``rng((*seed, p))``.
        on_error: ``"raise"`` or ``"skip"`` (the rest of a broken shard; what was read before is kept).
        max_failures: in skip mode, this many failed shards in a row (every shard of the reader) raise.
        skip: samples of the first shard's shuffled order to pass over (a resumed reader).
        context: context scales to read with each sample (:func:`read_shard`).
    """

    opener: Opener
    size: int
    seed: tuple[int, ...]
    on_error: ErrorMode = "raise"
    max_failures: int = 1
    skip: int = 0
    context: int = 0
    skipped: int = field(default=0, init=False)
    _in_a_row: int = field(default=0, init=False)

    def __call__(self, src: Iterator[Unit]) -> Iterator[RawSample]:
        first = True
        for position, task in src:
            samples = shuffled(self._read(task), self.size, (*self.seed, position))
            if first and self.skip:
                samples = islice(samples, self.skip, None)
            first = False
            yield from samples

    def _read(self, task: ShardRef) -> Iterator[RawSample]:
        try:
            yield from read_shard(task, self.opener, self.on_error, self.context)
            self._in_a_row = 0
        except ShardError as exc:
            if self.on_error == "raise":
                raise
            self.skipped += 1
            self._in_a_row += 1
            logger.warning("skipping %s (%d skipped in this worker so far)", exc, self.skipped)
            if self._in_a_row >= self.max_failures:
                raise ShardError(task.url, f"all {self._in_a_row} shards of this worker failed") from exc


def read_shard(task: ShardRef, opener: Opener, on_error: ErrorMode = "raise", context: int = 0) -> Iterator[RawSample]:
    """The samples of one shard, in order; never one with a missing member or a key outside the key grammar.

    With ``context`` scales, each sample's context members ``ctx0.<ext>`` ... are read too (and must be there);
    without, they are read past uncopied.

    A sample whose member names are not ``<key>.<ext>`` with a :func:`~wsishard.format.is_sample_key` key (a
    path such as ``../../evil.jpg``, or a name wsishard never writes) is counted, but raised as broken
    (``on_error="raise"``) or left out and logged (``"skip"``); the rest of the shard is still read.

    Raises:
        ShardError: the shard cannot be opened or read, a sample lacks its image, ``.json`` or a context member, a
            sample's
            key is not a key (raise mode), or the shard holds another number of samples than ``task.samples``.
    """
    name = redact(task.url)  # what errors and samples show: no credentials from the URL
    try:
        stream = opener(task.url)
    except (OSError, ValueError) as exc:
        raise ShardError(name, f"cannot be opened ({type(exc).__name__}: {exc})") from exc
    keep = TarSamples(stream, SAMPLE_EXTS | context_exts(context) if context else SAMPLE_EXTS, task.phase, task.step)
    try:
        for key, members in keep:
            if is_sample_key(key):
                yield _raw_sample(name, key, members, context)
                continue
            bad = ShardError(
                name, f"sample {key[:120]!r} is not named <slide>_x<X>_y<Y>.<ext> (a path, or not a wsishard sample)"
            )
            if on_error == "raise":
                raise bad
            logger.warning("skipping %s", bad)
    except ShardError:
        raise
    except (EOFError, OSError, ValueError) as exc:
        raise ShardError(name, f"unreadable after {keep.seen} samples ({type(exc).__name__}: {exc})") from exc
    finally:
        stream.close()
    if keep.seen != task.samples:
        raise ShardError(name, f"holds {keep.seen} samples, the manifest says {task.samples}")


def _raw_sample(shard: str, key: str, members: dict[str, bytes], context: int = 0) -> RawSample:
    image_ext = next(filter(members.__contains__, IMAGE_FORMATS), None)  # no generator frame: ~0.2 us a sample
    if image_ext is None or META_EXT not in members:
        missing = "an image" if image_ext is None else f".{META_EXT}"
        raise ShardError(shard, f"sample {key} lacks {missing} (truncated, or not a wsishard shard)")
    return RawSample(
        key=key,
        shard=shard,
        image_ext=image_ext,
        image=members[image_ext],
        meta=members[META_EXT],
        label=members.get(LABEL_EXT),
        context=_context_members(shard, key, members, context) if context else (),
    )


def _context_members(shard: str, key: str, members: dict[str, bytes], scales: int) -> tuple[bytes, ...]:
    """The sample's context members ``ctx0`` ... ``ctx<scales - 1>`` (any image format), in scale order.

    Raises:
        ShardError: one is missing (the build has fewer scales, or the shard is damaged).
    """
    found = []
    for k in range(scales):
        ext = next((e for e in IMAGE_FORMATS if context_ext(k, e) in members), None)
        if ext is None:
            raise ShardError(
                shard,
                f"sample {key} lacks its context member {context_ext(k, 'jpg')} (or .png/.webp): "
                f"the manifest promises {scales} context scale(s)",
            )
        found.append(members[context_ext(k, ext)])
    return tuple(found)


def shuffled(src: Iterator[RawSample], size: int, seed: tuple[int, ...]) -> Iterator[RawSample]:
    """A shuffle buffer of ``size`` samples over ``src``, seeded by ``seed`` (non-negative ints)."""
    if size <= 1:
        yield from src
        return
    rng = np.random.default_rng(seed)
    buf: list[RawSample] = []
    draws, used = rng.random(1024), 0
    for sample in src:
        buf.append(sample)
        if len(buf) < size:
            continue
        if used == len(draws):
            draws, used = rng.random(1024), 0
        i = int(draws[used] * len(buf))
        used += 1
        buf[i], buf[-1] = buf[-1], buf[i]
        yield buf.pop()
    for i in rng.permutation(len(buf)).tolist():
        yield buf[i]
