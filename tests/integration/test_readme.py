"""The README's set-up commands and CI stay in step."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # tests/integration/ -> the repository


def _command_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("python3 -m venv")]


def test_ci_runs_the_readme_test_command() -> None:
    readme = _command_lines((ROOT / "README.md").read_text())
    ci = _command_lines((ROOT / ".ci" / "run").read_text())
    assert len(ci) == 1 and ci[0] in readme
    assert ci[0].endswith("pytest")


def test_readme_installs_the_pinned_cpu_torch_first() -> None:
    for line in _command_lines((ROOT / "README.md").read_text()):
        assert "pip install torch==2.13.0 && pip install -e" in line
