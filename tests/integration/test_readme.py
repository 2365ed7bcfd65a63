"""The README and the docs' quick starts, run as a reader runs them; and the README's set-up commands and CI stay in
step.

Every fenced code block of the README, of the getting-started page and of the other pages' "Quick start" sections
runs, in order, in one folder: a ``bash`` line that
sets up an environment (``python3 -m venv ...``) is checked against CI's instead of run; a ``python`` block whose
first line is ``# file: NAME`` is saved as ``NAME`` for a later command to run, any other runs as a script. Blocks
without a language (pictures, file trees) are not code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # tests/integration/ -> the repository
QUICK_STARTS = ["docs/getting-started.md", "docs/guide/plain-webdataset.md", "docs/guide/python-api.md"]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)

pytestmark = pytest.mark.timeout(900)


def _command_lines(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip().startswith("python3 -m venv")]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """``(language, code)`` of every fenced block with a language, in order."""
    return [(lang, code) for lang, code in _FENCE.findall(text) if lang]


def test_ci_runs_the_readme_test_command() -> None:
    readme = _command_lines((ROOT / "README.md").read_text())
    ci = _command_lines((ROOT / ".ci" / "run").read_text())
    assert len(ci) == 1 and ci[0] in readme
    assert ci[0].endswith("mkdocs build --strict && pytest") and "'.[test,docs]'" in ci[0]


def test_readme_installs_the_pinned_torch_first() -> None:
    for line in _command_lines((ROOT / "README.md").read_text()):
        assert "pip install torch==2.13.0 && pip install -e" in line


def test_readme_is_short_and_holds_no_measurement_history() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "What this release changed" not in text and "## Performance" not in text
    for target in re.findall(r"\]\(([^)#]+)", text):  # every relative link names a file that exists
        assert target.startswith("http") or (ROOT / target).exists(), target


def quick_start(text: str) -> str:
    """A page's "Quick start" section, or the whole page when it has none."""
    match = re.search(r"^## Quick start\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    return match.group(1) if match else text


def _run_blocks(doc: str, folder: Path) -> str:
    """Run the blocks of ``doc``'s quick start in ``folder``; everything they printed."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)  # a reader's shell, not a rank of this test run
    ci = _command_lines((ROOT / ".ci" / "run").read_text())[0]
    readme = _command_lines((ROOT / "README.md").read_text())
    printed = []
    text = (ROOT / doc).read_text()
    for i, (lang, code) in enumerate(code_blocks(text if doc == "README.md" else quick_start(text))):
        if lang == "bash":
            lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
            for line in lines:
                if line.startswith("python3 -m venv"):  # set-up: the README's own, and CI runs its test command
                    assert line in readme and (line == ci or line.endswith("&& wsishard demo")), line
                    continue
                if line.startswith("sbatch "):
                    continue
                out = subprocess.run(["bash", "-c", line], cwd=folder, env=env, capture_output=True, text=True)
                assert out.returncode == 0, f"{doc}: {line}\n{out.stdout}\n{out.stderr}"
                printed.append(out.stdout)
        elif lang == "python":
            first = code.splitlines()[0]
            if first.startswith("# file: "):
                (folder / first[len("# file: ") :]).write_text(code)
                continue
            (folder / f"block{i}.py").write_text(code)
            out = subprocess.run([sys.executable, f"block{i}.py"], cwd=folder, env=env, capture_output=True, text=True)
            assert out.returncode == 0, f"{doc}: block {i}\n{out.stdout}\n{out.stderr}"
            assert "not writable" not in out.stderr, out.stderr  # PyTorch's warning about read-only arrays
            printed.append(out.stdout)
        else:
            raise AssertionError(f"{doc}: a {lang!r} block: say how to run it here")
    return "".join(printed)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    folder = tmp_path_factory.mktemp("readme")
    return folder, _run_blocks("README.md", folder)


def test_every_readme_block_runs(readme_run: tuple[Path, str]) -> None:
    import wsishard

    folder, printed = readme_run
    manifest, _ = wsishard.load_manifest(str(folder / "shards"))
    assert manifest.total_samples > 0 and not manifest.failed_slides
    assert "shards: 1 shard, " in printed and "\nOK\n" in printed  # wsishard verify
    assert f"{manifest.total_samples} patches in" in printed  # the Python build: the same slides, options


@pytest.mark.parametrize("doc", QUICK_STARTS)
def test_every_quick_start_block_runs(doc: str, readme_run: tuple[Path, str]) -> None:
    folder, _ = readme_run  # the quick starts go on from the README's: the demo slides are there
    assert _run_blocks(doc, folder)


def test_webdataset_is_a_range_and_ci_tests_its_lowest_release() -> None:
    """No exact pin: a user's environment with another webdataset of the range installs wsishard; CI runs the stream's
    tests again on the range's lowest release (its highest is what the README's command installs)."""
    import re

    deps = (ROOT / "pyproject.toml").read_text()
    (low,) = re.findall(r'"webdataset>=([0-9.]+),<2"', deps)
    assert "webdataset==" not in deps
    assert f"pip install 'webdataset=={low}' && pytest" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_links_every_user_guide_page() -> None:
    """The README's table of features points to every page of the docs' user guide (the sampling, pigment, context
    and stain pages came after the table and were missing from it)."""
    nav = (ROOT / "mkdocs.yml").read_text()
    guide = set(re.findall(r"^\s+- [^:]+: (guide/[\w-]+\.md)$", nav, re.M))
    linked = set(re.findall(r"\]\(docs/(guide/[\w-]+\.md)\)", (ROOT / "README.md").read_text()))
    assert len(guide) > 10 and guide - linked == set()
