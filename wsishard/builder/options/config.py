"""A build's options as a TOML config file: ``wsishard build --config FILE.toml`` (and ``wsishard.build(...,
config=...)``) reads one; ``wsishard inspect OUT --options`` writes one from the options a build recorded.

The keys are :func:`wsishard.build`'s keywords (:mod:`wsishard.builder.options.keywords`) with their Python values, in
tables named as ``wsishard build --help`` groups its flags (:data:`~wsishard.builder.options.keywords.OPTION_GROUPS`)::

    [patches]
    mpp = 0.75
    patch_size = 192

    [output]
    shard_size = "1GiB"
    labels = "labels.csv"     # or a table: [output.labels] with "slide.svs" = "tumour" lines

``"none"`` unsets an option that may be unset (``stride = "none"``: the patch size). Paths are read as the command
line reads them, relative to the working directory. An option object, then the file, then the keywords (or the
flags) given with it: each overrides what comes before.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import Field
from typing import Any

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.keywords import (
    OPTION_GROUPS,
    flips,
    format_size,
    option_fields,
    option_keyword,
    with_keywords,
)
from wsishard.errors import OptionError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

NONE = "none"  # a config value that unsets an option (TOML has no null)
Keys = dict[str, dict[str, tuple[str, Field[Any]]]]  # table -> keyword -> (dest, field)


def config_keys() -> Keys:
    """Every config table and its keys, in ``--help`` order: ``{"patches": {"mpp": ("patch.target_mpp", field),
    ...}, ...}``."""
    tables: Keys = {group: {} for group in OPTION_GROUPS}
    for dest, group, f in option_fields(BuildOptions):
        tables[group][option_keyword(f)] = (dest, f)
    return tables


def read_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The keywords a config file gives (``{"mpp": 0.75, ...}``), each value checked for its kind.

    Raises:
        OptionError: (a ``ValueError``) one line naming the file and what is wrong: it cannot be read or is not TOML,
            an unknown table or key (with the closest known one), a key in another option's table, a value of the
            wrong kind.
    """
    name = os.fspath(path)
    try:
        with open(name, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise OptionError(f"config {name}: cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OptionError(f"config {name}: not a TOML file: {exc}") from None
    except UnicodeDecodeError:
        raise OptionError(f"config {name}: not a TOML file: not UTF-8 text") from None
    tables, given = config_keys(), {}
    for table, body in data.items():
        if table not in tables or not isinstance(body, dict):
            raise OptionError(f"config {name}: {_not_a_table(table, tables)}")
        for key, value in body.items():
            if key not in tables[table]:
                raise OptionError(f"config {name}: {_unknown_key(table, key, tables)}")
            given[key] = _checked(table, key, tables[table][key][1], value, name)
    return given


def _home(key: str, tables: Keys) -> str | None:
    return next((table for table, keys in tables.items() if key in keys), None)


def _not_a_table(table: str, tables: Keys) -> str:
    if _home(table, tables) is not None:
        return f"key {table!r} belongs in table [{_home(table, tables)}]"
    close = difflib.get_close_matches(table, list(tables), n=1, cutoff=0.6)
    hint = f"; did you mean [{close[0]}]?" if close else f" (tables: {', '.join(tables)})"
    return f"unknown table {_shown(table)}{hint}"


def _shown(value: Any) -> str:
    """``value`` for an error line: its repr (control characters escaped), cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _unknown_key(table: str, key: str, tables: Keys) -> str:
    home = _home(key, tables)
    if home is not None:
        return f"key {key!r} belongs in table [{home}], not [{table}]"
    fields = {dest.rpartition(".")[2]: k for keys in tables.values() for k, (dest, _) in keys.items()}
    if key in fields:  # a field name: target_mpp -> mpp
        close = [fields[key]]
    else:
        close = difflib.get_close_matches(key, [k for keys in tables.values() for k in keys], n=1, cutoff=0.6)
    if not close:
        return f"unknown key {_shown(key)} in [{table}] (wsishard build --help lists the options)"
    where = "" if _home(close[0], tables) == table else f" in [{_home(close[0], tables)}]"
    return f"unknown key {_shown(key)} in [{table}]; did you mean {close[0]!r}{where}?"


def _checked(table: str, key: str, f: Field[Any], value: Any, name: str) -> Any:
    """``value`` as the keyword takes it (an integer where a number is wanted is that number as a float, "none"
    unsets an option that may be unset), or an :class:`OptionError` naming the key and what it needs."""
    kind = str(f.type)
    if value == NONE and "None" in kind:
        return None
    parse, need = f.metadata.get("parse"), None
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if isinstance(f.default, bool):
        need = None if isinstance(value, bool) else "true or false"
    elif parse in ("mpp_table", "label_table"):
        need = None if isinstance(value, str) or _table_of(value, parse) else "a CSV path or a table of slide = value"
    elif "nargs" in f.metadata and isinstance(value, list):  # mpp = [0.5, 1.0, 2.0]
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        need, value = (None, [float(v) for v in value]) if numbers else ("numbers", value)
    elif parse in ("names", "mpps"):
        need = None if isinstance(value, str | list) else "a list or a comma-separated text"
    elif parse == "size":
        need = None if is_int or isinstance(value, str) else 'a number of bytes or a size such as "1GiB"'
    elif kind.startswith("float"):
        need = None if is_int or isinstance(value, float) else "a number"
        value = float(value) if need is None else value
    elif kind.startswith("int"):
        need = None if is_int else "an integer"
    elif not isinstance(value, str):
        need = "a text"
    if need is not None:
        optional = f' or "{NONE}"' if "None" in kind else ""
        raise OptionError(f"config {name}: [{table}] {key} = {_shown(value)}: need {need}{optional}")
    return value


def _table_of(value: Any, parse: str) -> bool:
    """Whether ``value`` is a table of slide = mpp (numbers) or slide = label (integers or class names)."""
    kinds = (int, float) if parse == "mpp_table" else (int, str)
    return isinstance(value, dict) and all(isinstance(v, kinds) and not isinstance(v, bool) for v in value.values())


def with_config(options: BuildOptions | None, path: str | os.PathLike[str]) -> BuildOptions:
    """``options`` (default: every default) with the config file at ``path`` applied on top.

    Raises:
        OptionError: (a ``ValueError``) as :func:`read_config`, or a value the option refuses, naming the file.
    """
    given = read_config(path)
    try:
        return with_keywords(options or BuildOptions(), given)
    except OptionError as exc:
        raise OptionError(f"config {os.fspath(path)}: {exc}{_key_of(str(exc), given)}") from None


def _key_of(message: str, given: Mapping[str, Any]) -> str:
    """`` (key 'format' in [output])`` where an option's error names its field (``invalid image_format: ...``) and
    the file set it under another name."""
    field_name = message.removeprefix("invalid ").partition(":")[0]
    for table, keys in config_keys().items():
        for key, (dest, _) in keys.items():
            if key in given and dest.rpartition(".")[2] == field_name and key != field_name:
                return f" (key {key!r} in [{table}])"
    return ""


Inputs = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]  # a slide path, a folder, a list, ...


def build_arguments(
    inputs: Inputs,
    output: str | os.PathLike[str],
    options: BuildOptions | None,
    keywords: Mapping[str, Any],
    config: str | os.PathLike[str] | None = None,
) -> tuple[list[str], str, BuildOptions]:
    """``build``'s inputs as a list of paths (one path alone is one input), its output as a path, and its options:
    ``options``, then the config file, then the flat keywords."""
    sources = [os.fspath(inputs)] if isinstance(inputs, str | os.PathLike) else [os.fspath(i) for i in inputs]
    base = with_config(options, config) if config is not None else options or BuildOptions()
    return sources, os.fspath(output), with_keywords(base, keywords) if keywords else base


def options_toml(record: Mapping[str, Any], header: Sequence[str] = ()) -> str:
    """The config file that repeats a build: every option of ``record`` (a manifest's ``options``) under its
    keyword, in its table, after ``header``'s comment lines. What the file cannot set (an option the build recorded
    but no keyword takes) is named in a closing comment."""
    lines = [f"# {line}" for line in header]
    for table, keys in config_keys().items():
        plain, tables = [], []
        for key, (dest, f) in keys.items():
            found, value = _recorded(record, dest)
            if not found:
                plain.append(f"# {key}: not recorded by this build")
                continue
            value = _keyword_value(record, f, value)
            if isinstance(value, dict) and value:
                tables += ["", f"[{table}.{key}]", *(f"{_toml(k)} = {_toml(v)}" for k, v in value.items())]
            else:
                plain.append(f"{key} = {_toml(value)}")
        lines += ["", f"[{table}]", *plain, *tables]
    unset = _not_settable(record)
    if unset:
        lines += ["", "# recorded, but no key of this file sets it (the build chose it, or BuildOptions set it):"]
        lines += [f"#   {dest} = {_toml(value)}" for dest, value in unset]
    return "\n".join(lines).lstrip("\n") + "\n"


def _recorded(record: Mapping[str, Any], dest: str) -> tuple[bool, Any]:
    node: Any = record
    for part in dest.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _keyword_value(record: Mapping[str, Any], f: Field[Any], value: Any) -> Any:
    """A recorded field's value as its keyword takes it."""
    parse = f.metadata.get("parse")
    if value is None:
        return NONE
    if flips(f):
        return not value
    if parse == "size" and isinstance(value, int):
        return format_size(value)
    if parse == "label_table":  # class names where the build had them, numbered in sorted order again
        names = record.get("label_names") or []
        return {slide: names[label] if names else label for slide, label in value.items()}
    if f.name == "context_size" and value == _recorded(record, "patch.patch_size_px")[1]:
        return NONE  # recorded resolved; unset follows the patch size, as the build did
    if str(f.type).startswith("float"):
        return [float(v) for v in value] if isinstance(value, list) else float(value)
    return value


def _not_settable(record: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """``(dest, value)`` of the recorded options no key sets whose value is not their default."""
    keyed = {dest for dest, _, _ in option_fields(BuildOptions)} | {"label_names"}
    defaults = json.loads(json.dumps(dataclasses.asdict(BuildOptions())))
    out = []
    for dest in _dests(BuildOptions):
        found, value = _recorded(record, dest)
        if dest not in keyed and found and value != _recorded(defaults, dest)[1]:
            out.append((dest, value))
    return out


def _dests(cls: Any, prefix: str = "") -> list[str]:
    """Every option field of ``cls`` as a dotted path (``patch.block_patches``)."""
    out: list[str] = []
    for f in dataclasses.fields(cls):
        nested = dataclasses.is_dataclass(f.default_factory)
        out += _dests(f.default_factory, f"{prefix}{f.name}.") if nested else [prefix + f.name]
    return out


def _toml(value: Any) -> str:
    """``value`` (bool, number, text, list or empty table) as a TOML value."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # floats too: repr round-trips, and TOML reads inf and nan as Python writes them
    if isinstance(value, str):  # a JSON string is a TOML basic string, once DEL is escaped too
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict) and not value:
        return "{}"
    raise TypeError(f"no TOML spelling for {value!r}")
