"""The build's options as flat keywords, one per ``wsishard build`` flag.

Every option field whose ``metadata`` has ``help`` is a flag of ``wsishard build``, a keyword of
:func:`wsishard.build` and a key of a build's config file (:mod:`wsishard.builder.options.config`): ``--patch-size`` is
``patch_size=``, ``--min-tissue`` is ``min_tissue=``, a flag that turns a default-on option off (``--no-fast-path``)
is the option's own name (``fast_path=False``), and any other on/off flag is True when given
(``--keep-dark-artefacts`` is ``keep_dark_artefacts=True``). The keyword takes the Python value of the field; where
the flag reads a file or a text (``--mpp-csv``, ``--labels``, ``--shard-size``, ``--roi-labels``) the keyword takes
that same text or path too.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import Field
from typing import TYPE_CHECKING, Any

from wsishard.builder.inputs.sources import label_table, mpp_table
from wsishard.builder.options.tissueopts import parse_names
from wsishard.builder.options.values import context_mpps
from wsishard.errors import OptionError

if TYPE_CHECKING:  # the options map their keywords through this module
    from wsishard.builder.options.buildopts import BuildOptions

OPTION_GROUPS = {  # "group" in a field's metadata -> its --help section (and config-file table), in the order shown
    "patches": "patches",
    "resolution": "resolution",
    "tissue": "tissue detection (Otsu on a low-resolution view; lengths in microns)",
    "artefacts": "ink, dark artefacts and pigment (found on the tissue-detection view; dark pigment is tissue)",
    "roi": "annotation regions (GeoJSON polygons in level-0 px, as QuPath exports them)",
    "output": "output",
    "run": "run",
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def option_fields(cls: Any, prefix: str = "", group: str = "") -> Iterator[tuple[str, str, Field[Any]]]:
    """``(dest, group, field)`` for every option field with a ``build`` flag, in declared order.

    A field has a flag when its ``metadata`` has ``help``; the metadata may also name ``flag`` (default:
    ``--field-name``, or ``--no-field-name`` for a field that defaults to True, which the flag turns off),
    ``metavar`` (default: FIELD_NAME), ``parse`` (how the flag's text is read; default ``str``), ``choices``,
    ``group`` (the help section; nested option classes give theirs on the field holding them), ``fills`` (names
    of the fields the parsed tuple is spread over), ``with_others`` (the flag's value is checked with the other
    options once all flags are read, not alone) and ``old_flags`` (former spellings, still accepted with a
    one-line deprecation warning). Defaults come from the field and nowhere else.
    """
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            yield from option_fields(f.default_factory, f"{prefix}{f.name}.", f.metadata["group"])
        elif "help" in f.metadata:
            yield prefix + f.name, f.metadata.get("group", group), f


def option_flag(f: Field[Any]) -> str:
    """The command-line flag of an option field (see :func:`option_fields`)."""
    name = f.name.replace("_", "-")
    return f.metadata.get("flag") or (f"--no-{name}" if f.default is True else f"--{name}")


def option_keyword(f: Field[Any]) -> str:
    """The keyword of an option field: its flag without the dashes (``--patch-size`` -> ``patch_size``), and
    without ``no-`` for a flag that turns a default-on option off (``--no-qc`` -> ``qc``, given ``qc=False``)."""
    flag = option_flag(f)[2:]
    if f.default is True and flag.startswith("no-"):
        flag = flag[3:]
    return flag.replace("-", "_")


def flips(f: Field[Any]) -> bool:
    """Whether the keyword of a default-on field is the negation of the field: its flag turns the option off and is
    not spelt ``--no-<field>`` (``keep_dark_artefacts=True`` is ``dark_filter=False``)."""
    return f.default is True and not option_flag(f).startswith("--no-")


def keywords(cls: Any) -> dict[str, tuple[str, Field[Any]]]:
    """Every keyword of the option class ``cls`` -> ``(dest, field)``, in the flags' declared order."""
    return {option_keyword(f): (dest, f) for dest, _, f in option_fields(cls)}


def size_bytes(text: str) -> int:
    """``512MB`` -> 512000000, ``1GiB`` -> 1073741824, ``100k`` -> 100000, ``4096`` -> 4096.

    Raises:
        OptionError: (a ``ValueError``) not a size.
    """
    match = _SIZE.match(text)
    if not match:
        raise OptionError(f"not a size: {text!r} (examples: 512MB, 1GiB, 100000)")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    try:
        return int(float(number) * base ** " kmgt".index(unit.lower() or " "))
    except OverflowError:  # 1e400: float infinity
        raise OptionError(f"not a size: {text!r}") from None


def format_size(n: int) -> str:
    """The shortest spelling :func:`size_bytes` reads back: 256000000 -> ``256MB``, 4096 -> ``4096``."""
    power = next((p for p in (4, 3, 2, 1) if n % 1000**p == 0), 0)
    return f"{n // 1000**power}{' kMGT'[power]}B" if power else str(n)


def label_value(value: Any) -> tuple[dict[str, int], tuple[str, ...]]:
    """``labels`` and ``--labels``: the label table and its class names (spread over ``labels`` and ``label_names``)
    from a CSV path, or from a mapping of slide -> integer or class name (names numbered in sorted order, as the
    CSV's are)."""
    if isinstance(value, str | os.PathLike):
        table, names = label_table(os.fspath(value))
        return table, tuple(names)
    if not isinstance(value, Mapping):
        raise OptionError(f"invalid labels: {value!r} (need a CSV path or a mapping of slide -> label)")
    given = dict(value)
    if given and all(isinstance(v, str) for v in given.values()):
        classes = tuple(sorted(set(given.values())))
        return {slide: classes.index(name) for slide, name in given.items()}, classes
    return given, ()


def _value(dest: str, f: Field[Any], value: Any) -> list[tuple[str, Any]]:
    """``(field name, value)`` pairs the keyword's value gives, texts and paths read as the flag reads them."""
    parse = f.metadata.get("parse")
    if flips(f) and isinstance(value, bool):
        value = not value
    elif parse == "size" and isinstance(value, str):
        value = size_bytes(value)
    elif parse == "names" and isinstance(value, str):
        value = parse_names(value)
    elif parse == "names" and isinstance(value, list | tuple):
        value = tuple(value)
    elif parse == "mpps" and isinstance(value, str | list | tuple):
        value = context_mpps(value)
    elif parse == "mpp_table" and isinstance(value, str | os.PathLike):
        value = mpp_table(os.fspath(value))
    elif parse == "label_table":
        return list(zip(f.metadata["fills"], label_value(value), strict=True))
    elif parse == "str" and isinstance(value, os.PathLike):
        value = os.fspath(value)
    return [(f.name, value)]


def with_keywords(options: BuildOptions, given: Mapping[str, Any], caller: str = "build") -> BuildOptions:
    """``options`` with the flat keywords ``given`` applied on top (``BuildOptions.from_keywords`` starts from the
    defaults).

    Raises:
        TypeError: a keyword that is no build option, naming it and the close matches.
        OptionError: (a ``ValueError``) a value the option refuses, naming it.
    """
    known = keywords(type(options))
    changes: dict[str, Any] = {}  # dest -> value
    for name, value in given.items():
        if name not in known:
            fields = {dest.rpartition(".")[2]: k for k, (dest, _) in known.items()}  # target_mpp -> mpp
            close = [fields[name]] if name in fields else difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
            hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else " (see wsishard.build's keywords)"
            raise TypeError(f"{caller}() got an unexpected keyword argument {name!r}{hint}")
        dest, f = known[name]
        prefix = dest.rpartition(".")[0]
        for field_name, v in _value(dest, f, value):
            changes[f"{prefix}.{field_name}" if prefix else field_name] = v
    return apply_changes(options, changes)


def apply_changes(obj: Any, changes: Mapping[str, Any]) -> Any:
    """``obj`` (an option dataclass) with the dotted ``changes`` applied, nested options rebuilt (and so
    validated) where they change."""
    direct = {k: v for k, v in changes.items() if "." not in k}
    for child in {k.split(".", 1)[0] for k in changes if "." in k}:
        inner = {k.split(".", 1)[1]: v for k, v in changes.items() if k.startswith(child + ".")}
        direct[child] = apply_changes(getattr(obj, child), inner)
    return dataclasses.replace(obj, **direct) if direct else obj
