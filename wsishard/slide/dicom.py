"""DICOM whole-slide images: one slide is a series of ``.dcm`` files (a VOLUME file per level, a THUMBNAIL, a LABEL,
an OVERVIEW), and OpenSlide opens the whole series from any one of its files in one folder. A folder search finds
each file; :func:`group_series` keeps one file per series, so a series is built once and not as N slides with the
same pixels (which would also leak across slide-level train/validation splits), and names the slide by its series.

Series are told apart by the files' headers alone (:mod:`wsishard.slide.dicomheader`): a few KB read from each
file, by range in object storage. OpenSlide reads local files only: a series in object storage is copied whole
(:func:`series_files` lists its files) into a scratch folder of its own to be read.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from wsishard.slide.dicomheader import DicomHeader, read_header
from wsishard.storage.urls import StorageOptions, is_url, public_location

logger = logging.getLogger(__name__)

SUFFIX = ".dcm"
_READERS = 16  # headers read at once


def is_dicom(path: str) -> bool:
    """Whether ``path`` (a file or a URL) names a DICOM file by its suffix (a presigned URL's query aside)."""
    return public_location(path).lower().endswith(SUFFIX)


def header(path: str, storage_options: StorageOptions | None = None) -> DicomHeader | None:
    """The series fields of the DICOM file ``path`` (a file or a URL; only its first KBs read), or None where it
    cannot be read or is no DICOM: its scan then records why."""
    try:
        if not is_url(path):
            with open(path, "rb") as fh:
                return read_header(lambda n: os.pread(fh.fileno(), n, 0))
        import fsspec.core  # not at import (CLI start-up)

        fs, key = fsspec.core.url_to_fs(path, **dict(storage_options or {}))
        return read_header(lambda n: bytes(fs.cat_file(key, start=0, end=n)))
    except (OSError, ValueError) as exc:
        logger.debug("%s: no DICOM header read (%s)", public_location(path), type(exc).__name__)
        return None


def series_name(found: DicomHeader) -> str:
    """The name a series is built under (before :func:`wsishard.format.unique_slide_ids` sanitizes it and breaks
    ties): its ContainerIdentifier, the glass slide's identifier a pathologist knows it by (a barcode, a TCGA slide
    id), else its SeriesInstanceUID."""
    return found.container or found.series


def group_series(
    paths: Sequence[str], storage_options: StorageOptions | None = None
) -> tuple[list[str], dict[str, str]]:
    """``paths`` (sorted) with one file per DICOM series, and each kept series' name by its public location.

    The ``.dcm`` files of one folder (local, or a prefix in object storage) whose headers name the same study and
    series are one slide, kept as the first of them; a warning names the files grouped. A ``.dcm`` that is no
    whole-slide image (a report, say) is kept as it is: its scan records it failed, with OpenSlide's reason. The
    headers are read :data:`_READERS` at a time (a bucket's round trips overlap)."""
    series: dict[tuple[str, str, str], list[str]] = {}
    kept: list[str] = []
    names: dict[str, str] = {}
    dicom = [p for p in paths if is_dicom(p)]
    headers: dict[str, DicomHeader | None] = {}
    if dicom:
        read = functools.partial(header, storage_options=storage_options)
        with ThreadPoolExecutor(min(_READERS, len(dicom)), thread_name_prefix="wsishard-dicom") as pool:
            headers = dict(zip(dicom, pool.map(read, dicom), strict=True))
    for path in paths:
        found = headers.get(path)
        if found is None or not found.is_slide:
            kept.append(path)
            continue
        files = series.setdefault((_folder(path), found.study, found.series), [])
        if not files:
            kept.append(path)
            names[public_location(path)] = series_name(found)
        files.append(path)
    for (_, _, uid), files in series.items():
        if len(files) > 1:
            logger.warning(
                "DICOM series %s: %d files (%s) are one slide, built once as %s",
                uid,
                len(files),
                ", ".join(public_location(f).rsplit("/", 1)[-1] for f in files),
                names[public_location(files[0])],
            )
    return kept, names


def series_files(url: str, storage_options: StorageOptions | None = None) -> list[str]:
    """The files of the DICOM series ``url`` (an object) is one of, in its prefix: ``url`` itself first, then the
    other ``.dcm`` objects beside it whose headers name the same series; just ``url`` where it is no series."""
    import fsspec.core  # not at import (CLI start-up)

    own = header(url, storage_options)
    if own is None or not own.is_slide:
        return [url]
    fs, key = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    protocol = url.split("://", 1)[0]
    try:
        listed = fs.ls(key.rsplit("/", 1)[0], detail=False)
    except (OSError, ValueError, NotImplementedError) as exc:  # a store that cannot list (plain HTTP)
        logger.warning("%s: its series' other files cannot be listed (%s)", public_location(url), type(exc).__name__)
        return [url]
    siblings = sorted(p for p in listed if p.lower().endswith(SUFFIX))
    out = [url]
    for sibling in siblings:
        other = f"{protocol}://{sibling}"
        found = header(other, storage_options) if sibling != key else None
        if found is not None and (found.study, found.series) == (own.study, own.series):
            out.append(other)
    return out


def _folder(path: str) -> str:
    return public_location(path).rsplit("/", 1)[0] if is_url(path) else os.path.dirname(os.path.abspath(path))
