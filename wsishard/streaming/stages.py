"""The pipeline's stages: each is picklable (DataLoader workers receive it) and maps an iterator to an iterator.

    shard list -> split by node -> split by worker -> (resample) -> read shards -> shuffle -> decode -> (budget)

Shard-level stages split and order :class:`ShardRef` s; :class:`ReadShards` turns them into :class:`RawSample` s
(still encoded: cheap to hold in the shuffle buffer), counted against the manifest. Only the members wsishard
writes are read (the image, ``.json``, ``.cls``); ``.pyd``/``.pth``/``.pickle`` members are ignored and nothing
is ever unpickled. Tar headers are parsed by :func:`wsishard.shards.reader.tar_members` rather than ``tarfile``
(about 20% of a worker's time otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Generic, Literal, TypedDict, TypeVar

import numpy as np

from wsishard.errors import ShardError
from wsishard.format import IMAGE_FORMATS, LABEL_EXT, META_EXT, is_sample_key, is_sample_member
from wsishard.shards.reader import group_members, tar_members
from wsishard.storage.secrets import redact
from wsishard.streaming.partition import resample_order

logger = logging.getLogger(__name__)

ErrorMode = Literal["raise", "skip"]
Opener = Callable[[str], IO[bytes]]
B = TypeVar("B")  # a batch


class RawSample(TypedDict):
    """A sample as read from the tar: still encoded bytes (cheap to hold in the shuffle buffer)."""

    key: str
    shard: str
    image_ext: str
    image: bytes
    meta: bytes
    label: bytes | None


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


@dataclass(frozen=True)
class ShardList:
    """The pipeline's source: the job's shards in this epoch's order."""

    tasks: tuple[ShardRef, ...]

    def __call__(self) -> Iterator[ShardRef]:
        return iter(self.tasks)


@dataclass(frozen=True)
class Resample:
    """Endless passes over this worker's shards, pass ``p`` ordered by ``rng((seed, rank, worker, p))``."""

    seed: int
    rank: int
    worker: int

    def __call__(self, src: Iterator[ShardRef]) -> Iterator[ShardRef]:
        tasks = list(src)
        for pass_index in range(2**62):
            order = resample_order(len(tasks), seed=self.seed, rank=self.rank, worker=self.worker,
                                   pass_index=pass_index)  # fmt: skip
            yield from (tasks[i] for i in order)


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
            logger.warning("%d batches short of the epoch budget after skipping; re-reading this worker's "
                           "shards", self.batches - count)  # fmt: skip
            got = 0
            for batch in self.refill(pass_index):
                yield batch
                count, got = count + 1, got + 1
                if count == self.batches:
                    return
            if got == 0:
                raise ShardError("(every shard of this worker)", f"re-reading gave no batch; {count} of "
                                 f"{self.batches} planned batches")  # fmt: skip


@dataclass
class ReadShards:
    """Open each shard, yield its samples as bytes, and check the count against the manifest.

    Args:
        opener: ``location -> binary file``.
        on_error: ``"raise"`` or ``"skip"``.
        max_failures: in skip mode, this many failures in a row (every shard of the worker) raise.
    """

    opener: Opener
    on_error: ErrorMode = "raise"
    max_failures: int = 1
    skipped: int = field(default=0, init=False)

    def __call__(self, src: Iterator[ShardRef]) -> Iterator[RawSample]:
        in_a_row = 0
        for task in src:
            try:
                yield from read_shard(task, self.opener, self.on_error)
                in_a_row = 0
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                self.skipped += 1
                in_a_row += 1
                logger.warning("skipping %s (%d skipped in this worker so far)", exc, self.skipped)
                if in_a_row >= self.max_failures:
                    raise ShardError(task.url, f"all {in_a_row} shards of this worker failed") from exc


def read_shard(task: ShardRef, opener: Opener, on_error: ErrorMode = "raise") -> Iterator[RawSample]:
    """The samples of one shard, in order; never one with a missing member or a key outside the key grammar.

    A sample whose member names are not ``<key>.<ext>`` with a :func:`~wsishard.format.is_sample_key` key (a
    path such as ``../../evil.jpg``, or a name wsishard never writes) is counted, but raised as broken
    (``on_error="raise"``) or left out and logged (``"skip"``); the rest of the shard is still read.

    Raises:
        ShardError: the shard cannot be opened or read, a sample lacks its image or ``.json``, a sample's
            key is not a key (raise mode), or the shard holds another number of samples than ``task.samples``.
    """
    name = redact(task.url)  # what errors and samples show: no credentials from the URL
    try:
        stream = opener(task.url)
    except (OSError, ValueError) as exc:
        raise ShardError(name, f"cannot be opened ({type(exc).__name__}: {exc})") from exc
    keep = _Keep(task.phase, task.step)
    try:
        for key, members in group_members(tar_members(stream, keep)):
            if is_sample_key(key):
                yield _raw_sample(name, key, members)
                continue
            bad = ShardError(name, f"sample {key[:120]!r} is not named <slide>_x<X>_y<Y>.<ext> (a path, or not a "
                                   "wsishard sample)")  # fmt: skip
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


class _Keep:
    """The member filter of :func:`read_shard`: the members of the samples a reader keeps (others are read past,
    never copied), counting every sample of the shard on the way."""

    def __init__(self, phase: int, step: int) -> None:
        self.phase, self.step = phase, step
        self.seen = 0  # samples met so far, kept or not
        self._key: str | None = None
        self._keeps = False

    def __call__(self, name: str) -> bool:
        if not is_sample_member(name):
            return False
        key = name[: name.find(".", name.rfind("/") + 1)]
        if key != self._key:
            self._key, self.seen = key, self.seen + 1
            self._keeps = (self.seen - 1) % self.step == self.phase
        return self._keeps


def _raw_sample(shard: str, key: str, members: dict[str, bytes]) -> RawSample:
    image_ext = next((ext for ext in IMAGE_FORMATS if ext in members), None)
    if image_ext is None or META_EXT not in members:
        missing = "an image" if image_ext is None else f".{META_EXT}"
        raise ShardError(shard, f"sample {key} lacks {missing} (truncated, or not a wsishard shard)")
    return RawSample(key=key, shard=shard, image_ext=image_ext, image=members[image_ext],
                     meta=members[META_EXT], label=members.get(LABEL_EXT))  # fmt: skip


@dataclass(frozen=True)
class Shuffle:
    """Shuffle buffer of ``size`` samples, seeded by ``seed`` (a tuple of non-negative ints)."""

    size: int
    seed: tuple[int, ...]

    def __call__(self, src: Iterator[RawSample]) -> Iterator[RawSample]:
        if self.size <= 1:
            yield from src
            return
        rng = np.random.default_rng(self.seed)
        buf: list[RawSample] = []
        draws, used = rng.random(1024), 0
        for sample in src:
            buf.append(sample)
            if len(buf) < self.size:
                continue
            if used == len(draws):
                draws, used = rng.random(1024), 0
            i = int(draws[used] * len(buf))
            used += 1
            buf[i], buf[-1] = buf[-1], buf[i]
            yield buf.pop()
        for i in rng.permutation(len(buf)).tolist():
            yield buf[i]
