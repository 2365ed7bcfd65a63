"""Sample-level pipeline stages: read a shard's samples (counted against its manifest), shuffle, decode, batch.

Every stage maps an iterator to an iterator and pickles, so DataLoader workers can receive it. Only the members
wsishard writes are read (the image, ``.json``, ``.cls``); ``.pyd``/``.pth``/``.pickle`` members are ignored and
nothing is ever unpickled.
"""

from __future__ import annotations

import io
import json
import logging
import tarfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal, TypedDict

import numpy as np
import torch
from PIL import Image
from webdataset.tariterators import base_plus_ext, tar_file_iterator

from wsishard.errors import ShardError
from wsishard.format import IMAGE_FORMATS, LABEL_EXT, META_EXT, PatchMeta
from wsishard.remote import redact

logger = logging.getLogger(__name__)

ErrorMode = Literal["raise", "skip"]
Opener = Callable[[str], IO[bytes]]
_WANTED = frozenset((*IMAGE_FORMATS, META_EXT, LABEL_EXT))
_PIL_FORMATS = ["JPEG", "PNG", "WEBP"]


class RawSample(TypedDict):
    """A sample as read from the tar: still encoded bytes (cheap to hold in the shuffle buffer)."""

    key: str
    shard: str
    image_ext: str
    image: bytes
    meta: bytes
    label: bytes | None


class Sample(TypedDict):
    """A decoded sample."""

    key: str
    shard: str
    image: np.ndarray  # (h, w, 3) uint8 RGB
    meta: PatchMeta
    label: int  # -1 when unlabelled


class Batch(TypedDict):
    """A batch as the workers yield it (pinned by the DataLoader when CUDA is there)."""

    image: torch.Tensor  # (b, h, w, 3) uint8 RGB
    label: torch.Tensor  # (b,) int64, -1 when unlabelled
    meta: list[PatchMeta]
    key: list[str]


@dataclass(frozen=True)
class ShardTask:
    """One shard to read: its location and the sample count its manifest promises."""

    url: str
    samples: int


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

    def __call__(self, src: Iterator[ShardTask]) -> Iterator[RawSample]:
        in_a_row = 0
        for task in src:
            try:
                yield from read_shard(task, self.opener)
                in_a_row = 0
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                self.skipped += 1
                in_a_row += 1
                logger.warning("skipping %s (%d skipped in this worker so far)", exc, self.skipped)
                if in_a_row >= self.max_failures:
                    raise ShardError(task.url, f"all {in_a_row} shards of this worker failed") from exc


def read_shard(task: ShardTask, opener: Opener) -> Iterator[RawSample]:
    """The samples of one shard, in order; never one with a missing member.

    Raises:
        ShardError: the shard cannot be opened or read, a sample lacks its image or ``.json``, or the
            shard holds another number of samples than ``task.samples``.
    """
    name = redact(task.url)  # what errors and samples show: no credentials from the URL
    try:
        stream = opener(task.url)
    except (OSError, ValueError) as exc:
        raise ShardError(name, f"cannot be opened ({type(exc).__name__}: {exc})") from exc
    count = 0
    try:
        for key, members in _group_members(tar_file_iterator(stream, select_files=_wanted)):
            yield _raw_sample(name, key, members)
            count += 1
    except ShardError:
        raise
    except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
        raise ShardError(name, f"unreadable after {count} samples ({type(exc).__name__}: {exc})") from exc
    finally:
        stream.close()
    if count != task.samples:
        raise ShardError(name, f"holds {count} samples, the manifest says {task.samples}")


def _wanted(fname: str) -> bool:
    return base_plus_ext(fname)[1] in _WANTED


def _group_members(files: Iterator[dict[str, Any]]) -> Iterator[tuple[str, dict[str, bytes]]]:
    key: str | None = None
    members: dict[str, bytes] = {}
    for item in files:
        prefix, ext = base_plus_ext(item["fname"])
        if prefix != key:
            if key is not None:
                yield key, members
            key, members = prefix, {}
        if ext in members:
            raise ValueError(f"duplicate member {item['fname']}")
        members[ext] = item["data"]
    if key is not None:
        yield key, members


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


def decode_sample(raw: RawSample) -> Sample:
    """Decode only wsishard's fields: image via PIL (JPEG/PNG/WebP only), ``.json``, ``.cls``.

    Raises:
        ShardError: a field does not decode (names the shard and the sample).
    """
    try:
        with Image.open(io.BytesIO(raw["image"]), formats=_PIL_FORMATS) as img:
            image = np.asarray(img if img.mode == "RGB" else img.convert("RGB"))  # (h, w, 3) uint8
        meta = json.loads(raw["meta"])
        label = int(raw["label"]) if raw["label"] is not None else int(meta.get("label", -1))
    except (OSError, ValueError, SyntaxError, TypeError, AttributeError) as exc:
        raise ShardError(raw["shard"], f"sample {raw['key']} does not decode ({type(exc).__name__}: {exc})") from exc
    return Sample(key=raw["key"], shard=raw["shard"], image=image, meta=meta, label=label)


@dataclass(frozen=True)
class Decode:
    """Decode each sample; with ``on_error="skip"`` a bad sample (or one of another size) is dropped."""

    on_error: ErrorMode = "raise"

    def __call__(self, src: Iterator[RawSample]) -> Iterator[Sample]:
        shape: tuple[int, ...] | None = None
        for raw in src:
            try:
                sample = decode_sample(raw)
                if shape is not None and sample["image"].shape != shape:
                    raise ShardError(sample["shard"], f"sample {sample['key']} is {sample['image'].shape}, "
                                     f"earlier samples are {shape}")  # fmt: skip
            except ShardError as exc:
                if self.on_error == "raise":
                    raise
                logger.warning("skipping %s", exc)
                continue
            shape = sample["image"].shape
            yield sample


def collate_samples(samples: Sequence[Sample]) -> Batch:
    """Stack decoded samples into a :class:`Batch` (uint8, channels last)."""
    image = torch.from_numpy(np.stack([s["image"] for s in samples]))  # (b, h, w, 3) uint8
    label = torch.tensor([s["label"] for s in samples], dtype=torch.int64)  # (b,)
    return Batch(image=image, label=label, meta=[s["meta"] for s in samples], key=[s["key"] for s in samples])


@dataclass(frozen=True)
class Batched:
    """Group samples into batches of ``size``; a last incomplete one is kept unless ``drop_last``."""

    size: int
    drop_last: bool = True

    def __call__(self, src: Iterator[Sample]) -> Iterator[Batch]:
        buf: list[Sample] = []
        for sample in src:
            buf.append(sample)
            if len(buf) == self.size:
                yield collate_samples(buf)
                buf = []
        if buf and not self.drop_last:
            yield collate_samples(buf)
