"""The manifest: a build output's table of contents (:class:`Manifest`, written last), its shard and slide records,
and the files they are written to (``manifest.json`` and ``slides.jsonl``, or a part's). The names of those files and
every other format rule are :mod:`wsishard.format`'s."""

from __future__ import annotations

import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from wsishard.errors import ManifestError
from wsishard.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
    IMAGE_FORMATS,
    LABEL_RANGE,
    MAX_PATCH_PX,
    NAMED_MPP_VERSION,
    READABLE_VERSIONS,
    SLIDES_NAME,
    SlideStatus,
    is_shard_name,
    is_slides_name,
    manifest_name,
    shard_name,
    slides_name,
)
from wsishard.storage.secrets import redact

_SHA256 = re.compile(r"[0-9a-f]{64}")

__all__ = [
    "Manifest",
    "ShardRecord",
    "SlideRecord",
    "build_mpps",
    "check_shard_records",
    "expected_patch_size",
    "manifest_files",
    "parse_json",
    "parse_slide_lines",
    "slide_lines",
]


@dataclass(frozen=True, kw_only=True)
class ShardRecord:
    """One shard as listed in the manifest."""

    name: str  # file name relative to the output root
    samples: int
    bytes: int
    sha256: str
    slides: int = 0  # distinct slides in the shard
    index_sha256: str = ""  # content digest of its .idx.npz (shards/index.py index_digest); "": not recorded


@dataclass(frozen=True, kw_only=True)
class SlideRecord:
    """One input slide's outcome. Dimensions are level-0 pixels. Version 1 and 2 records name ``slide_mpp`` ``mpp``:
    they are read under the new name (:func:`parse_slide_lines`, :meth:`Manifest.from_dict`)."""

    slide_id: str
    file: str
    status: SlideStatus
    reason: str = ""
    width: int = 0
    height: int = 0
    slide_mpp: float | None = None  # level 0's microns per pixel
    mpp_source: str = ""  # where slide_mpp came from: "openslide" | "csv" | "default" | ""
    patch_mpp: float | None = None  # the written patches' actual mpp (the target, unless --mpp-tolerance snapped)
    level: int | None = None
    downsample: float | None = None
    tissue_fraction: float = 0.0
    tissue_mm2: float = 0.0  # tissue area found (after ink and artefacts were removed)
    ink_mm2: float = 0.0  # area removed as marker ink
    artefact_mm2: float = 0.0  # area removed as dark artefacts (scanner edges, dots, bubble rims), ink aside
    pigment_mm2: float = 0.0  # dark area kept as tissue for looking like pigment (melanin, carbon, dense tissue)
    candidates: int = 0
    patches: int = 0
    filtered: dict[str, int] = field(default_factory=dict)  # patches with enough tissue left out, per reason
    roi: str = ""  # with --roi: "annotated: <file>", "missing: skipped" or "missing: built whole"
    label: int | None = None
    bytes_read: int = 0  # bytes of the slide file downloaded (scan and extraction); 0: a local file
    read: str = ""  # a URL slide: "in place" (ranged reads) or "copied" (downloaded whole, to scan or after); "": local
    stain: dict[str, Any] = field(default_factory=dict)  # H&E stain: builder/scan/stain.py StainFit.to_record; {}: none


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """The build output's table of contents, written last by the build.

    ``slides_file`` names the file beside the manifest that holds the slide records, one JSON object per line
    (:func:`slide_lines`); the manifest itself then holds the options, the totals and the shard index only, so a
    reader at start-up never parses the slide records (:func:`wsishard.storage.opener.load_manifest` reads them
    only when asked). Empty: the records are inline, under ``slides`` (version 1, and small hand-made outputs).
    """

    options: dict[str, Any]
    shards: list[ShardRecord]
    slides: list[SlideRecord]
    image_format: str = "jpg"
    created: str = ""
    wsishard_version: str = ""
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    slides_file: str = ""
    index_sha256: str = ""  # content digest of the index summary (index.npz) written with it; "": not recorded

    @property
    def total_samples(self) -> int:
        return sum(s.samples for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def failed_slides(self) -> list[SlideRecord]:  # not those an option skipped (status "skipped")
        return [s for s in self.slides if s.status == "failed"]

    def to_dict(self) -> dict[str, Any]:
        """The manifest as plain data: the slide records inline unless ``slides_file`` holds them."""
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("shards", "slides")}
        d["options"], d["extra"] = json.loads(json.dumps(self.options)), dict(self.extra)
        d["totals"] = {
            "shards": len(self.shards),
            "samples": self.total_samples,
            "bytes": self.total_bytes,
            "slides": len(self.slides),
            "slides_ok": sum(s.status == "ok" for s in self.slides),
            "slides_failed": len(self.failed_slides),
            "slides_skipped": sum(s.status == "skipped" for s in self.slides),
        }
        if not self.slides_file:
            d["slides"] = [_record_data(s, self.version) for s in self.slides]
        d["shards"] = [dict(vars(s)) for s in self.shards]
        return d

    def to_json(self) -> str:
        """The manifest's JSON text, one shard record per line (the C encoder: fast at 100k shards)."""
        d = self.to_dict()
        shards = d.pop("shards")
        head = json.dumps(d, indent=1)[:-2]  # without its closing "\n}"
        rows = ",\n".join("  " + json.dumps(s, separators=(", ", ": ")) for s in shards)
        return head + ',\n "shards": [\n' + rows + ("\n ]\n}\n" if rows else "]\n}\n")

    @classmethod
    def from_dict(cls, data: dict[str, Any], location: str = "<manifest>") -> Manifest:
        if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
            raise ManifestError(location, "not a wsishard manifest")
        if data.get("version") not in READABLE_VERSIONS or isinstance(data.get("version"), bool):  # True == 1
            raise ManifestError(
                location, f"format version {data.get('version')!r}, this wsishard reads {list(READABLE_VERSIONS)}"
            )
        try:
            names = {f.name for f in fields(ShardRecord)}
            shards = [ShardRecord(**{k: v for k, v in s.items() if k in names}) for s in data["shards"]]
            slides = [_slide_record(s, f"slide entry {i}") for i, s in enumerate(data.get("slides", []))]
            if data["version"] == 1 and "slides" not in data:
                raise KeyError("slides")
            top = _known(cls, data)
            top.update(shards=shards, slides=slides)
            manifest = cls(**top)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ManifestError(location, f"malformed ({exc})") from exc
        _check_top(manifest, location)
        if manifest.slides_file and not is_slides_name(manifest.slides_file):
            raise ManifestError(
                location,
                f"slides_file is {_shown(manifest.slides_file)}, not a slide records file name like {SLIDES_NAME}",
            )
        check_shard_records(manifest.shards, location)
        if not is_digest(manifest.index_sha256):
            raise ManifestError(location, f"index_sha256 is {_shown(manifest.index_sha256)}, not a sha256")
        return manifest

    @classmethod
    def from_json(cls, text: str, location: str = "<manifest>") -> Manifest:
        return cls.from_dict(parse_json(text, location), location)


def parse_json(text: str | bytes, location: str, part: str = "") -> Any:
    """The value of one JSON text of a build output (a manifest, a line of a slide records file), whatever the text.

    Args:
        location: the file (path or URL, redacted) named by the error.
        part: where in the file the text is, for the message (``"line 7"``); empty: the whole file.

    Raises:
        ManifestError: the text is no JSON, is not UTF-8, holds an integer too long to convert, or nests deeper
            than the parser goes (which would otherwise be a bare ``RecursionError``).
    """
    where = f"{part} is " if part else ""
    try:
        return json.loads(text)
    except RecursionError as exc:  # the C parser's depth limit: a hostile file, never a wsishard one
        raise ManifestError(location, f"{where}JSON nested too deep to read (not written by wsishard)") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise ManifestError(location, f"{where}not valid JSON ({_first_line(exc)})") from exc


def expected_patch_size(manifest: Manifest, location: str = "<manifest>") -> int:
    """Width = height, px, of every image of a build: ``options["patch"]["patch_size_px"]`` as the build records
    it. The stream and ``verify`` hold every sample to it (never to the first sample's size).

    Raises:
        ManifestError: the options do not hold an integer from 1 to :data:`~wsishard.format.MAX_PATCH_PX` there (a
            larger one would have a stream allocate batches of terabytes).
    """
    patch = manifest.options.get("patch") if isinstance(manifest.options, dict) else None
    size = patch.get("patch_size_px") if isinstance(patch, dict) else None
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PATCH_PX:
        raise ManifestError(
            location,
            f"options.patch.patch_size_px is {_shown(size)}, not a patch size in px (1 to {MAX_PATCH_PX}; "
            "a manifest not written by wsishard build?)",
        )
    return size


def build_mpps(manifest: Manifest, location: str = "<manifest>") -> tuple[float, ...]:
    """The mpps a build made its patches at, as it records them in ``options["patch"]["target_mpp"]``: one number
    (a build of one magnification), or a list of them (a build of several on purpose: its own opt-in to mixing them
    in a batch), ascending; ``()`` where the options record none (an output not written by ``wsishard build``).

    Raises:
        ManifestError: ``target_mpp`` is recorded but is not a positive finite number or a non-empty list of them.
    """
    patch = manifest.options.get("patch") if isinstance(manifest.options, dict) else None
    value = patch.get("target_mpp") if isinstance(patch, dict) else None
    if value is None:
        return ()
    values = value if isinstance(value, list) and value else [value]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf for v in values):
        raise ManifestError(location, f"options.patch.target_mpp is {_shown(value)}, not an mpp or a list of mpps > 0")
    return tuple(sorted(float(v) for v in values))


def manifest_files(manifest: Manifest, part: tuple[int, int] | None = None) -> list[tuple[str, bytes]]:
    """The files that hold ``manifest`` (of the build, or of part ``part``), in write order: its slide records file
    (:func:`slides_name`), then the manifest (:func:`manifest_name`), whose presence means both are complete."""
    manifest = replace(manifest, slides_file=slides_name(part))
    records = slide_lines(manifest.slides, manifest.version)
    return [(slides_name(part), records), (manifest_name(part), manifest.to_json().encode())]


def slide_lines(records: list[SlideRecord], version: int = FORMAT_VERSION) -> bytes:
    """A slide records file (:data:`SLIDES_NAME`) of format ``version``: one JSON object per line, in the order
    given."""
    return "".join(json.dumps(_record_data(r, version)) + "\n" for r in records).encode()


def parse_slide_lines(text: str, location: str = "<slides>") -> list[SlideRecord]:
    """The records of a slide records file (:func:`slide_lines`'s inverse).

    Raises:
        ManifestError: a line that is no slide record, naming its line number.
    """
    records = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        data = parse_json(line, location, f"line {n}")
        try:
            records.append(_slide_record(data))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ManifestError(location, f"line {n} is not a slide record ({exc})") from exc
    return records


def _record_data(record: SlideRecord, version: int) -> dict[str, Any]:
    """``record`` as plain data under the names of format ``version``: a version 1 or 2 output (merged, or written
    again) keeps its own names, ``mpp`` for ``slide_mpp``."""
    data = asdict(record)
    return data if version >= NAMED_MPP_VERSION else {("mpp" if k == "slide_mpp" else k): v for k, v in data.items()}


def _slide_record(data: dict[str, Any], entry: str = "the record") -> SlideRecord:
    """A slide record from its plain data, of any readable version (versions 1 and 2 name ``slide_mpp`` ``mpp``).

    Raises:
        ValueError: a field of the wrong type or out of range (:func:`_record_problem`), naming ``entry``.
    """
    if not isinstance(data, dict):
        raise ValueError(f"{entry} is {_shown(data)}, not an object")
    known = _known(SlideRecord, data)
    if "mpp" in data and "slide_mpp" not in data:
        known["slide_mpp"] = data["mpp"]
    problem = _record_problem(known)
    if problem is not None:
        raise ValueError(f"{entry}'s {problem}")
    return SlideRecord(**known)


def _known(klass: type, data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if k in {f.name for f in fields(klass)}}


def check_shard_records(shards: list[ShardRecord], location: str) -> None:
    """Every shard name is a :func:`shard_name` (in the output: no folder, absolute path or URL), once, and every count
    a count. :meth:`Manifest.from_dict` calls it: a stream or ``verify`` never leaves the output nor reads twice.

    Raises:
        ManifestError: naming the first bad entry (by its index in ``shards``).
    """
    seen: dict[str, int] = {}
    for i, rec in enumerate(shards):
        if not isinstance(rec.name, str) or not is_shard_name(rec.name):
            raise ManifestError(
                location,
                f"shard entry {i} is named {_shown(rec.name)}, not a shard file name "
                f"like {shard_name(0)} (no folder, absolute path or URL)",
            )
        if (first := seen.setdefault(rec.name, i)) != i:
            raise ManifestError(location, f"shard entry {i} ({rec.name}) is entry {first} again: read twice")
        for count in ("samples", "bytes", "slides"):
            value = getattr(rec, count)
            if not _is_count(value):
                raise ManifestError(location, f"shard entry {i} ({rec.name}) has {count} {_shown(value)}, not a count")
        if not isinstance(rec.sha256, str) or not _SHA256.fullmatch(rec.sha256):
            raise ManifestError(
                location, f"shard entry {i} ({rec.name}) has sha256 {_shown(rec.sha256)}, not 64 hex digits"
            )
        if not is_digest(rec.index_sha256):
            raise ManifestError(
                location, f"shard entry {i} ({rec.name}) has index_sha256 {_shown(rec.index_sha256)}, not a sha256"
            )


def is_digest(value: object) -> bool:
    """True for a sha256 in hex (64 lower-case hex digits), or "" (none recorded)."""
    return isinstance(value, str) and (value == "" or re.fullmatch(r"[0-9a-f]{64}", value) is not None)


def _check_top(manifest: Manifest, location: str) -> None:
    """The manifest's own fields hold what their names say: ``options`` and ``extra`` objects, ``image_format`` one
    of :data:`IMAGE_FORMATS`, the names and dates text."""
    for name in ("options", "extra"):
        if not isinstance(getattr(manifest, name), dict):
            raise ManifestError(location, f"{name} is {_shown(getattr(manifest, name))}, not an object")
    if manifest.image_format not in IMAGE_FORMATS:
        shown = _shown(manifest.image_format)
        raise ManifestError(location, f"image_format is {shown}, not one of {', '.join(IMAGE_FORMATS)}")
    for name in ("slides_file", "created", "wsishard_version"):
        if not isinstance(getattr(manifest, name), str):
            raise ManifestError(location, f"{name} is {_shown(getattr(manifest, name))}, not text")


_TEXT_FIELDS = ("slide_id", "file", "reason", "mpp_source", "roi")
_COUNT_FIELDS = ("width", "height", "candidates", "patches", "bytes_read")
_AREA_FIELDS = ("tissue_fraction", "tissue_mm2", "ink_mm2", "artefact_mm2", "pigment_mm2")  # finite, >= 0
_SCALE_FIELDS = ("slide_mpp", "patch_mpp", "downsample")  # finite, > 0, or None (a failed slide)


def _record_problem(data: dict[str, Any]) -> str | None:
    """What is wrong with a slide record's fields (``field 'patches' is 'x', not a count``), or None."""
    rules: list[tuple[tuple[str, ...], Any, str]] = [
        (_TEXT_FIELDS, lambda v: isinstance(v, str), "text"),
        (_COUNT_FIELDS, _is_count, "a count"),
        (_AREA_FIELDS, lambda v: _is_number(v) and 0 <= v < math.inf, "a finite number >= 0"),
        (_SCALE_FIELDS, lambda v: v is None or (_is_number(v) and 0 < v < math.inf), "a finite number > 0"),
        (("level",), lambda v: v is None or _is_count(v), "a level number"),
        (
            ("label",),
            lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v in LABEL_RANGE),
            "an int64 label",
        ),
        (("status",), lambda v: v in ("ok", "failed", "skipped"), "ok, failed or skipped"),
        (("stain",), lambda v: isinstance(v, dict), "an object"),
        (("filtered",), lambda v: isinstance(v, dict) and all(map(_is_count, v.values())), "counts by reason"),
    ]
    for names, ok, rule in rules:
        for name in names:
            if name in data and not ok(data[name]):
                return f"field {name!r} is {_shown(data[name])}, not {rule}"
    return None


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _first_line(exc: BaseException) -> str:
    """``exc``'s message cut to its first line and 200 characters."""
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _shown(value: object) -> str:
    """``value`` as an error message shows it: quoted, cut to 120 characters, credentials in URLs redacted."""
    text = redact(value) if isinstance(value, str) else value
    return repr(text if not isinstance(text, str) or len(text) <= 120 else text[:120] + "...")
