"""The docs site's generated pages: the CLI reference from the parser, the performance page from saved results."""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

from wsishard.cli import parser

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def hooks() -> ModuleType:
    return _load(ROOT / "docs" / "hooks.py", "docs_hooks")


def _flags(p: argparse.ArgumentParser) -> set[str]:
    return {s for a in p._actions if a.help != argparse.SUPPRESS for s in a.option_strings}


def test_the_cli_reference_lists_every_command_and_every_flag(hooks: ModuleType) -> None:
    text = hooks.cli_markdown()
    top = parser()
    subs = hooks._subcommands(top)
    assert set(subs) == {"build", "inspect", "verify", "merge", "demo", "embed", "export"}
    for name, sub in subs.items():
        assert f"## wsishard {name}" in text
        section = text.split(f"## wsishard {name}", 1)[1].split("\n## ", 1)[0]
        rows = set(re.findall(r"^\| (`[^|]*`)(?:, `[^|]*`)* \|", section, re.M))
        listed = set(re.findall(r"`(-[-\w]+)`", section))
        assert _flags(sub) - {"-h", "--help"} <= listed, name
        assert rows
    assert "--part-count" in text and "`--parts`" not in text  # the old spelling works, but is not offered
    assert "(default: ())" not in text and "(default: 0.5)" in text


def test_the_cli_reference_lists_every_config_key_with_its_flag_and_default(hooks: ModuleType) -> None:
    from wsishard.builder.options.config import config_keys
    from wsishard.builder.options.keywords import option_flag

    text = hooks.config_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `[")]
    assert len(rows) == sum(len(keys) for keys in config_keys().values())
    for table, keys in config_keys().items():
        for key, (_, f) in keys.items():
            assert f"| `[{table}]` | `{key}` | `{option_flag(f)}` |" in text
    assert "| `[patches]` | `mpp` | `--mpp` | `0.5` |" in text
    assert '| `[output]` | `shard_size` | `--shard-size` | `"256MB"` |' in text
    assert hooks.CONFIG_MARK in (ROOT / "docs" / "reference" / "cli.md").read_text()


def test_the_performance_page_renders_each_saved_result(hooks: ModuleType, tmp_path: Path) -> None:
    assert "No benchmark results saved yet" in hooks.results_markdown(tmp_path)
    run = {
        "benchmark": "bench_x",
        "title": "X",
        "command": "python benchmarks/bench_x.py --quick",
        "when": "today",
        "machine": "2 cores",
        "output_md": "| a | b |\n|---|---|\n| 1 | 2 |\n",
        "report": {"a": 1},
    }
    (tmp_path / "bench_x.json").write_text(json.dumps(run))
    text = hooks.results_markdown(tmp_path)
    assert text.startswith("## X\n") and "`python benchmarks/bench_x.py --quick`" in text and "| 1 | 2 |" in text
    committed = hooks.results_markdown(ROOT / "benchmarks" / "results")
    assert "## Build" in committed and "## Streaming" in committed and "0.2520 (Aperio AT2)" in committed


def test_a_benchmark_run_saves_its_tables_and_report(tmp_path: Path) -> None:
    bench = _load(ROOT / "benchmarks" / "benchkit.py", "benchkit")
    printed = 'start\nthe table:\n| a | b |\n|---|---|\n| 1 | 2 |\nmore\nJSON: {"a": 1}\n'
    path = bench.save("bench_x", printed, ["--quick"], tmp_path)
    run = json.loads(path.read_text())
    assert run["command"] == "python benchmarks/bench_x.py --quick" and run["report"] == {"a": 1}
    assert run["output_md"] == "the table:\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"


def test_the_sampling_guide_has_a_worked_example_of_each_feature() -> None:
    """Issue 27's three worked examples, each a section with its Python code: a stricter tissue threshold (select=),
    tumor/normal balanced training (weights="class") and exact validation under torchrun (pad_last=True). An edit
    for split_scan once dropped the last two."""
    text = (ROOT / "docs" / "guide" / "sampling.md").read_text()
    sections = dict(re.findall(r"^## ([^\n]+)\n(.*?)(?=^## |\Z)", text, re.M | re.S))
    for title, call in (
        ("A stricter tissue threshold without a rebuild", "select=strict"),
        ("Tumor/normal balanced training", 'weights="class"'),
        ("Exact validation under torchrun", "pad_last=True"),
    ):
        code = "".join(re.findall(r"^```python\n(.*?)^```", sections.get(title, ""), re.M | re.S))
        assert call in code and "wsishard.stream(" in code, title
    assert 'batch["valid"]' in sections["Exact validation under torchrun"]


def test_benchmarks_save_results_only_through_the_harness() -> None:
    """The performance page reads every file under benchmarks/results/ as a saved run of the harness; a script writing
    its own file there (sampling_checks.py wrote ``sampling_checks-<time>.json``) broke ``mkdocs build --strict``."""
    writers = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "scripts").glob("*.py")):
        code = "\n".join(ln.split("#", 1)[0] for ln in path.read_text().splitlines())  # comments aside
        if path.name != "benchkit.py" and re.search(r"""["']results["']""", code):
            writers.append(path.name)
    assert writers == []
    for path in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        assert "benchkit.run(" in path.read_text() or "from benchkit import run" in path.read_text(), path.name
        assert "--smoke" in path.read_text(), path.name  # tests/integration/test_benchmarks_smoke.py runs it


def test_the_performance_page_opens_with_headline_figures_drawn_from_the_saved_runs(
    hooks: ModuleType, tmp_path: Path
) -> None:
    """Issue 49: a short table and plots first (build rate against hs2p and the naive loop per scanner mpp; the
    loader against its decode floor), each figure with when and on what it was measured; method below."""
    assert "No benchmark results saved yet" in hooks.headline_markdown(tmp_path)
    text = hooks.headline_markdown(ROOT / "benchmarks" / "results")
    table = [line for line in text.splitlines() if line.startswith("| ")][1:]
    assert table and all(re.search(r"\| 20\d\d-\d\d-\d\d, \d+ cores", line) for line in table), table
    assert text.count("<svg") == 2 and "hs2p, 2 processes" in text and "decode floor (libjpeg-turbo)" in text
    rates = hooks.build_rates(ROOT / "benchmarks" / "results")
    assert "0.2520 Aperio AT2" in rates and rates["0.2520 Aperio AT2"]["wsishard, --jobs 2"] > 0
    page = (ROOT / "docs" / "performance.md").read_text()
    assert page.index(hooks.HEADLINE_MARK) < page.index("## Method") < page.index(hooks.RESULTS_MARK)
    svg = hooks.bars_svg({"a": {"x": 2.0, "y": 1.0}}, "unit")
    assert svg.count("<rect") == 4 and 'width="420.0"' in svg and 'width="210.0"' in svg  # bars to scale


def test_no_page_uses_a_deprecated_flag_except_to_name_its_replacement() -> None:
    """qc.md and tissue-and-artefacts.md said ``--max-dark`` and ``--no-dark-filter`` after their renaming: the
    parser hides such old spellings (they still work); a page may name one only beside its new name (a renames
    table's row) or where it says the old spelling is still accepted."""
    (build,) = [sub for name, sub in _subparsers(parser()).items() if name == "build"]
    hidden = {s for a in build._actions if a.help == argparse.SUPPRESS for s in a.option_strings}
    assert {"--max-dark", "--no-dark-filter", "--dark-max-value", "--max-artefact"} <= hidden
    offered = _flags(build)
    wrong = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        if page.name == "changelog.md":
            continue
        for number, line in enumerate(page.read_text().splitlines(), 1):
            named = set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line))
            explained = "old spelling" in line or "still accepted" in line
            explained |= line.startswith("|") and bool(named & offered)  # a renames table: old | new
            if named & hidden and not explained:
                wrong.append(f"{page.relative_to(ROOT)}:{number}: {sorted(named & hidden)}")
    assert not wrong, wrong


def _subparsers(top: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return {
        name: sub
        for action in top._actions
        if isinstance(action, argparse._SubParsersAction)
        for name, sub in action.choices.items()
    }
