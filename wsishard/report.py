"""Readable summaries of a manifest, for the build's final lines and ``wsishard inspect``."""

from __future__ import annotations

import os
from typing import Any

from wsishard.manifest import Manifest, SlideRecord
from wsishard.storage.urls import is_url


def human_bytes(n: float) -> str:
    """``1234567`` -> ``1.2 MB`` (decimal units, like the ``--shard-size`` parser accepts)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def plural(n: int, word: str) -> str:
    """``1 shard``, ``2 shards``, ``1,200 patches``."""
    return f"{n:,} {word}" + ("" if n == 1 else "es" if word.endswith("ch") else "s")


def _skipped(manifest: Manifest) -> list[SlideRecord]:
    """Slides an option left out (``--roi-missing skip`` without an annotation file): not failures."""
    return [s for s in manifest.slides if s.status == "skipped"]


def headline(manifest: Manifest) -> str:
    """One line: slides ok/failed (and skipped, when some were), patches, shards, bytes and image format."""
    ok, skipped = sum(s.status == "ok" for s in manifest.slides), len(_skipped(manifest))
    counts = f"{ok} ok, {len(manifest.failed_slides)} failed" + (f", {skipped} skipped" if skipped else "")
    return (
        f"{plural(len(manifest.slides), 'slide')} ({counts}): {plural(manifest.total_samples, 'patch')} in "
        f"{plural(len(manifest.shards), 'shard')} ({human_bytes(manifest.total_bytes)}, {manifest.image_format})"
    )


def summary(manifest: Manifest, location: str = "") -> str:
    """A few lines: slides ok/failed, samples, shards, bytes, the bytes of slides in object storage read (when some
    are), the slides a labelled build left without a label, and one line per failed slide."""
    lines = [headline(manifest) + (f" -> {location}" if location else "")]
    if manifest.shards:
        counts = [s.samples for s in manifest.shards]
        mixing = [s.slides for s in manifest.shards]
        lines.append(f"  samples per shard {min(counts)}..{max(counts)}, slides per shard {min(mixing)}..{max(mixing)}")
    remote = [s.bytes_read for s in manifest.slides if is_url(s.file)]
    if remote:
        total, mean = human_bytes(sum(remote)), human_bytes(sum(remote) / len(remote))
        lines.append(
            f"  read from object storage: {total} of slide files, {mean} per slide on average "
            f"({plural(len(remote), 'slide')})"
        )
    if manifest.options.get("labels"):
        unlabelled = [os.path.basename(s.file) for s in manifest.slides if s.status == "ok" and s.label is None]
        if unlabelled:
            names = ", ".join(unlabelled[:5]) + (f" and {len(unlabelled) - 5} more" if len(unlabelled) > 5 else "")
            lines.append(f"  {plural(len(unlabelled), 'slide')} without a label (label -1 when streamed): {names}")
    lines += _qc_lines(manifest, location)
    for slide in manifest.failed_slides:
        lines.append(f"  FAILED {os.path.basename(slide.file)}: {slide.reason}")
    for slide in _skipped(manifest):
        lines.append(f"  skipped {os.path.basename(slide.file)}: {slide.reason}")
    return "\n".join(lines)


def _qc_lines(manifest: Manifest, location: str) -> list[str]:
    """Where the QC review is (a whole build's), or how to draw it: a default build draws no picture."""
    if "part" in manifest.extra or not location:
        return []
    if manifest.options.get("qc"):
        return [f"  QC review: {location.rstrip('/')}/qc/index.html"]
    page = f"{location.rstrip('/')}/qc/index.html"
    return [f"  QC review: wsishard inspect {location} --qc draws the pictures and {page} (no picture drawn yet)"]


def details(
    manifest: Manifest,
    *,
    max_rows: int = 50,
    label_counts: dict[int, int] | None = None,
    mpp_counts: dict[float, int] | None = None,
) -> str:
    """The summary, the build options, the labels (with ``label_counts``, the build's samples of each label, their
    counts), a multi-mpp build's samples per mpp (``mpp_counts``), a table of slides (with a key to its columns) and
    one of shards (``max_rows`` of each)."""
    opts = manifest.options
    patch: dict[str, Any] = opts["patch"] if isinstance(opts.get("patch"), dict) else {}  # a manifest's JSON: anything
    tolerance = patch.get("mpp_tolerance") or 0
    tolerance = f"{tolerance:g}" if isinstance(tolerance, int | float) else repr(tolerance)
    lines = [
        f"wsishard manifest v{manifest.version} (wsishard {manifest.wsishard_version}, created {manifest.created})",
        summary(manifest),
        "",
        f"patches: {patch.get('patch_size_px')} px at {patch.get('target_mpp')} mpp "
        f"({f'within {tolerance} of it' if tolerance != '0' else 'exactly'}), stride "
        f"{patch.get('stride_px') or patch.get('patch_size_px')}, min tissue {patch.get('min_tissue')}, "
        f"seed {opts.get('seed')}, quality {opts.get('quality')}",
    ]
    context = opts.get("context_mpp")
    if context and isinstance(context, list):
        lines.append(
            f"context: {', '.join(map(str, context))} mpp at {opts.get('context_size')} px "
            f"(members {', '.join(f'ctx{i}' for i in range(len(context)))})"
        )
    if mpp_counts:
        lines.append("samples per mpp: " + ", ".join(f"{m:g} mpp {plural(n, 'patch')}" for m, n in mpp_counts.items()))
    lines += _label_lines(manifest, label_counts)
    lines += [
        "",
        f"{'slide':<32} {'status':<7} {'size':>13} {'slide_mpp':>9} {'src':<9} {'lvl':>3} {'patch_mpp':>9} "
        f"{'tissue':>6} {'cells':>6} {'patches':>7} {'label':>5}",
    ]
    roi_labels = bool(manifest.extra.get("label_names"))
    for s in manifest.slides[:max_rows]:
        size = f"{s.width}x{s.height}" if s.width else "-"
        mpp = f"{s.slide_mpp:.4f}" if s.slide_mpp else "-"
        out_mpp = f"{s.patch_mpp:.4f}" if s.patch_mpp else "-"
        lvl = "-" if s.level is None else str(s.level)
        label = str(s.label) if s.label is not None else "roi" if roi_labels and _annotated(s) else "-"
        lines.append(
            f"{s.slide_id[:32]:<32} {s.status:<7} {size:>13} {mpp:>9} {s.mpp_source or '-':<9} {lvl:>3} "
            f"{out_mpp:>9} {s.tissue_fraction:>6.1%} {s.candidates:>6} {s.patches:>7} {label:>5}"
        )
    if len(manifest.slides) > max_rows:
        lines.append(f"... {len(manifest.slides) - max_rows} more slides")
    lines.append(_KEY)
    lines += ["", f"{'shard':<22} {'samples':>8} {'slides':>6} {'bytes':>10}  sha256"]
    for sh in manifest.shards[:max_rows]:
        lines.append(f"{sh.name:<22} {sh.samples:>8} {sh.slides:>6} {human_bytes(sh.bytes):>10}  {sh.sha256[:16]}")
    if len(manifest.shards) > max_rows:
        lines.append(f"... {len(manifest.shards) - max_rows} more shards")
    return "\n".join(lines)


_KEY = (
    "  slide_mpp: level 0's, from src (openslide, csv or default); lvl: the level read;\n"
    "  patch_mpp: the patches' actual mpp (the target, unless --mpp-tolerance snapped it to a level);\n"
    "  tissue: fraction of the slide; cells: grid cells with any tissue; patches: those written (the rest were left\n"
    '  out, per reason in slides.jsonl\'s "filtered": min_tissue, artefact, roi, roi_class, max_patches, quality);\n'
    "  label: the slide's (--labels); roi: its patches' own, the annotation class covering most of each (--roi-labels)"
)


def _annotated(slide: SlideRecord) -> bool:
    """Whether the slide's patches took their labels from its annotations (not built whole, not skipped)."""
    return slide.status == "ok" and bool(slide.roi) and slide.roi.startswith("annotated")


def _label_lines(manifest: Manifest, counts: dict[int, int] | None) -> list[str]:
    """``labels: 0 Stroma (120 patches), 1 Tumor (80 patches)`` for a ``--roi-labels`` build (the names alone
    without ``counts``), ``labels: 0 (300 patches), 1 (120 patches), unlabelled (40 patches)`` for another."""
    names = manifest.extra.get("label_names")
    names = names if isinstance(names, list) else []  # a manifest's JSON: anything
    if not names and not (counts and set(counts) - {-1}):
        return []
    values = range(len(names)) if names else sorted(v for v in counts or {} if v != -1)
    parts = []
    for value in values:
        name = f"{value} {names[value]}" if names else str(value)
        parts.append(name if counts is None else f"{name} ({plural(counts.get(value, 0), 'patch')})")
    if counts and counts.get(-1):
        parts.append(f"unlabelled ({plural(counts[-1], 'patch')})")
    return ["labels: " + ", ".join(parts)]
