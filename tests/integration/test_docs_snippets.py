"""Every code block of the docs runs as written, on a CPU, against one small labelled build of demo slides.

Each page's ``python`` blocks run in order as scripts, and each line of its ``bash`` blocks as a command, in one
shared folder (module fixture :func:`site`) holding the demo slides (``wsishard-demo/slides``, also as ``slides``
and ``data/slides``), their build ``shards`` (with slide labels), a copy ``shards_copy`` and the inputs
``building.md`` names. A comment on the line before a block says how it runs, in the doc's source:

- ``<!-- docs-test: skip (reason) -->``: not run, for the reason given (a cluster, a network, a GPU, minutes);
- ``<!-- docs-test: continues -->``: the block goes on from the page's previous Python block (run as one script);
- ``<!-- docs-test: given model, preprocess -->``: names the reader brings (stubs: a model giving 2 logits);
- ``<!-- docs-test: torchrun 2 -->``: run under ``torchrun --standalone --nproc_per_node=2`` (gloo on a CPU);
- ``<!-- docs-test: file NAME -->``: a file the reader writes (a ``toml`` recipe), written as ``NAME`` for the
  commands after it.

What a reader would change is changed here, and nothing else: the paths in :data:`PATHS`, a training length
(``steps = N``) of 2 batches and batches of 32 instead of 256. The quick starts that ``test_readme`` runs (the
getting-started page, and the "Quick start" sections of its other pages) are left to it. Blocks without a
language, ``json`` and ``text`` (what a command prints) are not code.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from wsishard.demo import DEMO_SLIDE_PX
from wsishard.testing.synthetic import make_slides

ROOT = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"(?:^<!-- docs-test: (?P<how>.*?) -->\n)?^```(?P<lang>\w*)\n(?P<code>.*?)^```", re.M | re.S)
_QUICK_START = re.compile(r"^## Quick start\n.*?(?=^## |\Z)", re.M | re.S)
RUN_BY_TEST_README = {"docs/getting-started.md"}  # whole pages; the Quick start sections of the others too
PATHS = [  # (page or "*", old, new): applied in order
    ("docs/guide/building.md", "/data/", "data/"),
    ("docs/guide/building.md", "--jobs 16", "--jobs 2"),
    ("docs/guide/building.md", "new_slides/", "data/slides/"),
    ("*", "s3://bucket/shards", "shards"),
    ("*", "/data/shards", "shards"),
    ("*", "/data/val_shards", "shards"),
    ("*", "/data/tcga", "shards"),
    ("*", "/data/in_house", "shards_copy"),
    ("*", '"OUT"', '"shards"'),
]
_GIVEN = {
    "model": (
        "import torch\n"
        "class _Model(torch.nn.Module):  # the reader's model: 2 logits from any input\n"
        "    def forward(self, x, *more):\n"
        "        m = x.float().flatten(1).mean(1)\n"
        "        return torch.stack([m, -m], 1)\n"
        "model = _Model()\n"
    ),
    "preprocess": "def preprocess(x):\n    return x.float() / 255\n",
}
BLOCK_TIMEOUT_S = 180

pytestmark = pytest.mark.timeout(1200)


def _pages() -> list[str]:
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md"))


def blocks(page: str) -> list[tuple[str, str, str]]:
    """``(how, language, code)`` of the page's code blocks, in order, without those test_readme runs."""
    text = (ROOT / page).read_text()
    if page in RUN_BY_TEST_README:
        return []
    if page.endswith(("plain-webdataset.md", "python-api.md")):  # test_readme runs their Quick start sections
        text = _QUICK_START.sub("", text)
    return [
        (m["how"] or "", m["lang"], m["code"]) for m in _BLOCK.finditer(text) if m["lang"] not in ("", "json", "text")
    ]


def _adapt(page: str, code: str) -> str:
    for where, old, new in PATHS:
        if where in ("*", page):
            code = code.replace(old, new)
    code = re.sub(r"^steps = [\d_]+", "steps = 2", code, flags=re.M)
    return code.replace("batch_size=256", "batch_size=32")


def scripts(page: str) -> list[tuple[str, str, str]]:
    """``(kind, code, skip reason)`` to run for the page: ``bash`` (one command a line), ``python`` or
    ``torchrun``, each Python block joined with the blocks that continue it."""
    out: list[tuple[str, str, str]] = []
    for how, lang, code in blocks(page):
        if how.startswith("skip"):  # the whole comment: its reason may hold any text
            reason = re.fullmatch(r"skip \((.+)\)", how.strip())
            assert reason, f"{page}: a skipped block must say why: <!-- docs-test: skip (reason) -->"
            out.append((lang, code, reason[1]))
            continue
        hows = [h.strip() for h in how.split(";") if h.strip()]
        if files := [h[len("file ") :].strip() for h in hows if h.startswith("file ")]:
            out.append((f"file {files[0]}", code, ""))
            continue
        given = [n.strip() for h in hows if h.startswith("given ") for n in h[len("given ") :].split(",")]
        prelude = "".join(_GIVEN[n] for n in given)
        if lang == "bash":
            out.append(("bash", _adapt(page, code), ""))
        elif lang == "python":
            kind = "torchrun" if "torchrun 2" in hows else "python"
            if "continues" in hows:
                assert out and out[-1][0] in ("python", "torchrun"), f"{page}: nothing for a block to continue"
                previous = out.pop()
                kind = "torchrun" if "torchrun" in (kind, previous[0]) else "python"
                out.append((kind, previous[1] + "\n" + prelude + _adapt(page, code), ""))
            else:
                out.append((kind, prelude + _adapt(page, code), ""))
        else:
            raise AssertionError(f"{page}: a {lang!r} block: say how to run it here, or skip it with a reason")
    return out


def _run(kind: str, code: str, folder: Path, name: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a reader's shell, not a rank of this test run
    if kind == "bash":
        command = ["bash", "-c", code]
    else:
        (folder / name).write_text(code)
        runner = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"] if kind == "torchrun" else []
        command = [sys.executable, *runner, name]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shared folder: two demo slides (the demo's size; smaller ones leave too little tissue for a stain fit)
    built with slide labels into ``shards``."""
    folder = tmp_path_factory.mktemp("docs")
    slides = folder / "wsishard-demo" / "slides"
    make_slides(slides, 2, seed=0, width=DEMO_SLIDE_PX, height=DEMO_SLIDE_PX)
    (folder / "slides").symlink_to(slides)
    (folder / "data").mkdir()
    (folder / "data" / "slides").symlink_to(slides)
    make_slides(folder / "extra", 2, seed=1, width=2048, height=2048)  # building.md's more.svs and list.txt
    shutil.move(folder / "extra" / "slide-000.svs", folder / "more.svs")
    (folder / "list.txt").write_text(f"{folder / 'extra' / 'slide-001.tif'}\n")
    (folder / "labels.csv").write_text("slide,label\nslide-000,0\nslide-001,1\n")
    flags = ["--mpp", "0.5", "--patch-size", "256", "--shard-samples", "64", "--labels", "labels.csv", "-q"]
    out = _run("bash", " ".join(["wsishard build wsishard-demo/slides -o shards", *flags]), folder, "")
    assert out.returncode == 0, out.stderr
    shutil.copytree(folder / "shards", folder / "shards_copy")
    return folder


PAGES = [page for page in _pages() if scripts(page)]


def test_every_page_with_code_is_covered_and_every_skip_says_why() -> None:
    assert {"docs/guide/streaming.md", "docs/guide/stain.md", "docs/guide/sampling.md"} <= set(PAGES)
    skipped = [(page, reason) for page in PAGES for _, _, reason in scripts(page) if reason]
    assert all(len(reason.split()) >= 3 for _, reason in skipped), skipped


@pytest.mark.parametrize("page", PAGES)
def test_every_block_of_the_page_runs(page: str, site: Path) -> None:
    ran = 0
    for i, (kind, code, skip) in enumerate(scripts(page)):
        if skip:
            continue
        name = f"{Path(page).stem}-{i}.py"
        if kind.startswith("file "):
            (site / kind[len("file ") :]).write_text(code)
            continue
        lines = [ln for ln in code.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
        for command in lines if kind == "bash" else [code]:
            out = _run(kind, command, site, name)
            shown = command if kind == "bash" else f"block {i}"
            assert out.returncode == 0, f"{page}: {shown}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            assert "Traceback" not in out.stderr, f"{page}: {shown}\n{out.stderr[-3000:]}"
        ran += 1
    if not ran:
        pytest.skip(f"{page}: every block is marked skip, with its reason")
