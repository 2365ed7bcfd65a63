"""The build's inputs: slide paths from folders, files, list files and object-storage prefixes; per-slide tables."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar

from wsishard.errors import OptionError
from wsishard.scratch import list_slides
from wsishard.slide import SLIDE_SUFFIXES
from wsishard.storage import is_url

_LIST_SUFFIXES = (".txt", ".lst", ".list", ".csv")
T = TypeVar("T")


def find_slides(inputs: Sequence[str], storage_options: Mapping[str, Any] | None = None) -> list[str]:
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
