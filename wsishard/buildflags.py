"""The build's command-line flags, derived from the option dataclasses (:mod:`wsishard.builder.options.buildopts`): each
field's flag, help, value type and default come from the field and its metadata, and a value the option class
refuses is refused as a usage error naming the flag. :func:`build_options` turns the parsed flags back into
:class:`~wsishard.builder.options.buildopts.BuildOptions`, over the ``--config`` file's
(:mod:`wsishard.builder.options.config`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import Field
from typing import Any

from wsishard import cliargs
from wsishard.builder.inputs.sources import mpp_table
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.config import with_config
from wsishard.builder.options.keywords import OPTION_GROUPS, apply_changes, label_value, option_fields, option_flag
from wsishard.builder.options.tissueopts import parse_names
from wsishard.builder.options.values import context_mpps
from wsishard.cliargs import format_size, parse_size
from wsishard.deprecation import OldFlag, add_old_flag
from wsishard.errors import OptionError

# What an option field's metadata may name in "parse": reads its flag's value (argparse.ArgumentTypeError or
# OptionError refuse it).
_PARSE: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": cliargs.int_,
    "positive_int": cliargs.positive(int),
    "positive_float": cliargs.positive(float),
    "non_negative": cliargs.non_negative,
    "non_negative_int": cliargs.non_negative_int,
    "fraction": cliargs.fraction,
    "size": parse_size,
    "degrees": cliargs.degrees,
    "names": parse_names,
    "mpp_table": mpp_table,
    "label_table": label_value,
    "mpps": context_mpps,
}
_SHOW: dict[str, Callable[[Any], str]] = {"size": format_size}  # how a default is shown, by "parse" (else str)


def _owner(dest: str, cls: Any = BuildOptions) -> Any:
    """The option class holding the field at ``dest`` (``patch.patch_size_px`` -> :class:`PatchOptions`)."""
    for name in dest.split(".")[:-1]:
        cls = next(f.default_factory for f in dataclasses.fields(cls) if f.name == name)
    return cls


def _flag_type(parse: Callable[[str], Any], owner: Any, f: Field[Any]) -> Callable[[str], Any]:
    """An argparse ``type``: ``parse``, then (with ``owner``, the field's option class) the class's own validation
    of the value: the flag refuses what the class refuses, as a usage error naming the flag."""

    def check(text: str) -> Any:
        try:
            value = parse(text)
            fills = f.metadata.get("fills")
            if owner is not None:
                owner(**(dict(zip(fills, value, strict=True)) if fills else {f.name: value}))
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check


def add_option(group: Any, dest: str, f: Field[Any], owner: Any = None) -> None:
    """Add the flag of option field ``f``; with ``owner`` (its option class) a value the class refuses is refused."""
    meta, default = f.metadata, f.default
    shown = default not in (None, dataclasses.MISSING, ()) and not isinstance(default, bool)  # () and None: none
    help_text = meta["help"]
    if shown and "(default" not in help_text:
        help_text += f" (default: {_SHOW.get(meta.get('parse', ''), str)(default)})"
    kw: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": help_text}  # absent: field default
    if isinstance(default, bool):
        kw["action"] = "store_false" if default else "store_true"
    else:
        choices = meta.get("choices")
        metavar = meta.get("metavar", None if choices else f.name.upper())
        check = None if choices or meta.get("with_others") else owner  # choices: argparse's "invalid choice" says it
        # best; with_others: BuildOptions checks the value with the other flags' (_options)
        kw.update(type=_flag_type(_PARSE[meta.get("parse", "str")], check, f), choices=choices, metavar=metavar)
        if "nargs" in meta:  # --mpp 0.5 1.0 2.0: a list (one value alone: that value, as before)
            kw["nargs"] = meta["nargs"]
    group.add_argument(option_flag(f), **kw)
    for old in meta.get("old_flags", ()):
        add_old_flag(group, old, option_flag(f), kw, flips=isinstance(default, bool))


def build_options(args: argparse.Namespace) -> BuildOptions:
    """The build options the parsed flags give, over the ``--config`` file's; a field that neither sets keeps its
    dataclass default.

    Raises:
        OptionError: (a ``ValueError``) the config file's (:func:`~wsishard.builder.options.config.read_config`), or a
            flag's value that clashes with the file's (``--labels`` and the file's ``roi_labels``).
    """
    given = vars(args)
    base = BuildOptions()
    if given.get("config") is not None:
        base = with_config(None, given["config"])
    changes: dict[str, Any] = {}
    for dest, _, f in option_fields(BuildOptions):
        if dest in given:
            prefix, fills = dest.rpartition(".")[0], f.metadata.get("fills")
            for name, value in zip(fills, given[dest], strict=True) if fills else [(f.name, given[dest])]:
                changes[f"{prefix}.{name}" if prefix else name] = value
    options: BuildOptions = apply_changes(base, changes)
    return options


def add_storage_option(group: Any) -> None:
    group.add_argument(
        "--storage-option",
        type=cliargs.storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs, e.g. endpoint_url=http://127.0.0.1:9000 "
        "(credentials: the standard AWS sources, or key=... secret=...); repeatable",
    )


def add_build_flags(p: argparse.ArgumentParser) -> None:
    """The ``build`` command's arguments and flags, in their help groups."""
    p.add_argument(
        "slides",
        nargs="+",
        metavar="SLIDES",
        help="slide folders (searched recursively), slide files, or text files listing slide paths",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output folder: shards, manifest.json, qc/")
    p.add_argument(
        "--config",
        metavar="FILE.toml",
        help="build options from a TOML file: keys as wsishard.build's keywords, in tables named as the groups "
        "below ([patches], [output], ...); flags given here override it. wsishard inspect OUT --options writes "
        "the file that repeats a build",
    )
    groups = {key: p.add_argument_group(title) for key, title in OPTION_GROUPS.items()}
    for dest, group, f in sorted(option_fields(BuildOptions), key=lambda item: list(OPTION_GROUPS).index(item[1])):
        add_option(groups[group], dest, f, _owner(dest))
    groups["output"].add_argument(  # the default since 0.3: pictures drawn on demand (inspect --qc)
        "--no-qc", dest="qc", action="store_false", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    g = groups["run"]
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a build with other slides or options in OUT "
        "(without it that is refused; the same build is resumed)",
    )
    _add_cluster_flags(p)
    g.add_argument(
        "--scratch",
        metavar="DIR",
        help="local folder for copies of slides read from object storage "
        "(one slide per worker at a time, plus one group's staged patches; "
        "default: a temporary folder)",
    )
    add_storage_option(g)
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars")


def _add_cluster_flags(p: argparse.ArgumentParser) -> None:
    """``--part`` and ``--part-count`` (and the old ``--parts``)."""
    c = p.add_argument_group("cluster builds (one part of the slides per array-job task; then wsishard merge OUT)")
    c.add_argument(
        "--part",
        type=cliargs.part,
        metavar="I/N",
        help="build only part I of N (1-based) and write a part "
        "manifest. Default in an array job: from Slurm's SLURM_ARRAY_TASK_ID/_COUNT, a Kubernetes Indexed "
        "Job's JOB_COMPLETION_INDEX or AWS Batch's AWS_BATCH_JOB_ARRAY_INDEX/_SIZE",
    )
    c.add_argument(
        "--part-count",
        type=cliargs.positive(int),
        metavar="N",
        help="N, the number of parts, where the "
        "array job's environment gives only this task's index (Kubernetes Indexed Job: its "
        "completions)",
    )
    c.add_argument(
        "--parts",
        type=cliargs.positive(int),
        dest="part_count",
        metavar="N",
        help=argparse.SUPPRESS,
        action=OldFlag,
        new_flag="--part-count",
    )
