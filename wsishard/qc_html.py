"""``qc/index.html``: every slide's QC picture with its numbers on one page, failed slides first, so a person can
review a thousand slides by scrolling. Written as ``qc/index.html`` by a build with ``--qc`` and by ``wsishard
inspect OUT --qc``, and anywhere by ``wsishard inspect OUT --html FILE``.
Everything from the manifest is HTML-escaped (file names and reasons are data, never markup)."""

from __future__ import annotations

import contextlib
import html
import os

from wsishard.errors import OptionError
from wsishard.format import (
    MANIFEST_NAME,
    QC_INDEX_NAME,
    STATE_DIR,
    is_shard_name,
    is_slides_name,
    parse_part_manifest,
    temp_target,
)
from wsishard.manifest import Manifest, SlideRecord
from wsishard.report import headline
from wsishard.shards.index import index_shard
from wsishard.shards.summary import SUMMARY_NAME
from wsishard.storage.urls import is_url

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1em auto; max-width: 1100px; color: #222; }
.slide { border-top: 1px solid #ccc; padding: 1em 0; }
.failed h2 { color: #b00; }
h2 { font-size: 1.1em; margin: 0 0 .3em; }
.reason { color: #b00; font-weight: bold; }
table { border-collapse: collapse; margin: .3em 0 .6em; font-size: .9em; }
td { padding: .1em .8em .1em 0; }
img { max-width: 100%; height: auto; display: block; border: 1px solid #ddd; }
"""


def qc_index(manifest: Manifest, picture_prefix: str = "") -> str:
    """The page for ``manifest``'s slides; a slide's picture is ``<picture_prefix><slide_id>.png``."""
    slides = sorted(manifest.slides, key=lambda s: (_ORDER.get(s.status, 0), s.slide_id))
    head = headline(manifest)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>wsishard QC: {html.escape(head)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>wsishard QC</h1><p>{html.escape(head)}. Failed slides first, then skipped ones. Colours: tissue "
        "contour green, kept patches blue, ink removed magenta, dark artefacts removed orange, dark pigment kept "
        "cyan, annotations yellow.</p>",
    ]
    parts += [_card(s, picture_prefix) for s in slides]
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_qc_page(manifest: Manifest, root: str, path: str) -> None:
    """Write :func:`qc_index` to the local file ``path``, linking the pictures of the build at ``root`` (a folder:
    relative to the page, so the two can be moved together; a URL: by URL).

    Raises:
        OptionError: ``path`` is a folder, or one of the build's own files (its manifest, slide records, a shard, a
            QC picture, its state), which the page would replace; its own ``qc/index.html`` may be rewritten.
    """
    check_page_target(root, path)
    qc = root.rstrip("/") + "/qc/"
    if not is_url(root):
        qc = os.path.relpath(os.path.join(root, "qc"), os.path.dirname(os.path.abspath(path))) + "/"
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(qc_index(manifest, qc.replace(os.sep, "/")))


def check_page_target(root: str, path: str) -> None:
    """Refuse (:class:`OptionError`) a page ``path`` that is a folder or one of the build's own files: by its name
    in the output (after resolving symlinks and ``..``), or, for an existing file anywhere, by being the same file
    (device and inode: a hard link) as one in the output."""
    if os.path.isdir(path):
        raise OptionError(f"--html {path}: is a folder; give the page's file name ({os.path.join(path, 'qc.html')})")
    if is_url(root):
        return
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root)).replace(os.sep, "/")
    name = None if rel.startswith("../") else temp_target(rel) or rel
    if name is None or not _owned(name):
        name = _linked_name(root, path)  # a hard link, inside the output or out of it
    if name is not None and _owned(name):
        raise OptionError(
            f"--html {path}: that is the build's own {name}, which the page would replace; write it "
            f"elsewhere (the build's page is {os.path.join(root, QC_INDEX_NAME)})"
        )


def _owned(name: str) -> bool:
    """Whether ``name`` (relative to the output, ``/``-separated) is a file the build writes, except its page."""
    picture = name.startswith("qc/") and name.endswith(".png")
    state = name == STATE_DIR or name.startswith(STATE_DIR + "/")
    listing = name == MANIFEST_NAME or parse_part_manifest(name) is not None or is_slides_name(name)
    index = name == SUMMARY_NAME or index_shard(name) is not None
    return state or picture or listing or index or is_shard_name(name)


def _linked_name(root: str, path: str) -> str | None:
    """The name of a file of the build at ``root`` that ``path`` is a hard link of, if any."""
    try:
        st = os.stat(path)
    except OSError:  # no such file yet: nothing to replace
        return None
    if st.st_nlink < 2:
        return None
    for folder, _, files in os.walk(root):
        for file in files:
            full = os.path.join(folder, file)
            with contextlib.suppress(OSError):
                name = os.path.relpath(full, root).replace(os.sep, "/")
                if _owned(name) and os.path.samestat(os.stat(full), st):
                    return name
    return None


_ORDER = {"failed": 0, "skipped": 1, "ok": 2}  # failed slides first, then skipped ones


def _card(s: SlideRecord, prefix: str) -> str:
    at = f" at {s.slide_mpp:.4f} mpp ({s.mpp_source})" if s.slide_mpp else ""
    rows = [
        ("file", os.path.basename(s.file)),
        ("size", f"{s.width} x {s.height} px{at}"),
        ("tissue", f"{s.tissue_mm2:.2f} mm2 ({s.tissue_fraction:.1%} of the slide)"),
        ("removed", f"ink {s.ink_mm2:.2f} mm2, dark artefacts {s.artefact_mm2:.2f} mm2"),
        ("kept pigment", f"{s.pigment_mm2:.2f} mm2"),
        (
            "patches",
            f"{s.patches:,} kept of {s.candidates:,} cells with tissue"
            + (f", at {s.patch_mpp:.4f} mpp" if s.patch_mpp else ""),
        ),
    ]
    if s.filtered:
        rows.append(("left out", ", ".join(f"{k} {n:,}" for k, n in sorted(s.filtered.items()))))
    if s.roi:
        rows.append(("annotations", s.roi))
    if s.label is not None:
        rows.append(("label", str(s.label)))
    table = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(v)}</td></tr>" for k, v in rows)
    reason = f'<p class="reason">{html.escape(s.reason)}</p>' if s.reason else ""
    src = html.escape(prefix + s.slide_id + ".png", quote=True)
    name = html.escape(s.slide_id)
    return (
        f'<div class="slide {html.escape(s.status)}" id="{name}"><h2>{name}: {html.escape(s.status)}</h2>'
        f'{reason}<table>{table}</table><a href="{src}"><img src="{src}" loading="lazy" '
        f'alt="no QC picture for {name}" onerror="this.parentNode.replaceWith(this.alt)"></a></div>'
    )
