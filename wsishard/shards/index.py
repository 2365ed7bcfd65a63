"""The per-sample index: one small columnar file per shard, and a summary of them all beside the manifest.

Each shard ``shard-G-K.tar`` gets ``shard-G-K.idx.npz`` (:func:`index_name`), written as the shard is committed: a
numpy ``.npz`` of the columns below, row ``k`` for sample ``k``, plus the shard's own small summary. numpy rather
than Parquet: no extra dependency, ``allow_pickle=False`` never unpickles, and an index is small enough to be read
whole in one request from object storage. Columns (:data:`COLUMNS`): ``offset`` and ``size`` (bytes of the sample's
tar records), ``key``, ``slide`` (a row of this file's ``slide_names``, so merging parts never rewrites an index),
``label`` (int64, -1 unlabelled), level-0 ``x``/``y``, ``patch_mpp`` (index version 1's ``mpp``), the quality scores and
``pigment`` (NaN in an index written before it).

The summary of them all (``index.npz``) is :mod:`wsishard.shards.summary`'s.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

import numpy as np

from wsishard import format as fmt
from wsishard.errors import IndexFileError
from wsishard.format import LABEL_EXT, LABEL_RANGE, META_EXT, SHARD_SUFFIX, is_shard_name, split_member
from wsishard.shards.reader import tar_spans

COLUMNS: dict[str, str] = {
    "offset": "int64",
    "size": "int64",
    "slide": "int32",
    "label": "int64",
    "x": "int64",
    "y": "int64",
    "patch_mpp": "float32",
    "tissue": "float32",
    "background": "float32",
    "dark": "float32",
    "sharpness": "float32",
    "pigment": "float32",
}
_LATER = {"pigment"}  # columns an index written before them lacks: read as NaN (unknown)
INDEX_SUFFIX = ".idx.npz"  # a shard's per-sample index: ``shard-000012-0003.idx.npz`` beside its ``.tar``
# (index file names live here, not in format.py: that module is at the house limit of 400 lines)


def index_name(shard: str) -> str:
    """The per-sample index file of the shard named ``shard``: ``shard-000012-0003.idx.npz``."""
    return shard.removesuffix(SHARD_SUFFIX) + INDEX_SUFFIX


def index_shard(name: str) -> str | None:
    """The shard an index file name stands for (:func:`index_name`'s inverse), or None if it is no shard's index."""
    shard = name.removesuffix(INDEX_SUFFIX) + SHARD_SUFFIX
    return shard if name.endswith(INDEX_SUFFIX) and is_shard_name(shard) else None


_SCORES = ("patch_mpp", "tissue", "background", "dark", "sharpness", "pigment")
INDEX_VERSION, _FORMER = 2, {"patch_mpp": "mpp"}  # 2: patch_mpp; version 1 (its mpp) is read under the new name


def _number(value: Any, kind: Callable[[Any], Any], unknown: Any) -> Any:
    """``kind(value)`` (``int``, ``float``, ``json.loads``), or ``unknown`` where the value does not convert."""
    try:
        return kind(value)
    except (TypeError, ValueError, OverflowError, RecursionError):
        return unknown


@dataclass
class IndexWriter:
    """Collects a shard's index rows from the tar records the shard writer appends (parsed back: the records are
    the one truth), then gives the ``.npz`` bytes."""

    def __post_init__(self) -> None:
        self._rows: list[tuple[Any, ...]] = []
        self._keys: list[bytes] = []
        self._slides: dict[str, int] = {}

    def add(self, records: bytes, base: int) -> None:
        """Index the samples whose tar records are ``records`` (:func:`~wsishard.shards.writer.sample_records`, made
        in this process), written at byte ``base`` of the shard."""
        spans = _plain_spans(records)
        self._add_spans(spans if spans is not None else tar_spans(io.BytesIO(records), _wanted), base)

    def add_stream(self, stream: IO[bytes], base: int = 0) -> None:
        """Index the samples of a tar (or of consecutive tar records) read from ``stream`` (checked as the stream
        reads a shard)."""
        self._add_spans(tar_spans(stream, _wanted), base)

    def _add_spans(self, spans: Iterable[tuple[str, int, int, bytes | None]], base: int) -> None:
        key: str | None = None
        start = end = 0
        fields: dict[str, bytes] = {}
        for name, lo, hi, data in spans:
            parts = split_member(name)
            prefix = parts[0] if parts else name
            if prefix != key:
                if key is not None:
                    self._row(key, base + start, end - start, fields)
                key, start, fields = prefix, lo, {}
            end = hi
            if data is not None and parts is not None:
                fields[parts[1]] = data
        if key is not None:
            self._row(key, base + start, end - start, fields)

    def _row(self, key: str, offset: int, size: int, fields: dict[str, bytes]) -> None:
        """One sample's row; a member that does not parse (a hand-made or damaged shard) gives -1 or NaN, never an
        error: the stream and ``verify`` refuse such a sample when they read it."""
        meta = fmt.patch_meta(_number(fields.get(META_EXT, b"{}"), json.loads, {}))  # of any format version
        meta = meta if isinstance(meta, dict) else {}
        label = _number(fields[LABEL_EXT] if LABEL_EXT in fields else meta.get("label", -1), int, -1)
        label = label if label in LABEL_RANGE else -1
        slide = self._slides.setdefault(str(meta.get("slide_id", "")), len(self._slides))
        scores = tuple(_number(meta.get(name, np.nan), float, np.nan) for name in _SCORES)
        x, y = (v if v in LABEL_RANGE else -1 for v in (_number(meta.get(c, -1), int, -1) for c in ("x", "y")))
        self._rows.append((offset, size, slide, label, x, y, *scores))
        self._keys.append(key.encode())

    @property
    def samples(self) -> int:
        return len(self._rows)

    def to_bytes(self) -> bytes:
        """The index as ``.npz`` bytes (compressed)."""
        return index_bytes(self.arrays())

    def arrays(self) -> dict[str, np.ndarray]:
        """The index's arrays by name, as :func:`index_bytes` writes them and :func:`index_digest` hashes them."""
        rows = self._rows
        columns = {name: np.array([r[i] for r in rows], dtype=dtype) for i, (name, dtype) in enumerate(COLUMNS.items())}
        keys = np.array(self._keys, dtype=f"S{max((len(k) for k in self._keys), default=1)}")
        names = list(self._slides)
        slide_names = np.array([n.encode() for n in names], dtype=f"S{max((len(n) for n in names), default=1)}")
        labels, label_counts = np.unique(columns["label"], return_counts=True)
        return {
            "version": np.asarray(INDEX_VERSION, dtype=np.int64),
            "key": keys,
            "slide_names": slide_names,
            "slide_counts": np.bincount(columns["slide"], minlength=len(names)).astype(np.int64),
            "labels": labels.astype(np.int64),
            "label_counts": label_counts.astype(np.int64),
            **columns,
        }


def index_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``arrays`` as a compressed ``.npz`` file's bytes."""
    out = io.BytesIO()
    np.savez_compressed(out, **arrays)  # type: ignore[arg-type]
    return out.getvalue()


def index_digest(arrays: Mapping[str, np.ndarray]) -> str:
    """The sha256 (hex) of an index's or summary's content: every array by name (sorted), with its dtype and shape.
    The same arrays give the same digest however the ``.npz`` was zipped (a rebuilt index matches its record); the
    manifest records it per shard (``index_sha256``) and for the summary, binding each index to its shard."""
    digest = hashlib.sha256()
    for name in sorted(arrays):
        arr = np.asarray(arrays[name])
        digest.update(f"{name}\0{arr.dtype.str}\0{arr.shape}\0".encode())
        digest.update(arr.tobytes())
    return digest.hexdigest()


def _plain_spans(records: bytes) -> list[tuple[str, int, int, bytes | None]] | None:
    """The members of tar records as :func:`~wsishard.shards.writer.sample_records` writes them (plain USTAR regular
    files, names of under 100 bytes), read without checksums (this is the build's own output, just made); None for
    anything else, which the checked reader then reads."""
    out: list[tuple[str, int, int, bytes | None]] = []
    pos, n = 0, len(records)
    while pos + 512 <= n:
        header = records[pos : pos + 512]
        if header[156:157] not in (b"0", b"\0") or header[257:263] != b"ustar\0" or header[345] != 0:
            return None
        name = header[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
        size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
        end = pos + 512 + size + (-size % 512)
        out.append((name, pos, end, records[pos + 512 : pos + 512 + size] if _wanted(name) else None))
        pos = end
    return out if pos == n else None


def _wanted(name: str) -> bool:
    parts = split_member(name)
    return parts is not None and parts[1] in (META_EXT, LABEL_EXT)


def index_shard_file(stream: IO[bytes]) -> bytes:
    """The index of a whole shard read from ``stream`` (an existing build's shard, indexed after the fact)."""
    writer = IndexWriter()
    writer.add_stream(stream)
    return writer.to_bytes()


@dataclass(frozen=True)
class ShardIndex:
    """One shard's index: its columns (each ``(n,)``), its keys and its slide names (``slide`` indexes them)."""

    columns: dict[str, np.ndarray]
    key: np.ndarray  # (n,) bytes
    slide_names: np.ndarray  # (slides,) bytes
    digest: str = ""  # :func:`index_digest` of the file's arrays, as read

    def __len__(self) -> int:
        return len(self.key)

    def table(self, shard: str) -> Table:
        """The columns as ``select=`` and weight functions see them (:class:`Table`)."""
        return Table(self, shard)


class Table(Mapping[str, np.ndarray]):
    """A shard index's columns by name, each (n,): every column of :data:`COLUMNS`, ``key`` and ``slide_id`` (str),
    ``position`` (row number), ``shard`` (the shard's name) and ``mpp`` (float64: ``patch_mpp`` to the 6 decimals a
    sample's ``.json`` gives it, so that ``t["mpp"] == 0.5`` picks a multi-mpp build's 0.5 mpp samples). Columns other
    than the stored ones are made when first read: a ``select=`` reading ``tissue`` alone costs no string conversion."""

    _MADE = ("key", "slide_id", "position", "shard", "mpp")

    def __init__(self, index: ShardIndex, shard: str) -> None:
        self._index, self._shard = index, shard
        self._made: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self._index.columns:
            return self._index.columns[name]
        if name not in self._MADE:
            raise KeyError(name)
        if name not in self._made:
            index, n = self._index, len(self._index)
            self._made[name] = (
                index.key.astype(str)
                if name == "key"
                else index.slide_names.astype(str)[index.columns["slide"]]
                if name == "slide_id"
                else np.arange(n, dtype=np.int64)
                if name == "position"
                else np.round(index.columns["patch_mpp"].astype(np.float64), 6)
                if name == "mpp"
                else np.full(n, self._shard)
            )
        return self._made[name]

    def __iter__(self) -> Iterator[str]:
        return iter((*self._index.columns, *self._MADE))

    def __len__(self) -> int:
        return len(self._index.columns) + len(self._MADE)


def load_index(data: bytes, location: str = "<index>") -> ShardIndex:
    """Parse a shard index (never unpickling anything).

    Raises:
        IndexFileError: not an index (or another version), a column missing or of another length or kind.
    """
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise IndexFileError(location, f"not a shard index ({type(exc).__name__}: {exc})") from exc
    if (version := arrays.get("version")) is None or int(version) not in (1, INDEX_VERSION):
        raise IndexFileError(location, f"index version {version!r}, this wsishard reads {[1, INDEX_VERSION]}")
    key = arrays.get("key")
    if key is None or key.ndim != 1 or key.dtype.kind != "S":
        raise IndexFileError(location, "index has no key column")
    columns = {}
    for name, dtype in COLUMNS.items():
        col = arrays.get(name, arrays.get(_FORMER.get(name, "")))
        if col is None and name in _LATER:
            col = np.full(key.shape, np.nan, np.float32)
        want = np.dtype(dtype)  # or a narrower one of its kind (0.2.0's first builds wrote int32 labels): widened
        if col is None or col.shape != key.shape or col.dtype.kind != want.kind or not np.can_cast(col.dtype, want):
            raise IndexFileError(location, f"index column {name!r} is missing, or not {len(key)} {dtype} values")
        columns[name] = col.astype(want, copy=False)
    names = arrays.get("slide_names", np.zeros(0, "S1"))
    if len(key) and (columns["slide"].min() < 0 or columns["slide"].max() >= len(names)):
        raise IndexFileError(location, "index slide column points outside its slide names")
    _check_own_counts(arrays, columns, len(names), location)
    return ShardIndex(columns, key, names, index_digest(arrays))


def _check_own_counts(
    arrays: Mapping[str, np.ndarray], columns: Mapping[str, np.ndarray], slides: int, where: str
) -> None:
    """Raises IndexFileError where the index's own counts (``labels``/``label_counts``, ``slide_counts``: what the
    summary is made of) differ from its columns: one edited without the other."""
    if "labels" in arrays and "label_counts" in arrays:
        labels, counts = np.unique(columns["label"], return_counts=True)
        if not (np.array_equal(labels, arrays["labels"]) and np.array_equal(counts, arrays["label_counts"])):
            raise IndexFileError(where, "its label counts differ from its label column (edited?)")
    own = arrays.get("slide_counts")
    if own is not None and not np.array_equal(np.bincount(columns["slide"], minlength=slides), own):
        raise IndexFileError(where, "its slide counts differ from its slide column (edited?)")
