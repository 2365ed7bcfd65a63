"""The shard and manifest format: one description shared by the writer and the reader.

A build output is a folder (or object-store prefix) holding WebDataset tar shards ``shard-<group>-<k>.tar`` (the
k-th shard of a slide group: each part of a cluster build names its shards alone), the slide records
``slides.jsonl`` (a JSON object per line) and ``manifest.json``, written last: the options, the totals and the shard
index (name, samples, bytes, sha256), all a reader needs at start-up. Version 1 and 2 outputs are read as before:
version 3 renamed the microns per pixel so that each name says whose it is (``slide_mpp``: the slide's level 0,
``patch_mpp``: the written patches', ``target_mpp``: the one asked for), where versions 1 and 2 wrote ``mpp`` for the
first in the slide records and for the second in each sample's ``.json`` (:func:`patch_meta` reads both).

Each sample is one tissue patch with the members::

    <key>.jpg | <key>.png | <key>.webp   the encoded RGB patch, ``patch_size`` x ``patch_size`` px
    <key>.json                           :class:`PatchMeta` as UTF-8 JSON
    <key>.cls                            the slide's integer label as ASCII digits (only when labelled)
    <key>.ctx0.jpg, <key>.ctx1.jpg, ...  context patches, one per ``--context-mpp`` scale in ascending mpp (only
                                         with context; same format as the patch: :func:`context_ext`)

The key grammar is ``<slide_id>_x<l0_x>_y<l0_y>``: ``slide_id`` is sanitized to ``[A-Za-z0-9_-]`` so a key
never holds a dot (webdataset splits member names at the first dot) or a path separator, and the
coordinates are the patch's top-left corner in level-0 pixels. A multi-mpp build (``--mpp 0.5 1.0 2.0``) puts the
sample's target mpp between them, its dot written ``p``: ``<slide_id>_mpp0p5_x<l0_x>_y<l0_y>`` (:func:`mpp_tag`),
so that keys of the same corner at two scales differ; a build of one mpp keeps the plain grammar.

What a manifest or a shard says is data, never trusted as a path or a size: shard names must be :func:`shard_name` s,
keys must follow the key grammar, and an image's size is read from its header and held to the manifest's patch size
(:func:`wsishard.manifest.expected_patch_size`) before it is decoded.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any, Literal, TypedDict

from wsishard.imageheader import image_header as image_header

FORMAT_NAME = "wsishard"
FORMAT_VERSION = 3  # 3: ``slide_mpp`` in the slide records, ``patch_mpp`` in each sample's .json (2: both ``mpp``)
# What a build makes of the same slides and options: bumped when the plan (which blocks go where, in what order)
# or the patches' pixels change, so that an output begun by another revision is never resumed into a mix of both.
# 2: patches start on the reduced pixel nearest their grid position; blocks in strips of two rows, kept in order.
BUILD_REVISION = 2
READABLE_VERSIONS = (1, 2, 3)
NAMED_MPP_VERSION = 3  # the first version naming each mpp by whose it is: slide_mpp, patch_mpp (before: mpp, mpp)
MANIFEST_NAME = "manifest.json"
SLIDES_NAME = "slides.jsonl"
QC_INDEX_NAME = "qc/index.html"  # the QC review page (beside the qc/<slide_id>.png pictures)
STATE_DIR = ".wsishard"  # a build's resume state and lock (wsishard.builder.run.state, wsishard.builder.run.lock)
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".tar"
IMAGE_FORMATS: tuple[str, ...] = ("jpg", "png", "webp")
MAX_PATCH_PX = 8192  # the widest patch a build writes (PatchOptions' bound): a reader refuses a manifest saying more
META_EXT = "json"
LABEL_EXT = "cls"
LABEL_RANGE = range(-(2**63), 2**63)  # a sample's label as the stream hands it over: int64 (-1: unlabelled)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_SHARD_NAME = re.compile(re.escape(SHARD_PREFIX) + r"(\d{6,})(?:-(\d{4,}))?" + re.escape(SHARD_SUFFIX))
_GROUP_SHIFT = 20  # a shard index packs (group, k): group << 20 | k, k < 2**20 shards per group
_TEMP_INFIX = ".tmp-"
_TEMP_NAME = re.compile(r"\.(.+)" + re.escape(_TEMP_INFIX) + r"\d+")
_PART_MANIFEST = re.compile(r"manifest\.part-(\d{4,})-of-(\d{4,})\.json")
_PART_SLIDES = re.compile(r"slides\.part-(\d{4,})-of-(\d{4,})\.jsonl")
_MAX_ID_CHARS = 96
_CONTEXT_EXT = re.compile(r"ctx(0|[1-9][0-9]?)\.(jpg|png|webp)")  # context_ext(i, image_format)
_MPP_TAG = re.compile(r"_mpp[0-9]+(?:p[0-9]+)?$")  # mpp_tag's, at the end of a key's slide part
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*_x[0-9]+_y[0-9]+")  # sample_key(sanitize_slide_id(...), x, y)

ImageFormat = Literal["jpg", "png", "webp"]
SlideStatus = Literal["ok", "failed", "skipped"]  # skipped: left out by an option (--roi-missing skip)


class ContextMeta(TypedDict):
    """One context patch of a sample, in its ``.json``'s ``context`` list (ascending mpp, as ``ctx0``, ``ctx1``)."""

    mpp: float  # microns per pixel of the context patch
    x: int  # level-0 left of the field it covers (negative where it runs off the slide)
    y: int  # level-0 top
    size: int  # px, width = height of the written image
    padded: float  # fraction of the field that lay off the slide, written as white glass, 0..1


class PatchMeta(TypedDict, total=False):
    """The ``.json`` member of a sample. Coordinates and extents are level-0 pixels."""

    slide_id: str
    file: str  # the source slide's file name (no folders)
    x: int  # level-0 left
    y: int  # level-0 top
    extent: int  # level-0 width (= height) the patch covers
    patch_mpp: float  # microns per pixel of the patch as written (``mpp`` in versions 1 and 2: :func:`patch_meta`)
    level: int  # pyramid level the pixels were read from
    patch_size: int  # px, width = height of the written image
    tissue: float  # fraction of the patch inside the tissue mask, 0..1
    background: float  # fraction of the patch that looks like glass, 0..1 (builder/extract/quality.py)
    dark: float  # fraction of the patch that is very dark, 0..1
    pigment: float  # fraction of the patch that tissue detection found to be dark pigment (kept as tissue), 0..1
    sharpness: float  # variance of the Laplacian of the grey patch (reduced to 64 px): low is blurred
    label: int  # only when the build had labels
    label_name: str  # the label's class name, when labels came from annotation classes (--roi-labels)
    context: list[ContextMeta]  # only when the build has context patches (--context-mpp)


def patch_meta(meta: Any) -> PatchMeta:
    """A sample's parsed ``.json`` under this version's names: a version 1 or 2 sample's ``mpp`` (the patch's) is
    given as ``patch_mpp`` too (its ``mpp`` kept, as the sample holds it). A version 3 sample holds no ``mpp``."""
    if isinstance(meta, dict) and "mpp" in meta and "patch_mpp" not in meta:
        meta["patch_mpp"] = meta["mpp"]
    return meta


def patch_mpp_name(version: int) -> str:
    """The name of the patch's mpp in a sample's ``.json`` of format ``version``: ``patch_mpp`` (``mpp`` before 3)."""
    return "patch_mpp" if version >= NAMED_MPP_VERSION else "mpp"


def sanitize_slide_id(name: str) -> str:
    """Turn a file stem into a slide id safe for tar member names and webdataset keys.

    Anything outside ``[A-Za-z0-9_-]`` (dots, slashes, spaces, unicode) becomes ``_``; the result is
    never empty and never starts with ``-`` or ``_``.
    """
    cleaned = _UNSAFE.sub("_", name).strip("_-")[:_MAX_ID_CHARS]
    return cleaned or "slide"


def unique_slide_ids(paths: list[str], names: Mapping[str, str] | None = None) -> list[str]:
    """Sanitized, unique slide ids for ``paths``: their file stems, or their ``names`` where given (a DICOM series'
    name, keyed by path); a short hash of the path breaks ties."""
    stems = [sanitize_slide_id((names or {}).get(p) or _stem(p)) for p in paths]
    counts: dict[str, int] = {}
    for stem in stems:
        counts[stem] = counts.get(stem, 0) + 1
    out = []
    for path, stem in zip(paths, stems, strict=True):
        if counts[stem] > 1:
            stem = f"{stem}-{hashlib.sha1(path.encode()).hexdigest()[:8]}"
        out.append(stem)
    return out


def _stem(path: str) -> str:
    base = path.rstrip("/").replace("\\", "/").rsplit("/", 1)[-1]
    head, dot, _ext = base.rpartition(".")
    return head if dot and head else base


def sample_key(slide_id: str, l0_x: int, l0_y: int, mpp: float | None = None) -> str:
    """The webdataset key of the patch at level-0 ``(l0_x, l0_y)`` of ``slide_id`` (already sanitized); with ``mpp``
    (a multi-mpp build: the sample's target mpp), that scale's key (:func:`mpp_tag`)."""
    scale = "" if mpp is None else f"_{mpp_tag(mpp)}"
    return f"{slide_id}{scale}_x{l0_x}_y{l0_y}"


def mpp_tag(mpp: float) -> str:
    """A multi-mpp build's scale in its keys: ``mpp0p5`` for 0.5, ``mpp2`` for 2.0 (6 decimals at most)."""
    return "mpp" + f"{mpp:.6f}".rstrip("0").rstrip(".").replace(".", "p")


def key_slide(key: str, multi_mpp: bool = False) -> str:
    """The slide id a :func:`sample_key` names; ``multi_mpp``: a multi-mpp build's key, its scale tag left out."""
    slide = key.rsplit("_x", 1)[0]  # coordinates are digits: the last "_x" is theirs
    return _MPP_TAG.sub("", slide) if multi_mpp else slide


def is_sample_key(key: str) -> bool:
    """True for a key :func:`sample_key` makes from a sanitized slide id: never a path (no ``/``, no ``..``)."""
    return _KEY.fullmatch(key) is not None


SAMPLE_EXTS: frozenset[str] = frozenset((*IMAGE_FORMATS, META_EXT, LABEL_EXT))  # the members a reader uses
# an embeddings output's slide sample (wsishard embed), keyed by its slide id: the members a bag reader uses
FEATURES_EXT, COORDS_EXT, KEYS_EXT = "features.npy", "coords.npy", "keys.json"
BAG_EXTS: frozenset[str] = frozenset((FEATURES_EXT, COORDS_EXT, META_EXT, LABEL_EXT))
EMBEDDINGS_KIND = "embeddings"  # an embeddings output's manifest says so in extra["kind"]


def is_embeddings_extra(extra: object) -> bool:
    """Whether a manifest's ``extra`` marks an embeddings output (``wsishard embed``), not a build of pixel patches."""
    return isinstance(extra, dict) and extra.get("kind") == EMBEDDINGS_KIND


def is_slide_id(key: str) -> bool:
    """True for a key that is a slide id as :func:`sanitize_slide_id` makes them (an embeddings sample's key)."""
    return bool(key) and sanitize_slide_id(key) == key


def context_exts(scales: int) -> frozenset[str]:
    """Every extension the context members of ``scales`` scales may have (any image format)."""
    return frozenset(context_ext(k, fmt) for k in range(scales) for fmt in IMAGE_FORMATS)


def is_context_member(name: str) -> bool:
    """True for a context member ``<key>.ctx<k>.<jpg|png|webp>`` (:func:`context_ext`): never anything a decoder
    would unpickle. :func:`is_sample_member` accepts these too."""
    parts = split_member(name)
    return parts is not None and context_scale(parts[1]) is not None


def split_member(name: str) -> tuple[str, str] | None:
    """``(key, ext)`` of a tar member name: the name up to the first dot of its last path part, and the rest
    (webdataset's ``base_plus_ext``); None without such a dot."""
    slash = name.rfind("/") + 1
    dot = name.find(".", slash)
    return None if dot <= slash else (name[:dot], name[dot + 1 :])


def is_sample_member(name: str) -> bool:
    """True for a tar member a reader uses: ``<key>.<ext>`` with ``ext`` in :data:`SAMPLE_EXTS`, or a context
    patch's (:func:`context_ext`)."""
    parts = split_member(name)
    return parts is not None and (parts[1] in SAMPLE_EXTS or context_scale(parts[1]) is not None)


def context_ext(scale: int, image_format: str) -> str:
    """The member extension of a sample's context patch at its ``scale``-th context mpp (0: the finest):
    ``ctx0.jpg``. webdataset's decoders go by the last extension, so they decode it as the image format."""
    return f"ctx{scale}.{image_format}"


def context_scale(ext: str) -> int | None:
    """The scale index of a context member's extension (:func:`context_ext`'s inverse), or None."""
    match = _CONTEXT_EXT.fullmatch(ext)
    return int(match.group(1)) if match else None


def member_order(ext: str) -> tuple[str, int]:
    """The sort key of a sample's members in its tar records: by extension, each context patch right after the image
    of its format, in scale order (``cls, jpg, ctx0.jpg, ctx1.jpg, json``); without context, plain sorted order."""
    match = _CONTEXT_EXT.fullmatch(ext)
    return (match.group(2), 1 + int(match.group(1))) if match else (ext, 0)


def shard_index(group: int, k: int) -> int:
    """The index of the ``k``-th shard of slide group ``group`` (both 0-based): unique in a build, ordered by
    ``(group, k)``, computed by whichever part builds the group without knowing how many shards other groups have."""
    if not 0 <= k < 1 << _GROUP_SHIFT or group < 0:
        raise ValueError(f"shard {k} of group {group}: need group >= 0 and 0 <= k < {1 << _GROUP_SHIFT}")
    return group << _GROUP_SHIFT | k


def shard_name(index: int) -> str:
    """File name of the shard with index ``index`` (:func:`shard_index`): ``shard-000012-0003.tar`` for the shard 3
    of group 12 (wider numbers past 999,999 groups or 9,999 shards of a group, never cut)."""
    return f"{SHARD_PREFIX}{index >> _GROUP_SHIFT:06d}-{index & ((1 << _GROUP_SHIFT) - 1):04d}{SHARD_SUFFIX}"


def is_shard_name(name: str) -> bool:
    """True for a name :func:`shard_name` makes, or a version-1 one (``shard-`` + at least 6 digits + ``.tar``)."""
    return _SHARD_NAME.fullmatch(name) is not None


def shard_order(name: str) -> tuple[int, int]:
    """The sort key of a shard name: ``(group, k)`` (a version-1 name ``shard-000042.tar``: ``(42, -1)``); names
    sort as text only while their numbers keep the same width."""
    match = _SHARD_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"not a shard name: {name!r}")
    return int(match.group(1)), int(match.group(2)) if match.group(2) is not None else -1


def qc_picture_name(slide_id: str) -> str:
    """A slide's QC picture in the output, ``qc/<slide_id>.png`` (beside :data:`QC_INDEX_NAME`)."""
    return f"qc/{slide_id}.png"


def temp_name(name: str, pid: int) -> str:
    """The temporary name a file is written under before it is renamed to ``name`` (a base name)."""
    return f".{name}{_TEMP_INFIX}{pid}"


def temp_target(name: str) -> str | None:
    """The final name a temporary file stands for (:func:`temp_name`'s inverse), or None if it is not one."""
    match = _TEMP_NAME.fullmatch(name)
    return match.group(1) if match else None


def part_label(part: tuple[int, int]) -> str:
    """``part-0002-of-0008`` for part 2 of 8 (1-based), as it appears in part file names."""
    return f"part-{part[0]:04d}-of-{part[1]:04d}"


def manifest_name(part: tuple[int, int] | None = None) -> str:
    """``manifest.json``, or ``manifest.part-0002-of-0008.json`` for part 2 of 8 of a cluster build."""
    return MANIFEST_NAME if part is None else f"manifest.{part_label(part)}.json"


def parse_part_manifest(name: str) -> tuple[int, int] | None:
    """``(i, n)`` of a part manifest's file name (:func:`manifest_name`'s inverse), or None."""
    match = _PART_MANIFEST.fullmatch(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def slides_name(part: tuple[int, int] | None = None) -> str:
    """``slides.jsonl`` (the slide records beside ``manifest.json``), or ``slides.part-0002-of-0008.jsonl``."""
    return SLIDES_NAME if part is None else f"slides.{part_label(part)}.jsonl"


def is_slides_name(name: str) -> bool:
    """True for a name :func:`slides_name` makes."""
    return name == SLIDES_NAME or _PART_SLIDES.fullmatch(name) is not None
