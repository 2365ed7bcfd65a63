"""QC pictures drawn after a build, from what its scans recorded: ``wsishard inspect OUT --qc`` (and ``--html``).

A default build draws no picture: each slide's scan records what its picture needs (:mod:`wsishard.builder.qc.qcrecord`)
and :func:`draw_pictures` draws the pictures still missing from ``OUT/qc/`` (local or object storage), then writes
``OUT/qc/index.html``. A slide is read again for the picture's view where it still can be (at the location the
build recorded); otherwise its picture is drawn on the view its scan recorded, coarser, and said so.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field

from wsishard.builder.qc.qcrecord import picture_png
from wsishard.builder.run.pool import WorkerPool
from wsishard.builder.scan.scanstate import ScanStore
from wsishard.errors import OutputError, SlideError
from wsishard.format import QC_INDEX_NAME, STATE_DIR, qc_picture_name, sanitize_slide_id
from wsishard.manifest import Manifest
from wsishard.qc_html import qc_index
from wsishard.report import plural
from wsishard.slide import SlideReader, open_slide
from wsishard.slide.remote_tiff import open_in_place
from wsishard.storage.output import Destination
from wsishard.storage.urls import StorageOptions, is_url

logger = logging.getLogger(__name__)

DEFAULT_SIZE_PX = 2000  # the pictures' longest side when the manifest records none


@dataclass(frozen=True)
class PictureTask:
    """One slide's picture to draw: its scan file's ``index``, where to read the slide, where the picture goes."""

    index: int
    slide_id: str
    path: str
    dest: Destination
    size_px: int
    storage_options: StorageOptions = field(default_factory=dict)


@dataclass
class QcDrawn:
    """What :func:`draw_pictures` did: pictures drawn from the slides, slides whose picture was drawn on the view
    their scan recorded (not readable here), slides with no picture (their scan recorded none: failed before tissue
    detection), slides with no scan record at all (its ``.wsishard/scan`` folder removed or not copied, or scanned
    by a wsishard before 0.3), pictures already there."""

    from_slides: int = 0
    from_records: list[str] = field(default_factory=list)
    without: list[str] = field(default_factory=list)
    unrecorded: list[str] = field(default_factory=list)
    present: int = 0
    page: str | None = None  # the review page written (None: a part's pictures, no page)

    def line(self) -> str:
        """One line for the user: what was drawn, and where the review page is."""
        parts = [f"{plural(self.from_slides + len(self.from_records), 'QC picture')} drawn"]
        if self.from_records:
            more = " ..." if len(self.from_records) > 3 else ""
            parts.append(
                f"{len(self.from_records)} of them on the scan's recorded view (slide not readable here: "
                f"{', '.join(self.from_records[:3])}{more})"
            )
        if self.present:
            parts.append(f"{self.present} already there")
        if self.without:
            parts.append(f"{plural(len(self.without), 'slide')} without one (failed before tissue detection)")
        if self.unrecorded:
            parts.append(
                f"{plural(len(self.unrecorded), 'slide')} without a scan record ({STATE_DIR}/scan removed or not "
                "copied, or built by a wsishard before 0.3): build with --qc to draw theirs"
            )
        return "; ".join(parts) + (f"; review page {self.page}" if self.page else "")


def draw_pictures(
    manifest: Manifest, root: str, storage_options: StorageOptions | None = None, *, jobs: int | None = None
) -> QcDrawn:
    """Draw the QC pictures missing from the build at ``root`` (its ``manifest``: a whole, merged or part build's),
    then (not a part) write its ``qc/index.html``.

    Raises:
        OutputError: the output cannot be written.
    """
    dest = Destination(root, storage_options)
    size = int(manifest.options.get("qc_size_px") or DEFAULT_SIZE_PX)
    indices = manifest.extra.get("slide_indices") or range(len(manifest.slides))
    present = set(dest.listdir("qc"))
    tasks = [
        PictureTask(
            index=i,
            slide_id=s.slide_id,
            path=s.file,
            dest=dest,
            size_px=size,
            storage_options=dict(storage_options or {}),
        )
        for i, s in zip(indices, manifest.slides, strict=True)
        if f"{s.slide_id}.png" not in present
    ]
    done = QcDrawn(present=len(manifest.slides) - len(tasks))
    try:
        dest.makedirs("qc")
        with WorkerPool(max(1, min(jobs or os.cpu_count() or 1, len(tasks)))) as pool:
            for task, how in zip(tasks, pool.imap(draw_picture, tasks), strict=True):
                if how == "slide":
                    done.from_slides += 1
                else:
                    lists = {"record": done.from_records, "unrecorded": done.unrecorded}
                    lists.get(how, done.without).append(task.slide_id)
        if "part" not in manifest.extra:
            dest.write_bytes(QC_INDEX_NAME, qc_index(manifest).encode())
            done.page = dest.path(QC_INDEX_NAME)
    except OSError as exc:
        raise OutputError(dest.path("qc"), exc.strerror or str(exc)) from exc
    return done


def draw_picture(task: PictureTask) -> str:
    """Draw one slide's picture into the output; how: ``"slide"``, ``"record"`` (on the recorded view: the slide
    could not be read), ``"unrecorded"`` (no scan record of it) or ``"none"`` (its scan recorded no picture, or the
    manifest's slide id is no name a build gives: a picture is only ever written as ``qc/<id>.png``, never
    elsewhere)."""
    if sanitize_slide_id(task.slide_id) != task.slide_id:
        return "none"
    scan = ScanStore(task.dest, STATE_DIR).load(task.index, 1, qc=True)
    if scan is None:
        return "unrecorded"
    if scan.qc is None or scan.record.slide_id != task.slide_id:
        return "none"
    data, how = None, "record"
    with tempfile.TemporaryDirectory(prefix="wsishard-qc-") as scratch:
        reader = _open(task, scratch)
        if reader is not None:
            with reader:
                try:
                    data, how = picture_png(scan.qc, scan.cands, task.size_px, reader), "slide"
                except SlideError as exc:
                    logger.debug("%s not readable for its QC picture: %s", task.path, exc.reason)
    if data is None:
        data = picture_png(scan.qc, scan.cands, task.size_px, None)
    task.dest.write_bytes(qc_picture_name(task.slide_id), data)
    return how


def _open(task: PictureTask, scratch: str) -> SlideReader | None:
    """The slide opened again, or None where it cannot be (moved, deleted, a URL that needed its query string)."""
    try:
        if is_url(task.path):
            return open_in_place(task.path, scratch, task.storage_options, fast=True)
        return open_slide(task.path, fast=True) if os.path.exists(task.path) else None
    except (SlideError, OSError) as exc:
        logger.debug("%s not readable for its QC picture: %s", task.path, exc)
        return None
