"""The build's inputs: slide paths from folders, files, list files and object-storage prefixes; per-slide tables
(``slide,value`` CSV files: mpp overrides, labels) and their check against the slides found."""

from __future__ import annotations

import codecs
import csv
import io
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from wsishard.builder.inputs.copies import warn_copies
from wsishard.builder.options.values import MPP_RULE, valid_label, valid_mpp
from wsishard.errors import OptionError
from wsishard.slide import SLIDE_SUFFIXES
from wsishard.slide.dicom import group_series
from wsishard.storage.secrets import refuse_url_credentials
from wsishard.storage.urls import StorageOptions, is_url, public_location

if TYPE_CHECKING:  # the options read the tables' values; the tables only check against them
    from wsishard.builder.options.buildopts import BuildOptions

_LIST_SUFFIXES = (".txt", ".lst", ".list", ".csv")
T = TypeVar("T")
logger = logging.getLogger(__name__)


def find_slides(inputs: Sequence[str], storage_options: StorageOptions | None = None) -> list[str]:
    """The slides of :func:`find_inputs`, without their names."""
    return find_inputs(inputs, storage_options)[0]


def find_inputs(
    inputs: Sequence[str], storage_options: StorageOptions | None = None
) -> tuple[list[str], dict[str, str]]:
    """Slide files from folders (recursive), slide files, text files listing slides (one per line), and URLs
    (``s3://bucket/slides/``: every slide under the prefix; or one object), sorted, each file once (the same file
    under two paths, a symlink or a hard link is built once, with a warning; a dangling symlink is kept, for its
    scan to record it failed), each DICOM series once (its first file; a warning names the files); and the names
    of the slides not named by their file (a DICOM series: :func:`~wsishard.slide.dicom.series_name`), by public
    location (:func:`~wsishard.format.unique_slide_ids` takes them).

    Raises:
        OptionError: an input does not exist, or nothing that looks like a slide was found.
    """
    found: list[str] = []
    for item in inputs:
        if is_url(item):
            refuse_url_credentials(item)
            found.extend(list_slides(item, storage_options))
        elif os.path.isdir(item):
            found.extend(_walk(item))
        elif os.path.isfile(item) and item.lower().endswith(_LIST_SUFFIXES):
            found.extend(_read_list(item))
        elif os.path.isfile(item):
            found.append(item)
        else:
            raise OptionError(f"no such file or folder: {item}")
    paths = _distinct(sorted(dict.fromkeys(p if is_url(p) else os.path.normpath(p) for p in found)))
    paths, names = group_series(paths, storage_options)  # a DICOM series' files are one slide
    if not paths:
        raise OptionError(f"no slide files ({', '.join(SLIDE_SUFFIXES)}) found in: {', '.join(inputs)}")
    warn_copies(paths)
    return paths, names


def _distinct(paths: list[str]) -> list[str]:
    """``paths`` (sorted) with each file once: of the paths to one file (relative and absolute, symlinks, hard
    links) the first that is no symlink is kept (else the first), and each other is dropped with a warning."""
    same: dict[object, list[str]] = {}
    for path in paths:
        same.setdefault(_identity(path), []).append(path)
    kept = []
    for names in same.values():
        real = [p for p in names if is_url(p) or os.path.realpath(p) == os.path.abspath(p)]
        kept.append((real or names)[0])
        for other in names:
            if other != kept[-1]:
                logger.warning(
                    "%s is the same file as %s: built once, as the latter",
                    public_location(other),
                    public_location(kept[-1]),
                )
    return sorted(kept)


def _identity(path: str) -> object:
    """What tells one file from another: its device and inode (local), its URL without query string or user info
    (else: the same object presigned twice is one slide)."""
    if is_url(path):
        return public_location(path)
    try:
        st = os.stat(path)
    except OSError:  # a dangling symlink, say: its own entry (its scan records why it cannot be read)
        return os.path.abspath(path)
    return (st.st_dev, st.st_ino)


def _walk(folder: str) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (os.path.join(root, f) for f in files if f.lower().endswith(SLIDE_SUFFIXES) and f[0] != ".")


def _read_list(list_path: str) -> list[str]:
    """The slides a list file names, one a line (a UTF-8 byte-order mark, blank and ``#`` lines skipped); a line
    may be a CSV row whose first column is the path, but a whole line that is a file (``a,b.svs``) is taken whole."""
    here = os.path.dirname(list_path)
    lines = [ln.strip() for ln in read_text(list_path, list_path).splitlines()]
    return [_list_entry(line, here) for line in lines if line and not line.startswith("#")]


def _list_entry(line: str, here: str) -> str:
    """The slide a list-file line names: the whole line if it is a file or ends in a slide suffix, else its first
    CSV column (``path,label``; quotes allowed)."""
    whole, first = _listed(line, here), _listed(next(csv.reader([line]), [""])[0].strip() or line, here)
    if os.path.exists(whole) or (not os.path.exists(first) and line.lower().endswith(SLIDE_SUFFIXES)):
        return whole
    return first


def _listed(entry: str, here: str) -> str:
    """A list file's entry as a path: relative ones are relative to the list file's folder ``here``."""
    return entry if os.path.isabs(entry) or is_url(entry) else os.path.join(here, entry)


def lookup(table: Mapping[str, T], path: str) -> T | None:
    """Find ``path`` in a per-slide table keyed by path, file name, or file name without extension."""
    return next((table[key] for key in _keys(path) if key in table), None)


def _keys(path: str) -> list[str]:
    """The keys a per-slide table may list ``path`` under, in the order :func:`lookup` tries them."""
    name = os.path.basename(path)
    return list(dict.fromkeys((path, os.path.abspath(path), name, name.rsplit(".", 1)[0])))


def list_slides(url: str, storage_options: StorageOptions | None = None) -> list[str]:
    """Slide URLs under a prefix (recursive), or the URL itself when it names one object.

    Raises:
        OptionError: nothing exists at ``url``.
    """
    import fsspec.core  # not at import (CLI start-up)

    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    protocol = url.split("://", 1)[0]
    if fs.isfile(root):
        return [url]
    if not fs.exists(root):
        raise OptionError(f"no such object or prefix: {url}")
    found = [p for p in fs.find(root) if p.lower().endswith(SLIDE_SUFFIXES) and "/." not in p]
    return [f"{protocol}://{p}" for p in sorted(found)]


def check_output(output: str) -> None:
    """``output`` is a folder, or a local path where one can be made (not a file, nor under one), or an URL.

    Raises:
        OptionError: ``output`` or its nearest existing parent is not a folder.
    """
    if is_url(output):
        return
    probe = os.path.abspath(output)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        where = "exists and is not a folder" if probe == os.path.abspath(output) else f"{probe} is not a folder"
        raise OptionError(f"-o {output}: {where}")


# ---- per-slide tables ------------------------------------------------------------------------------------

_HEADER_SLIDE = {"slide", "slide_id", "slide_name", "file", "filename", "file_name", "path", "name", "image", "id"}
_HEADER_LABEL = {"label", "labels", "class", "class_name", "y", "target"}
_INTEGER = re.compile(r"[+-]?[0-9]+")  # ASCII digits only: int() takes any script's digits
_SHOWN = 5  # names listed in one message; the rest are counted


def read_table(path: str, what: str) -> dict[str, str]:
    """A two-column CSV (slide, value), with or without a header line, as a dict.

    Raises:
        OptionError: the file cannot be read, a line lacks its value, or a slide is listed twice.
    """
    return {slide: value for _, slide, value in _rows(path, what)}


def _rows(path: str, what: str) -> list[tuple[int, str, str]]:
    """``(line number, slide, value)`` of every line of a table but blank and ``#`` lines, cells stripped."""
    rows: list[tuple[int, str, str]] = []
    seen: dict[str, int] = {}
    noun = {"--labels": "label", "--mpp-csv": "mpp"}.get(what, "value")
    reader = csv.reader(io.StringIO(read_text(path, f"{what} {path}"), newline=""))
    for row in reader:
        if not row or not row[0].strip() or row[0].startswith("#"):
            continue
        line = reader.line_num
        if len(row) < 2:
            raise OptionError(f"{what} {path}: every line needs two columns: slide,{noun}")
        extra = [c.strip() for c in row[2:] if c.strip()]  # an empty trailing cell ("a.svs,1,") is no column
        if extra:
            raise OptionError(
                f"{what} {path}: line {line} has {len(row)} columns ({extra[0]!r} after the {noun}): "
                f"need two, slide,{noun}"
            )
        slide, value = row[0].strip(), row[1].strip()
        if not value:
            raise OptionError(f"{what} {path}: {slide!r} (line {line}) has no value")
        if slide in seen:
            raise OptionError(f"{what} {path}: {slide!r} is listed twice (lines {seen[slide]} and {line})")
        if any(c.isdigit() and not c.isascii() for c in value):  # int("\u0663") is 3, float() takes them too
            raise OptionError(
                f"{what} {path}: {noun} {value!r} of {slide!r} (line {line}) is written with digits other than "
                "ASCII digits 0-9: write it with 0-9"
            )
        seen[slide] = line
        rows.append((line, slide, value))
    return rows


_BOMS = (  # longest first: UTF-32-LE's mark begins with UTF-16-LE's
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)


def read_text(path: str, what: str) -> str:
    """A small text file (a table, a list of slides): UTF-8, or UTF-8/16/32 after its byte-order mark (which is
    dropped). ``what`` starts the error messages.

    Raises:
        OptionError: unreadable, not UTF-8 without a mark (naming the byte and line), or holding NUL characters
            (UTF-16 without a mark, most likely).
    """
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise OptionError(f"cannot read {what}: {exc.strerror}") from exc
    encoding = next((name for bom, name in _BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise OptionError(
            f"{what}: not {encoding.upper().removesuffix('-SIG')} text (byte {column} of line {line} is "
            f"{data[exc.start]:#04x}): an encoding problem; save it as UTF-8"
        ) from None
    if "\0" in text:
        raise OptionError(f"{what}: holds NUL bytes: UTF-16 without a byte-order mark? save it as UTF-8")
    return text.removeprefix("\ufeff")


def mpp_table(path: str) -> dict[str, float]:
    """``slide,mpp`` lines (an optional header line first) as slide -> level-0 mpp.

    Raises:
        OptionError: unreadable, no mpp at all, a slide listed twice, or an mpp that is not a number, not finite, or not
            above 0 and below :data:`~wsishard.builder.options.values.MAX_MPP` (naming the slide, line and value).
    """
    out = {}
    for i, (line, slide, value) in enumerate(_rows(path, "--mpp-csv")):
        try:
            mpp = float(value)
        except ValueError:
            if i == 0:  # only the first line may be a header
                continue
            raise OptionError(f"--mpp-csv {path}: mpp of {slide!r} is not a number") from None
        if not valid_mpp(mpp):
            raise OptionError(f"--mpp-csv {path}: mpp of {slide!r} (line {line}) is {value}: need {MPP_RULE}")
        out[slide] = mpp
    if not out:
        raise OptionError(f"--mpp-csv {path}: no slide,mpp line (the file is empty, or only a header or comments)")
    return out


def label_table(path: str) -> tuple[dict[str, int], list[str]]:
    """``slide,label`` lines (an optional header line first): integer labels as they are, or class names
    numbered in sorted order (the names are returned too, for the manifest).

    Raises:
        OptionError: unreadable, no label at all, a line without a label, a slide listed twice, integers mixed with
            names (naming the lines that differ from the rest), or an integer outside 0..2**63-1.
    """
    rows = _rows(path, "--labels")
    if rows and _is_header(rows[0][1], rows[0][2]):
        rows = rows[1:]
    if not rows:
        raise OptionError(f"--labels {path}: no slide,label line (the file is empty, or only a header or comments)")
    integers = [r for r in rows if _INTEGER.fullmatch(r[2])]
    if integers and len(integers) < len(rows):
        names = [r for r in rows if not _INTEGER.fullmatch(r[2])]
        odd = names if len(names) <= len(integers) else integers
        shown = "; ".join(f"line {line}: {slide},{value}" for line, slide, value in odd[:_SHOWN])
        more = f" (and {len(odd) - _SHOWN} more)" if len(odd) > _SHOWN else ""
        raise OptionError(
            f"--labels {path}: integer labels mixed with class names (use one or the other): {shown}{more}"
        )
    for line, slide, value in integers:
        if not valid_label(int(value)):
            raise OptionError(
                f"--labels {path}: label {value} of {slide!r} (line {line}) is not in 0..2**63-1 "
                "(int64; negative labels are kept for unlabelled samples)"
            )
    if integers:
        return {slide: int(value) for _, slide, value in rows}, []
    classes = sorted({value for _, _, value in rows})
    number = {name: i for i, name in enumerate(classes)}
    return {slide: number[value] for _, slide, value in rows}, classes


def _is_header(slide: str, value: str) -> bool:
    """A first line that names the columns (``slide,label``, ``slide_id,class``, ...) rather than a slide."""
    if slide.lower().endswith(SLIDE_SUFFIXES) or _INTEGER.fullmatch(value):
        return False
    return slide.lower() in _HEADER_SLIDE or value.lower() in _HEADER_LABEL


# ---- tables against the slides found ---------------------------------------------------------------------


def check_tables(paths: Sequence[str], options: BuildOptions) -> list[str]:
    """Check the per-slide tables of ``options`` against the slides found, before any work starts; log and
    return the warnings: table names that match no slide (``labels`` and ``mpp_overrides``), and slides without
    a label when some slides have one (they are unlabelled: no ``.cls``, label -1 when streamed).

    Raises:
        OptionError: a slide matched under two names in one table, or (``require_labels``) a slide without a
            label.
    """
    warnings: list[str] = []
    if options.labels or options.require_labels:
        missing, unknown = _match(paths, options.labels, "--labels")
        if missing and options.require_labels:
            raise OptionError(
                f"--require-labels: {len(missing)} of {len(paths)} slides have no label in --labels: {_few(missing)}"
            )
        warnings += [_unknown("--labels", unknown)] if unknown else []
        if missing:
            warnings.append(
                f"--labels: {len(missing)} of {len(paths)} slides have no label (no .cls; label -1 when "
                f"streamed): {_few(missing)}"
            )
    if options.mpp_overrides:
        _, unknown = _match(paths, options.mpp_overrides, "--mpp-csv")
        warnings += [_unknown("--mpp-csv", unknown)] if unknown else []
    for warning in warnings:
        logger.warning("%s", warning)
    return warnings


def _match(paths: Sequence[str], table: Mapping[str, object], what: str) -> tuple[list[str], list[str]]:
    """The slides ``table`` has no entry for (their file names), and the table's names that match no slide.

    Raises:
        OptionError: a slide is in the table under two names (say ``a.svs`` and ``a``), or one name matches two
            slides (``a`` for ``x/a.svs`` and ``y/a.svs``: list them by path).
    """
    missing: list[str] = []
    used: dict[str, str] = {}
    for path in paths:
        keys = [key for key in _keys(path) if key in table]
        if len(keys) > 1:
            raise OptionError(f"{what}: {os.path.basename(path)} is listed twice: as {keys[0]!r} and {keys[1]!r}")
        if keys and keys[0] in used:
            raise OptionError(
                f"{what}: {keys[0]!r} matches two slides, {public_location(used[keys[0]])} and "
                f"{public_location(path)}: name each by its "
                "path (or by a file name that is unique)"
            )
        used.update((key, path) for key in keys)
        if not keys:
            missing.append(os.path.basename(path))
    return missing, [key for key in table if key not in used]


def _unknown(what: str, names: list[str]) -> str:
    plural = "names match" if len(names) > 1 else "name matches"
    return f"{what}: {len(names)} slide {plural} no input slide: {_few(names)}"


def _few(names: Sequence[str]) -> str:
    """``a, b, c``; past :data:`_SHOWN` names, ``a, b, c, d, e and 7 more``."""
    shown = ", ".join(names[:_SHOWN])
    return f"{shown} and {len(names) - _SHOWN} more" if len(names) > _SHOWN else shown
