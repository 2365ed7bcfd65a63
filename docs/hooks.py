"""MkDocs hooks: pages generated when the site is built.

- ``reference/cli.md``: every ``wsishard`` command and flag, from the argument parser itself (never by hand), and
  every key of a build's config file, from the option declarations (as ``inspect --options`` writes them).
- ``performance.md``: the headline figures (a table and two plots, inline SVG) and the latest saved run of each
  benchmark, from ``benchmarks/results/*.json``.
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
HEADLINE_MARK = "<!-- benchmark-headline -->"
CHANGELOG_MARK = "<!-- changelog -->"
CONFIG_MARK = "<!-- config-keys -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    """Fill a page's generated part in (MkDocs calls this for every page)."""
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_markdown())
    if HEADLINE_MARK in markdown:
        markdown = markdown.replace(HEADLINE_MARK, headline_markdown(RESULTS))
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
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.options.config import config_keys, options_toml
    from wsishard.builder.options.keywords import option_flag
    from wsishard.builder.run.records import options_dict

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
        return (
            "No benchmark results saved yet: run a benchmark under `benchmarks/` (it saves in `benchmarks/results/`).\n"
        )
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


def _saved(folder: Path, name: str) -> dict[str, Any] | None:
    path = folder / f"{name}.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def _where(run: dict[str, Any]) -> str:
    """When and on what a saved run was measured, in a few words: ``2026-11-26, 2 cores``."""
    cores = run.get("machine", "").split(", ")[1:2]
    gpu = [part for part in run.get("machine", "").split(", ") if "NVIDIA" in part]
    return ", ".join([run.get("when", "?")[:10], *cores, *gpu])


def _floor_rate(report: dict[str, Any], workers: int) -> float:
    """The libjpeg-turbo decode floor per worker: the geometric mean of the floors before and after the loader."""
    before, after = report[f"floor{workers}"]["turbo"], report.get(f"floor{workers}_after", {}).get("turbo")
    return float(
        before["samples_per_s"] if after is None else (before["samples_per_s"] * after["samples_per_s"]) ** 0.5
    )


def build_rates(folder: Path) -> dict[str, dict[str, float]]:
    """Patches per second per scanner mpp (``0.2520 Aperio AT2``): the build at ``--jobs 2``, hs2p (2 processes)
    where it ran, the naive loop (one core), from the saved ``bench_build`` run ({} without one)."""
    run = _saved(folder, "bench_build")
    if run is None or not run.get("report"):
        return {}
    scanners = run["report"]["config"]["scanners"]
    series = {"j2": "wsishard, --jobs 2", "hs2p": "hs2p, 2 processes", "naive": "naive loop, 1 core"}
    return {
        f"{mpp} {scanners.get(mpp, '')}".strip(): {
            name: rates[k]["patches_per_s"] for k, name in series.items() if k in rates
        }
        for mpp, rates in sorted(run["report"]["rates"].items())
    }


def loader_rates(folder: Path) -> dict[str, dict[str, float]]:
    """Samples per second per worker, the loader alone against its decode floor, 1 and 2 workers (saved
    ``bench_stream`` run; {} without one)."""
    run = _saved(folder, "bench_stream")
    if run is None or not run.get("report"):
        return {}
    r = run["report"]
    return {
        f"{w} worker{'s' if w > 1 else ''}": {
            "wsishard loader": r[f"w{w}_loader"]["per_worker"],
            "decode floor (libjpeg-turbo)": _floor_rate(r, w),
        }
        for w in (1, 2)
    }


def bars_svg(groups: dict[str, dict[str, float]], unit: str) -> str:
    """A horizontal grouped bar chart as inline SVG: one group of bars per key, one bar per series, its value
    written at its end."""
    colours = ("#3f51b5", "#ff9800", "#9e9e9e", "#4caf50")
    series = list(dict.fromkeys(name for values in groups.values() for name in values))
    top = max((v for values in groups.values() for v in values.values()), default=1.0) or 1.0
    bar, label_w, plot_w, y = 14, 150, 420, 24
    parts = []
    for i, name in enumerate(series):  # the legend
        parts.append(f'<rect x="{label_w + 170 * i}" y="4" width="10" height="10" fill="{colours[i % 4]}"/>')
        parts.append(f'<text x="{label_w + 170 * i + 14}" y="13" font-size="11">{name}</text>')
    for group, values in groups.items():
        parts.append(f'<text x="0" y="{y + bar * len(values) / 2 + 4:.0f}" font-size="12">{group}</text>')
        for name, value in values.items():
            w = plot_w * value / top
            colour = colours[series.index(name) % 4]
            parts.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar - 2}" fill="{colour}"/>')
            parts.append(f'<text x="{label_w + w + 4:.1f}" y="{y + bar - 4}" font-size="10">{value:,.0f}</text>')
            y += bar
        y += 8
    height = y + 18
    parts.append(f'<text x="{label_w}" y="{height - 4}" font-size="11">{unit}</text>')
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 60}" height="{height}" role="img" '
        f'font-family="sans-serif">' + "".join(parts) + "</svg>"
    )


def headline_markdown(folder: Path) -> str:
    """The performance page's opening: the headline figures as a table (each with when and on what it was
    measured), then the build per scanner mpp against hs2p and the naive loop, and the loader against its decode
    floor, drawn from the saved runs."""
    rows = ["| figure | measured | when, on what |", "|---|---:|---|"]
    build, stream = _saved(folder, "bench_build"), _saved(folder, "bench_stream")
    rates = build_rates(folder)
    for label, values in rates.items():
        if label.startswith("0.2520"):
            j2 = values["wsishard, --jobs 2"]
            peers = [f"{j2 / v:.1f}x {k}" for k, v in values.items() if k != "wsishard, --jobs 2"]
            rows.append(
                f"| build, default options, `--jobs 2`, {label} | {j2:,.0f} patches/s ({'; '.join(peers)}) "
                f"| {_where(build or {})} |"
            )
    loaders = loader_rates(folder)
    for label, values in loaders.items():
        ratio = values["wsishard loader"] / values["decode floor (libjpeg-turbo)"]
        rows.append(f"| loader alone, {label}, per worker / decode floor | {ratio:.2f}x | {_where(stream or {})} |")
    gpu = _saved(folder, "bench_stream_gpu")
    if gpu and gpu.get("report"):
        rows.append(
            f"| device-ready on a GPU, 2 workers | {gpu['report']['w2']['samples_per_s']:,.0f} samples/s "
            f"| {_where(gpu)} |"
        )
    if len(rows) == 2:
        return "No benchmark results saved yet.\n"
    parts = ["\n".join(rows), ""]
    if rates:
        parts += [
            "**Build rate per scanner mpp** (default options; patches per second)",
            "",
            bars_svg(rates, "patches/s"),
            "",
        ]
    if loaders:
        parts += [
            "**The loader against its decode floor** (samples per second per worker)",
            "",
            bars_svg(loaders, "samples/s per worker"),
            "",
        ]
    return "\n".join(parts)
