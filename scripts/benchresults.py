"""Benchmark results saved where the docs' performance page reads them: ``benchmarks/results/<script>.json``.

Each benchmark script runs its ``main`` through :func:`run`, which copies everything the script prints, and on
success saves one JSON file per script (the latest run replaces the one before): the command, when and where it
ran, the tables it printed (Markdown, the lines starting with ``|`` and the line before each table) and the
script's own ``JSON: {...}`` line as ``report``. A run of a script's child process (``--child``) saves nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import json
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
TITLES = {  # each script's section on the performance page
    "bench_build": "Build",
    "bench_build_context": "Context patches: build cost",
    "bench_stream": "Streaming",
    "bench_stream_context": "Context patches: streaming",
    "bench_index": "Per-sample index at archive scale",
    "bench_sampling": "Weighted and selected streaming",
    "bench_stain": "Stain on the device",
    "bench_native": "The C module",
    "bench_scale": "Scale",
    "bench_quality": "Per-patch quality scores",
    "bench_tissue": "Tissue detection and artefacts",
    "bench_stain_gpu": "Stain on a GPU",
    "bench_stream_gpu": "Streaming on a GPU machine",
    "bench_gpu_loader": "Decode on the GPU",
    "sampling_checks": "Weighted and selected sampling: the checks at full size",
}


class _Tee(io.TextIOBase):
    """Writes to the real stdout and keeps a copy."""

    def __init__(self, out: Any) -> None:
        self.out, self.copy = out, io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.out.write(text)

    def flush(self) -> None:
        self.out.flush()


def tables(text: str) -> str:
    """The Markdown tables of ``text``, each with the line before it (its caption), blank lines between."""
    lines, out = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("|"):
            if i == 0 or not lines[i - 1].startswith("|"):
                caption = lines[i - 1] if i and not lines[i - 1].startswith("JSON:") else ""
                out += ["", caption, ""] if caption.strip() else [""]
            out.append(line)
    return "\n".join(out).strip() + "\n"


def _gpu() -> str:
    """The GPU and torch build, where the script ran torch on CUDA ("" otherwise)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return ""
    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "


def save(name: str, printed: str, argv: list[str], folder: Path = RESULTS, script: str | None = None) -> Path:
    """Write ``folder/<name>.json`` from what the script (``scripts/<script or name>.py``) printed; returns its
    path."""
    report = None
    for line in printed.splitlines():
        if line.startswith("JSON: "):
            report = json.loads(line[len("JSON: ") :])
    run = {
        "benchmark": name,
        "command": " ".join(["python", f"scripts/{script or name}.py", *argv]),
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {_gpu()}Python {platform.python_version()}, "
        f"1-min load {os.getloadavg()[0]:.1f} when saved",
        "title": TITLES.get(name, name),
        "output_md": tables(printed),
        "report": report,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def run(name: str, main: Callable[[], int | None], script: str | None = None) -> int:
    """Run a benchmark's ``main`` and save its results as ``name`` (a script may save some runs under another name
    than its own, ``script``) when it succeeds; its exit status."""
    argv = sys.argv[1:]
    if "--child" in argv:
        return main() or 0
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        code = main() or 0
    if code == 0:
        print(f"saved {save(name, tee.copy.getvalue(), argv, script=script)}")
    return code
