"""The manifest: a build output's table of contents (:class:`Manifest`, written last), its shard and slide records,
and the files they are written to (``manifest.json`` and ``slides.jsonl``, or a part's). The names of those files and
every other format rule are :mod:`wsishard.format`'s."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from wsishard.errors import ManifestError
from wsishard.format import (
    FORMAT_NAME,
    FORMAT_VERSION,
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

__all__ = [
    "Manifest",
    "ShardRecord",
    "SlideRecord",
    "check_shard_records",
    "expected_patch_size",
    "manifest_files",
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
    stain: dict[str, Any] = field(default_factory=dict)  # H&E stain: builder/stain.py StainFit.to_record; {}: none


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
        if data.get("version") not in READABLE_VERSIONS:
            raise ManifestError(
                location, f"format version {data.get('version')!r}, this wsishard reads {list(READABLE_VERSIONS)}"
            )
        try:
            names = {f.name for f in fields(ShardRecord)}
            shards = [ShardRecord(**{k: v for k, v in s.items() if k in names}) for s in data["shards"]]
            slides = [_slide_record(s) for s in data.get("slides", [])]
            if data["version"] == 1 and "slides" not in data:
                raise KeyError("slides")
            top = _known(cls, data)
            top.update(shards=shards, slides=slides)
            manifest = cls(**top)
        except (KeyError, TypeError, AttributeError) as exc:
            raise ManifestError(location, f"malformed ({exc})") from exc
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
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(location, f"not valid JSON ({exc})") from exc
        return cls.from_dict(data, location)


def expected_patch_size(manifest: Manifest, location: str = "<manifest>") -> int:
    """Width = height, px, of every image of a build: ``options["patch"]["patch_size_px"]`` as the build records
    it. The stream and ``verify`` hold every sample to it (never to the first sample's size).

    Raises:
        ManifestError: the options do not hold a positive integer there.
    """
    patch = manifest.options.get("patch") if isinstance(manifest.options, dict) else None
    size = patch.get("patch_size_px") if isinstance(patch, dict) else None
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ManifestError(
            location,
            f"options.patch.patch_size_px is {size!r}, not a patch size in px "
            "(a manifest not written by wsishard build?)",
        )
    return size


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
        try:
            records.append(_slide_record(json.loads(line)))
        except (ValueError, TypeError, AttributeError) as exc:
            raise ManifestError(location, f"line {n} is not a slide record ({exc})") from exc
    return records


def _record_data(record: SlideRecord, version: int) -> dict[str, Any]:
    """``record`` as plain data under the names of format ``version``: a version 1 or 2 output (merged, or written
    again) keeps its own names, ``mpp`` for ``slide_mpp``."""
    data = asdict(record)
    return data if version >= NAMED_MPP_VERSION else {("mpp" if k == "slide_mpp" else k): v for k, v in data.items()}


def _slide_record(data: dict[str, Any]) -> SlideRecord:
    """A slide record from its plain data, of any readable version (versions 1 and 2 name ``slide_mpp`` ``mpp``)."""
    known = _known(SlideRecord, data)
    if "mpp" in data and "slide_mpp" not in data:
        known["slide_mpp"] = data["mpp"]
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
        for count in ("samples", "bytes"):
            value = getattr(rec, count)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ManifestError(location, f"shard entry {i} ({rec.name}) has {count} {value!r}, not a count")
        if not is_digest(rec.index_sha256):
            raise ManifestError(
                location, f"shard entry {i} ({rec.name}) has index_sha256 {_shown(rec.index_sha256)}, not a sha256"
            )


def is_digest(value: object) -> bool:
    """True for a sha256 in hex (64 lower-case hex digits), or "" (none recorded)."""
    return isinstance(value, str) and (value == "" or re.fullmatch(r"[0-9a-f]{64}", value) is not None)


def _shown(value: object) -> str:
    """``value`` as an error message shows it: quoted, cut to 120 characters, credentials in URLs redacted."""
    text = redact(value) if isinstance(value, str) else value
    return repr(text if not isinstance(text, str) or len(text) <= 120 else text[:120] + "...")
