"""Reading a shard: :func:`read_shard` turns a :class:`ShardRef` into :class:`RawSample` s (still encoded: cheap to
hold in the shuffle buffer), counted against the manifest (the reader stage, :mod:`wsishard.streaming.reader`,
calls it for each piece). Only the members wsishard writes are read (the image, ``.json``, ``.cls``);
``.pyd``/``.pth``/``.pickle`` members are ignored and nothing is ever unpickled. Tar headers are parsed by
:func:`wsishard.shards.reader.tar_members` rather than ``tarfile``, which costs a worker much more.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Literal, NotRequired, TypedDict

from wsishard.errors import ShardError
from wsishard.format import (
    BAG_EXTS,
    COORDS_EXT,
    FEATURES_EXT,
    IMAGE_FORMATS,
    LABEL_EXT,
    META_EXT,
    SAMPLE_EXTS,
    context_ext,
    context_exts,
    is_sample_key,
    is_slide_id,
)
from wsishard.shards.reader import TarSamples
from wsishard.storage.secrets import redact
from wsishard.streaming.draws import shuffled

__all__ = ["ErrorMode", "Opener", "RawSample", "ShardRef", "read_shard", "shuffled"]

logger = logging.getLogger(__name__)

ErrorMode = Literal["raise", "skip"]
Opener = Callable[[str], IO[bytes]]


class RawSample(TypedDict):
    """A sample as read from the tar: still encoded bytes (cheap to hold in the shuffle buffer)."""

    key: str
    shard: str
    image_ext: str
    image: bytes
    meta: bytes
    label: bytes | None
    context: tuple[bytes, ...]  # the context members (ctx0, ctx1, ...) the stream reads; () without context
    coords: NotRequired[bytes]  # a bag (an embeddings output's slide sample): its coords.npy; its image: features.npy


@dataclass(frozen=True)
class ShardRef:
    """One shard to read: its location, the sample count its manifest promises, and which samples to keep.

    :func:`read_shard` keeps samples ``k`` (0-based, in shard order) with ``k % step == phase``: all of them by
    default.
    """

    url: str
    samples: int
    phase: int = 0
    step: int = 1

    @property
    def kept(self) -> int:
        """Samples this reader keeps of the shard."""
        return len(range(self.phase, self.samples, self.step))


def read_shard(
    task: ShardRef, opener: Opener, on_error: ErrorMode = "raise", context: int = 0, bags: bool = False
) -> Iterator[RawSample]:
    """The samples of one shard, in order; never one with a missing member or a key outside the key grammar.

    With ``context`` scales, each sample's context members ``ctx0.<ext>`` ... are read too (and must be there);
    without, they are read past uncopied. With ``bags`` (an embeddings output), each sample is a slide keyed by its
    slide id: its ``features.npy``, ``coords.npy``, ``.json`` and ``.cls`` are read (:func:`_raw_bag`), nothing else.

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
    exts = BAG_EXTS if bags else SAMPLE_EXTS | context_exts(context) if context else SAMPLE_EXTS
    keep = TarSamples(stream, exts, task.phase, task.step)
    try:
        for key, members in keep:
            if bags and is_slide_id(key):
                yield _raw_bag(name, key, members)
                continue
            if not bags and is_sample_key(key):
                yield _raw_sample(name, key, members, context)
                continue
            grammar = "<slide_id>.<ext>" if bags else "<slide>_x<X>_y<Y>.<ext>"
            bad = ShardError(name, f"sample {key[:120]!r} is not named {grammar} (a path, or not a wsishard sample)")
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


def _raw_bag(shard: str, key: str, members: dict[str, bytes]) -> RawSample:
    """A slide sample of an embeddings output: ``image`` holds its ``features.npy``, ``coords`` its ``coords.npy``
    (parsed by :mod:`wsishard.streaming.bags` with ``allow_pickle=False``)."""
    lacking = [ext for ext in (FEATURES_EXT, COORDS_EXT, META_EXT) if ext not in members]
    if lacking:
        raise ShardError(shard, f"sample {key} lacks .{lacking[0]} (truncated, or not an embeddings shard)")
    return RawSample(
        key=key,
        shard=shard,
        image_ext="npy",
        image=members[FEATURES_EXT],
        meta=members[META_EXT],
        label=members.get(LABEL_EXT),
        context=(),
        coords=members[COORDS_EXT],
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
