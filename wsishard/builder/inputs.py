"""The build's inputs: slide paths from folders, files, list files and object-storage prefixes; per-slide tables
(``slide,value`` CSV files: mpp overrides, labels)."""

from __future__ import annotations

import csv
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import TypeVar

import fsspec

from wsishard.errors import OptionError
from wsishard.slide import SLIDE_SUFFIXES
from wsishard.storage.urls import StorageOptions, is_url

_LIST_SUFFIXES = (".txt", ".lst", ".list", ".csv")
T = TypeVar("T")


def find_slides(inputs: Sequence[str], storage_options: StorageOptions | None = None) -> list[str]:
    """Slide files from folders (recursive), slide files, text files listing slides (one per line), and URLs
    (``s3://bucket/slides/``: every slide under the prefix; or one object).

    Raises:
        OptionError: an input does not exist, or nothing that looks like a slide was found.
    """
    found: list[str] = []
    for item in inputs:
        if is_url(item):
            found.extend(list_slides(item, storage_options))
        elif os.path.isdir(item):
            found.extend(_walk(item))
        elif os.path.isfile(item) and item.lower().endswith(_LIST_SUFFIXES):
            found.extend(_read_list(item))
        elif os.path.isfile(item):
            found.append(item)
        else:
            raise OptionError(f"no such file or folder: {item}")
    paths = sorted(dict.fromkeys(p if is_url(p) else os.path.normpath(p) for p in found))
    if not paths:
        raise OptionError(f"no slide files ({', '.join(SLIDE_SUFFIXES)}) found in: {', '.join(inputs)}")
    return paths


def _walk(folder: str) -> Iterator[str]:
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (os.path.join(root, f) for f in files if f.lower().endswith(SLIDE_SUFFIXES) and f[0] != ".")


def _read_list(list_path: str) -> list[str]:
    here = os.path.dirname(list_path)
    with open(list_path, encoding="utf-8") as fh:
        lines = [ln.split(",", 1)[0].strip() for ln in fh]
    return [p if os.path.isabs(p) or is_url(p) else os.path.join(here, p) for p in lines if p and not p.startswith("#")]


def lookup(table: Mapping[str, T], path: str) -> T | None:
    """Find ``path`` in a per-slide table keyed by path, file name, or file name without extension."""
    name = os.path.basename(path)
    for key in (path, os.path.abspath(path), name, name.rsplit(".", 1)[0]):
        if key in table:
            return table[key]
    return None


def list_slides(url: str, storage_options: StorageOptions | None = None) -> list[str]:
    """Slide URLs under a prefix (recursive), or the URL itself when it names one object.

    Raises:
        OptionError: nothing exists at ``url``.
    """
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    protocol = url.split("://", 1)[0]
    if fs.isfile(root):
        return [url]
    if not fs.exists(root):
        raise OptionError(f"no such object or prefix: {url}")
    found = [p for p in fs.find(root) if p.lower().endswith(SLIDE_SUFFIXES) and "/." not in p]
    return [f"{protocol}://{p}" for p in sorted(found)]


# ---- per-slide tables ------------------------------------------------------------------------------------


def read_table(path: str, what: str) -> dict[str, str]:
    """A two-column CSV (slide, value), with or without a header line, as a dict.

    Raises:
        OptionError: the file cannot be read, or a line lacks its second column.
    """
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = [r for r in csv.reader(fh) if r and r[0].strip() and not r[0].startswith("#")]
    except OSError as exc:
        raise OptionError(f"cannot read {what} {path}: {exc.strerror}") from exc
    if any(len(r) < 2 for r in rows):
        raise OptionError(f"{what} {path}: every line needs two columns: slide,value")
    return {r[0].strip(): r[1].strip() for r in rows}


def mpp_table(path: str) -> dict[str, float]:
    """``slide,mpp`` lines (an optional header line first) as slide -> level-0 mpp.

    Raises:
        OptionError: unreadable, or an mpp that is not a number.
    """
    table = read_table(path, "--mpp-csv")
    out = {}
    for slide, value in table.items():
        try:
            out[slide] = float(value)
        except ValueError:
            if out or slide != next(iter(table)):  # only the first line may be a header
                raise OptionError(f"--mpp-csv {path}: mpp of {slide!r} is not a number") from None
    return out


def label_table(path: str) -> tuple[dict[str, int], list[str]]:
    """``slide,label`` lines: integer labels as they are; otherwise class names numbered in sorted order (the
    names are returned too, for the manifest).

    Raises:
        OptionError: unreadable, or a line without a label.
    """
    table = read_table(path, "--labels")
    first = next(iter(table), None)
    if first is not None and table[first].lower() in ("label", "class", "y") and not first.endswith(".svs"):
        table.pop(first)
    if all(re.fullmatch(r"-?\d+", v) for v in table.values()):
        return {k: int(v) for k, v in table.items()}, []
    names = sorted(set(table.values()))
    return {k: names.index(v) for k, v in table.items()}, names
