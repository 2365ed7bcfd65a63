"""DICOM whole-slide images: one slide is a series of ``.dcm`` files (a VOLUME file per level, a THUMBNAIL, a LABEL,
an OVERVIEW), and OpenSlide opens the whole series from any one of its files. A folder search finds each file;
:func:`group_series` keeps one file per series, so a series is built once and not as N slides with the same pixels
(which would also leak across slide-level train/validation splits)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

from wsishard.storage.urls import is_url

logger = logging.getLogger(__name__)

_SUFFIX = ".dcm"
_STUDY = "dicom.StudyInstanceUID"
_SERIES = "dicom.SeriesInstanceUID"


def series_uids(path: str) -> tuple[str, str] | None:
    """``(StudyInstanceUID, SeriesInstanceUID)`` of the slide OpenSlide opens from ``path``, or None where OpenSlide
    cannot open it as a slide (not DICOM, a report, a label image alone): its scan then records why."""
    import openslide  # not at import: the CLI starts without OpenSlide

    try:
        with openslide.OpenSlide(path) as slide:
            props = slide.properties
            study, series = props.get(_STUDY), props.get(_SERIES)
    except (openslide.OpenSlideError, OSError):
        return None
    return (study, series) if study and series else None


def group_series(paths: Sequence[str]) -> list[str]:
    """``paths`` (sorted) with one file per DICOM series: the local ``.dcm`` files of one folder that open as one
    series (the same study and series UIDs) are kept as the first of them, and a warning names the files grouped.
    A ``.dcm`` that does not open as a slide is kept as it is (its scan records it failed, with OpenSlide's reason);
    URLs are kept as they are (OpenSlide reads local files only)."""
    series: dict[tuple[str, str, str], list[str]] = {}
    kept: list[str] = []
    for path in paths:
        uids = series_uids(path) if path.lower().endswith(_SUFFIX) and not is_url(path) else None
        if uids is None:
            kept.append(path)
            continue
        files = series.setdefault((os.path.dirname(os.path.abspath(path)), *uids), [])
        if not files:
            kept.append(path)
        files.append(path)
    for (_, _, uid), files in series.items():
        if len(files) > 1:
            logger.warning(
                "DICOM series %s: %d files (%s) are one slide, built once as %s",
                uid,
                len(files),
                ", ".join(os.path.basename(f) for f in files),
                files[0],
            )
    return kept
