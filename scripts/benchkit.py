"""What every benchmark script shares: timing, rounds, summaries, the table it prints, its cached inputs.

How the figures are taken and what they mean (rounds interleaved, medians with ranges, CPU seconds) is written on
the docs' performance page (``docs/performance.md``); saving what a script printed is ``benchresults.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def logger(name: str) -> Callable[[str], None]:
    """A script's progress log: ``[name] msg`` on stderr (stdout holds the tables that are saved)."""

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    return log


def load() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def cpu_s(procs: Iterable[Any] | None = None) -> float:
    """User plus system CPU seconds of ``procs`` (psutil processes; default: this process's children) so far; a
    process that has ended counts nothing."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children() if procs is None else procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def rss_mb() -> float:
    """This process's peak resident set size so far, MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def step(
    log: Callable[[str], None], name: str, fn: Callable[..., dict[str, Any]], *args: Any, **kw: Any
) -> dict[str, Any]:
    """``fn(*args, **kw)``, logged by ``name``, its result with the seconds it took as ``step_s``."""
    log(name)
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    out["step_s"] = round(time.perf_counter() - t0, 2)
    return out


def interleaved(
    rounds: int, runs: dict[str, Callable[[], T]], log: Callable[[str], None] | None = None
) -> list[dict[str, T]]:
    """``rounds`` rounds, each running every one of ``runs`` once, one after the other in the order given: each
    round's figures are neighbours in time, so a ratio between them sees one machine."""
    out = []
    for r in range(rounds):
        rd: dict[str, T] = {}
        for name, run in runs.items():
            if log is not None:
                log(f"{name} (round {r + 1} of {rounds})")
            rd[name] = run()
        out.append(rd)
    return out


def median_range(values: Sequence[float]) -> tuple[float, float, float]:
    """The median of ``values``, their least and their largest."""
    return float(statistics.median(values)), float(min(values)), float(max(values))


def spread(values: Sequence[float], digits: int = 3, unit: str = "x") -> str:
    """``median`` (``digits`` decimals: a verdict's 0.849x must not print as 0.85x), then ``[least-largest]`` where
    there are several values."""
    mid, lo, hi = median_range(values)
    return f"{mid:.{digits}f}{unit}" + (f" [{lo:.2f}-{hi:.2f}]" if len(values) > 1 else "")


def verdict(ok: bool | None) -> str:
    """A target's verdict: PASS, MISS, or ``n/a`` where it was not measured."""
    return "n/a" if ok is None else "PASS" if ok else "MISS"


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "", align: str = "") -> str:
    """A Markdown table (the performance page shows it as printed), after its caption line where given; ``align``:
    a letter a column, ``r`` right-aligned (figures), anything else left."""
    lines = [caption] if caption else []  # right above the table: benchresults keeps it as the table's caption
    rules = ["---:" if a == "r" else "---" for a in align.ljust(len(header))]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def child_json(script: str, args: list[str]) -> dict[str, Any]:
    """Run ``script --child ...args`` in a fresh interpreter (its peak RSS its own) and return the JSON object its
    last line prints; a failure ends the benchmark with the child's error."""
    done = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def synthetic_build(
    root: Path, want: dict[str, Any], build: Callable[[list[str], Path], None], seed: int = 0
) -> tuple[list[str], Path]:
    """Generated slides and their build under ``root`` (``slides/``, ``shards/``), made once and reused while
    ``want`` (``n_slides``, ``size_px``, ``slide_mpp``, ``tissue_fraction``; anything else the build depends on) is
    what made them: slide ``i`` is generated with seed ``seed + i``, ``build(slides, out)`` makes the shards."""
    import shutil
    from concurrent.futures import ProcessPoolExecutor

    slides_dir, out, stamp = root / "slides", root / "shards", root / "stamp.json"
    paths = [str(slides_dir / f"slide-{i:03d}.{'svs' if i % 2 == 0 else 'tif'}") for i in range(want["n_slides"])]
    if stamp.exists() and json.loads(stamp.read_text()) == want and (out / "manifest.json").exists():
        return paths, out
    slides_dir.mkdir(parents=True, exist_ok=True)
    todo = [p for p in paths if not Path(p).exists()]
    with ProcessPoolExecutor(max_workers=2) as pool:
        list(pool.map(_make_slide, todo, [want] * len(todo), [seed + paths.index(p) for p in todo]))
    shutil.rmtree(out, ignore_errors=True)
    build(paths, out)
    stamp.write_text(json.dumps(want))
    return paths, out


def _make_slide(path: str, want: dict[str, Any], seed: int) -> str:
    from wsishard.testing.synthetic import make_slide

    size, mpp, tissue = want["size_px"], want["slide_mpp"], want["tissue_fraction"]
    make_slide(path, width=size, height=size, mpp=mpp, seed=seed, tissue_fraction=tissue)
    return path
