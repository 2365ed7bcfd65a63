"""The wsishard error hierarchy.

Every error wsishard raises on purpose is a :class:`WsiShardError`. Where a caller would naturally catch a
builtin (``ValueError`` for bad options, ``OSError`` for unreadable files), the subclass also derives from
that builtin, as fsspec's exceptions do. Errors carry structured fields so a caller never parses messages.
"""

from __future__ import annotations

import errno
import logging
import math
import os
import re
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

_ADDRESS = re.compile(r" (?:object )?at 0x[0-9a-fA-F]+")


class WsiShardError(Exception):
    """Base class of every error wsishard raises on purpose."""


class OptionError(WsiShardError, ValueError):
    """A bad option value (the message names the option and the value)."""


def check_option(ok: bool, name: str, value: object, rule: str) -> None:
    """Raise :class:`OptionError` ``invalid NAME: VALUE (need RULE)`` unless ``ok``: the options' validation."""
    if not ok:
        raise OptionError(f"invalid {name}: {value!r} (need {rule})")


class _Located(WsiShardError):
    """An error about one named thing: where it is and a one-line reason a person can act on.

    Pickles with both fields (worker processes hand errors back to the main process).
    """

    _label = ""

    def __init__(self, where: str, reason: str) -> None:
        super().__init__(f"{self._label}{where}: {reason}")
        self.where = where
        self.reason = reason

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return type(self), (self.where, self.reason)


class SlideError(_Located, OSError):
    """A slide could not be used.

    Attributes:
        path: the slide's file name or URL.
        reason: one line a person can act on (no traceback).
    """

    @property
    def path(self) -> str:
        return self.where


def failure_reason(exc: BaseException) -> str:
    """The one-line reason recorded for a slide that failed with ``exc`` (a :class:`SlideError`'s own reason)."""
    text = exc.reason if isinstance(exc, SlideError) else f"{type(exc).__name__}: {exc}"[:300]
    return _ADDRESS.sub("", text)  # no object addresses: the same failure reads the same in every run


class SlideFailure:
    """The build's one catch-all boundary: a slide's failure is recorded with its reason, the build goes on.

    ``with SlideFailure(path) as failure: ...`` swallows any ``Exception`` raised in the block and keeps its
    one-line reason in ``failure.reason`` (None when the block succeeded). ``KeyboardInterrupt`` and other
    ``BaseException`` s pass through.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.reason: str | None = None

    def __enter__(self) -> SlideFailure:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool:
        if exc is None or not isinstance(exc, Exception) or isinstance(exc, ResourceError | OutputError):
            return False
        shortage = machine_shortage(exc)
        if shortage is not None:
            reason = f"{shortage} ({_one_line(exc)}); not the slide's failure: run the build again to go on"
            raise ResourceError(self.path, reason) from exc
        if not isinstance(exc, SlideError):
            logger.debug("slide %s failed", self.path, exc_info=(exc_type, exc, tb))  # type: ignore[arg-type]
        self.reason = failure_reason(exc)
        return True


_SHORTAGES = {
    errno.EMFILE: "too many open files in this process",
    errno.ENFILE: "too many open files on this machine",
    errno.ENOMEM: "out of memory",
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "over the disk quota",
}


def machine_shortage(exc: BaseException) -> str | None:
    """What the machine ran out of, when ``exc`` says it did (file descriptors, memory, disk space), else None.

    A ``MemoryError`` for one array larger than this machine's memory is no shortage: the slide asked for it (its
    tags claim an impossible size), and would fail the same way on any run.
    """
    if isinstance(exc, OSError) and exc.errno in _SHORTAGES:
        code: int | None = exc.errno
    elif isinstance(exc, MemoryError):
        asked = _array_bytes(exc)
        code = None if asked is not None and asked > _physical_bytes() else errno.ENOMEM
    else:  # OpenSlide's errors carry the system's message only
        code = next((e for e in (errno.EMFILE, errno.ENFILE) if os.strerror(e) in str(exc)), None)
    if code == errno.EMFILE:
        return f"{_SHORTAGES[code]} (the limit is {_open_files_limit()}: raise it with ulimit -n)"
    return None if code is None else _SHORTAGES[code]


def _open_files_limit() -> str:
    try:
        import resource  # Unix only

        return str(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (ImportError, OSError, ValueError):
        return "unknown"


def _array_bytes(exc: MemoryError) -> int | None:
    """The bytes numpy was asked for, where its ``MemoryError`` says (its ``shape`` and ``dtype``)."""
    shape: Any = getattr(exc, "shape", None)
    dtype: Any = getattr(exc, "dtype", None)
    try:
        return math.prod(int(n) for n in shape) * int(dtype.itemsize)
    except (TypeError, ValueError, AttributeError):
        return None


def _physical_bytes() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such names here
        return 2**62


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return _ADDRESS.sub("", text[0][:200])


class ResourceError(_Located, OSError):
    """The machine ran out of something every slide needs (file descriptors, memory, disk space) while working on
    ``where``: the build stops. It is not recorded as that slide's failure: a re-run, once there is more of it,
    goes on where this one stopped and builds the slide.

    Attributes:
        location: the slide (path or URL) being worked on.
        reason: what ran out, and the system's one-line message.
    """

    _label = "the machine ran out of resources working on "

    @property
    def location(self) -> str:
        return self.where


class MissingMppError(SlideError):
    """A slide reports no microns-per-pixel and no override covers it."""


class ShardError(_Located, OSError):
    """A shard is missing, truncated, corrupt or holds fewer samples than the manifest says.

    Attributes:
        shard: the shard's name or URL.
        reason: what is wrong with it.
    """

    _label = "shard "

    @property
    def shard(self) -> str:
        return self.where


class IndexFileError(ShardError, ValueError):
    """A shard's per-sample index (``.idx.npz``) or the index summary (``index.npz``) is unreadable, or does not
    match its shard or the manifest (another shard's or build's index, or edited): a :class:`ShardError` that names
    the index file, and a ``ValueError`` as a bad file's content.

    Attributes:
        shard: the index file's name or URL.
        reason: what is wrong with it.
    """

    _label = "index "


class ManifestError(_Located, ValueError):
    """A manifest is missing, unreadable, of another format version, or inconsistent.

    Attributes:
        location: the manifest's path or URL.
        reason: what is wrong with it.
    """

    _label = "manifest "

    @property
    def location(self) -> str:
        return self.where


class OutputError(_Located, OSError):
    """The build cannot write into its output: a permission, a full disk, a read-only store.

    Every slide would fail the same way, so the build stops with this error instead of recording it as the slides'
    failure (a failure recorded for a slide is kept by a resumed build; this one must not be).

    Attributes:
        location: the file that could not be written (path or URL).
        reason: the system's one-line reason.
    """

    _label = "cannot write "

    @property
    def location(self) -> str:
        return self.where


class TopologyError(WsiShardError, ValueError):
    """Too few shards for the ranks x workers reading them (the message says how many are needed)."""


class ModelError(WsiShardError, ValueError):
    """The model given to ``wsishard embed`` does not import, is not a ``torch.nn.Module``, or maps a batch to
    another shape than ``(batch, D)`` (the message names the model string and what is wrong)."""
