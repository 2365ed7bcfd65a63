"""MkDocs hooks: pages generated when the site is built.

- ``reference/cli.md``: every ``wsishard`` command and flag, from the argument parser itself (never by hand), and
  every key of a build's config file, from the option declarations (as ``inspect --options`` writes them).
- ``performance.md``: the latest saved run of each benchmark script, from ``benchmarks/results/*.json``.
- ``changelog.md``: the repository's ``CHANGELOG.md``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CLI_MARK = "<!-- cli-reference -->"
RESULTS_MARK = "<!-- benchmark-results -->"
CHANGELOG_MARK = "<!-- changelog -->"
CONFIG_MARK = "<!-- config-keys -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill a page's generated part in (MkDocs calls this for every page)."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_markdown())
    if RESULTS_MARK in markdown:
        markdown = markdown.replace(RESULTS_MARK, results_markdown(RESULTS))
    if CHANGELOG_MARK in markdown:
        text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
        markdown = markdown.replace(CHANGELOG_MARK, text.split("\n", 1)[1])  # without its own title
    return markdown


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps subcommands on its subparsers action
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    lines: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS]
        actions = [a for a in actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
        if not actions:
            continue
        title = {"positional arguments": "arguments", "options": "options"}.get(group.title or "", group.title)
        lines += ["", f"**{_cell(title or '')}**", "", "| flag | value | what it does |", "|---|---|---|"]
        for a in actions:
            flags = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
            takes = a.nargs != 0 and not isinstance(a, argparse._StoreTrueAction | argparse._StoreFalseAction)
            value = ""
            if takes and a.option_strings:
                value = "`" + ("|".join(map(str, a.choices)) if a.choices else str(a.metavar or a.dest.upper())) + "`"
            elif a.nargs == "+":
                value = "one or more"
            shown = a.help or ""
            if a.option_strings and a.default not in (None, argparse.SUPPRESS, False, []) and "(default" not in shown:
                shown += f" (default: {a.default})"
            lines.append(f"| {flags} | {value.replace('|', chr(92) + '|')} | {_cell(shown)} |")
    return lines


def cli_markdown() -> str:
    """The CLI reference: each command's usage, description and every flag, grouped as ``--help`` groups them."""
    from wsishard.cli import parser

    os.environ["COLUMNS"] = "100"  # a stable usage line
    top = parser()
    lines = [f"`wsishard` {_cell(top.description or '')}", ""]
    lines += _flag_rows(top)
    for name, sub in _subcommands(top).items():
        lines += ["", f"## wsishard {name}", "", "```text", sub.format_usage().strip(), "```", ""]
        lines.append(_cell(sub.description or ""))
        lines += _flag_rows(sub)
    return "\n".join(lines) + "\n"


def config_markdown() -> str:
    """Every key of a build's config file: its table, its flag, and its default as the file spells it (the file
    ``inspect --options`` writes for a build with every default, read back line by line)."""
    from wsishard.builder.config import config_keys, options_toml
    from wsishard.builder.keywords import option_flag
    from wsishard.builder.options import BuildOptions
    from wsishard.builder.records import options_dict

    shown: dict[tuple[str, str], str] = {}
    table = ""
    for line in options_toml(options_dict(BuildOptions())).splitlines():
        if line.startswith("["):
            table = line.strip("[]")
        elif " = " in line and not line.startswith("#"):
            key, value = line.split(" = ", 1)
            shown[table, key] = value
    lines = ["| table | key | flag | default |", "|---|---|---|---|"]
    for name, keys in config_keys().items():
        for key, (_, f) in keys.items():
            default = _cell(shown.get((name, key), ""))
            lines.append(f"| `[{name}]` | `{key}` | `{option_flag(f)}` | `{default}` |")
    return "\n".join(lines) + "\n"


def results_markdown(folder: Path) -> str:
    """The latest saved run of each benchmark: what ran, where, and the tables the script printed."""
    files = sorted(folder.glob("*.json"))
    if not files:
        return "No benchmark results saved yet: run a script under `scripts/` (it saves under `benchmarks/results/`).\n"
    parts = []
    for path in files:
        run = json.loads(path.read_text(encoding="utf-8"))
        parts += [f"## {_cell(run.get('title') or run['benchmark'])}", ""]
        parts.append(f"`{_cell(run['command'])}`, {_cell(run.get('when', ''))}, {_cell(run.get('machine', ''))}.")
        if run.get("note"):
            parts += ["", _cell(run["note"])]
        parts += ["", run["output_md"].strip(), ""]
        parts.append(f"Raw results: `benchmarks/results/{path.name}`.")
        parts.append("")
    return "\n".join(parts)
