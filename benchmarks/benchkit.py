"""The one harness every benchmark shares: its command line, the test inputs (generated slides and their build, made
once and cached), the loader loop, child processes, interleaved rounds, CPU seconds, medians and ranges, the tables it
prints, and saving them where the docs' performance page reads them (``benchmarks/results/<name>.json``).

A benchmark is a short description of what it compares: its arms (each a function returning its figures), its sizes
per mode (``--smoke``: tiny, the same code path, run by ``tests/integration/test_benchmarks_smoke.py``; ``--quick``;
the full run) and the ratios it reports. How the figures are taken and what they mean is written on the docs'
performance page (``docs/performance.md``). Each benchmark runs its ``main`` through :func:`run`, which copies what it
prints and, on success, saves one JSON file: the command, when and where it ran, the tables it printed (Markdown, with
the line before each as its caption) and its own ``JSON: {...}`` line as ``report``. A child process's run
(``--child``) and a smoke run save nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import io
import json
import logging
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
RESULTS = Path(__file__).resolve().parent / "results"
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)  # ImageNet's: every collate the benchmarks run
TITLES = {  # each saved run's section on the performance page
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
    "bench_jax": "JAX loader against the torch loader",
    "bench_storage": "Object storage behind a request delay",
    "bench_embed": "Embedding a build",
    "bench_embed_gpu": "Embedding a build on a GPU",
    "bench_multicrop": "Multi-crop views on the device",
    "bench_multicrop_gpu": "Multi-crop views on a GPU",
    "bench_multimpp": "Several magnifications in one build",
}


# ---------------------------------------------------------------------------------------- the command line


def parse(doc: str, *extra: tuple[str, dict[str, Any]], argv: list[str] | None = None) -> argparse.Namespace:
    """A benchmark's arguments: ``--smoke``, ``--quick``, ``--workdir`` (its cached inputs), ``--json-only`` and its
    own ``extra`` flags, ``(flag, add_argument keywords)``; ``mode`` is ``smoke``, ``quick`` or ``full``."""
    p = argparse.ArgumentParser(description=doc.strip().splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes, the same code path, no peers; nothing saved")
    p.add_argument("--quick", action="store_true", help="smaller sizes, for a first look")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "wsishard-bench")
    p.add_argument("--json-only", action="store_true", help="print only the final JSON line")
    p.add_argument("--child", help=argparse.SUPPRESS)  # a part run in a fresh interpreter (child_json)
    for flag, kw in extra:
        p.add_argument(flag, **kw)
    args = p.parse_args(argv)
    args.mode = "smoke" if args.smoke else "quick" if args.quick else "full"
    return args


def sized(args: argparse.Namespace, smoke: T, quick: T, full: T) -> T:
    """The value of a size for the run's mode."""
    return {"smoke": smoke, "quick": quick, "full": full}[args.mode]


def emit(report: dict[str, Any], *tables: str, json_only: bool = False) -> int:
    """Print the tables (each a caption and a Markdown table, :func:`markdown`), then the ``JSON:`` line; 0."""
    if not json_only:
        print("\n\n".join(tables))
    print("JSON: " + json.dumps(report, default=float, sort_keys=True))
    return 0


def logger(name: str) -> Callable[[str], None]:
    """A script's progress log: ``[name] msg`` on stderr (stdout holds the tables that are saved)."""

    def log(msg: str) -> None:
        print(f"[{name}] {msg}", file=sys.stderr, flush=True)

    return log


# ------------------------------------------------------------------------------- measuring and summarising


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


def interleaved(
    rounds: int, runs: dict[str, Callable[[], T]], log: Callable[[str], None] | None = None
) -> list[dict[str, T]]:
    """``rounds`` rounds, each running every one of ``runs`` once, one after the other in the order given: each
    round's figures are neighbours in time, so a ratio between them sees one machine."""
    out = []
    for r in range(rounds):
        rd: dict[str, T] = {}
        for name, arm in runs.items():
            if log is not None:
                log(f"{name} (round {r + 1} of {rounds})")
            rd[name] = arm()
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


def check(label: str, shown: str, value: float, target: float, at_most: bool = False, unit: str = "x") -> list[str]:
    """A table row of a figure with a target: ``label``, the figure as ``shown``, the target, and PASS or MISS."""
    ok = value <= target if at_most else value >= target
    return [label, shown, f"{'<=' if at_most else '>='} {target:g}{unit}", verdict(ok)]


def markdown(header: Sequence[str], rows: Iterable[Sequence[Any]], caption: str = "", align: str = "") -> str:
    """A Markdown table (the performance page shows it as printed), after its caption line where given; ``align``:
    a letter a column, ``r`` right-aligned (figures), anything else left."""
    lines = [caption] if caption else []  # right above the table: run() keeps it as the table's caption
    rules = ["---:" if a == "r" else "---" for a in align.ljust(len(header))]
    lines += ["| " + " | ".join(header) + " |", "|" + "|".join(rules) + "|"]
    lines += ["| " + " | ".join(str(cell).replace("|", "/") for cell in row) + " |" for row in rows]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------ child processes


def child_json(script: str, args: list[str]) -> dict[str, Any]:
    """Run ``script --child ...args`` in a fresh interpreter (its peak RSS its own) and return the JSON object its
    last line prints; a failure ends the benchmark with the child's error."""
    done = subprocess.run([sys.executable, script, "--child", *args], capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(args)}: {done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot."""
    import psutil

    t = psutil.cpu_times()  # Linux: guest time is already in user
    return t.user + t.system + sum(getattr(t, k, 0.0) for k in ("nice", "irq", "softirq", "steal"))


def run_tree(cmd: list[str]) -> dict[str, Any]:
    """Run ``cmd`` (stdout captured) and time it: ``returncode``, ``stdout``, ``wall_s``, ``tree_cpu_s`` (the CPU of
    the child and of every process it waited for) and ``busy_s`` (the CPU the whole machine spent meanwhile: less
    the child's, what other processes took)."""
    ru0, busy0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), busy_cpu_s(), time.perf_counter()
    done = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
    wall, ru1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    tree = (ru1.ru_utime + ru1.ru_stime) - (ru0.ru_utime + ru0.ru_stime)
    return {
        "returncode": done.returncode,
        "stdout": done.stdout,
        "wall_s": wall,
        "tree_cpu_s": tree,
        "busy_s": busy_cpu_s() - busy0,
    }


# ------------------------------------------------------------------------------------------- cached inputs


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


def cached_build(
    folder: Path, *, n_slides: int, size_px: int, slide_mpp: float = 0.2520, tissue_fraction: float = 0.4, **kw: Any
) -> tuple[list[str], Path]:
    """:func:`synthetic_build` of ``wsishard.build`` (256 px patches at 0.5 mpp, 2 jobs, no QC picture, seed 0, and
    ``kw``: e.g. ``shard_samples``, ``labels``): the slides and the build's folder."""
    want = {"n_slides": n_slides, "size_px": size_px, "slide_mpp": slide_mpp, "tissue_fraction": tissue_fraction}
    want |= {k: v for k, v in kw.items() if k != "labels"} | {"labelled": "labels" in kw}

    def make(slides: list[str], out: Path) -> None:
        from wsishard import build

        labels = kw.get("labels")
        opts = {**kw, "labels": labels(slides)} if labels else kw
        manifest = build(slides, str(out), **({"jobs": 2, "qc": False, "seed": 0} | opts), overwrite=True)
        if manifest.failed_slides:
            raise SystemExit(f"build failed for {[s.file for s in manifest.failed_slides]}")

    return synthetic_build(folder, want, make)


@contextlib.contextmanager
def moto_s3(folder: Path, bucket: str, prefix: str = "shards") -> Iterator[tuple[str, dict[str, Any]]]:
    """A moto S3 server on 127.0.0.1 holding every file of ``folder`` under ``s3://bucket/prefix``: yields
    ``(url, storage_options)`` and stops the server on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines from the server
    os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # moto's dummy values
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        for name in sorted(os.listdir(folder)):
            if (folder / name).is_file():
                client.upload_file(str(folder / name), bucket, f"{prefix}/{name}")
        yield f"s3://{bucket}/{prefix}", {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    finally:
        server.stop()


# ------------------------------------------------------------------------------------------ the loader loop


def loader_rate(
    source: str,
    workers: int,
    batches: int,
    *,
    batch: int = 256,
    collate: Callable[[Any], Any] | None = None,
    loader_kw: dict[str, Any] | None = None,
    warm: int | None = None,
    **stream_kw: Any,
) -> dict[str, Any]:
    """``wsishard.loader`` over ``stream(source, batch_size=batch, resampled=True, seed=0, **stream_kw)``, each batch
    through ``collate`` where given (device-ready; synchronised on CUDA): samples/s over ``batches`` batches after
    ``warm`` (default: one a worker, at least two: a collate makes its two output buffers), per worker, per worker
    CPU second, the first batch's seconds (and the loader's part of them), the collate's time per batch (wall, and
    CPU of the calling thread), the main process's CPU per batch, and the distinct slides of each batch (from the
    keys: no JSON parsed)."""
    import psutil
    import torch

    from wsishard import loader, stream

    ds = stream(source, batch_size=batch, **({"resampled": True, "seed": 0} | stream_kw))
    it = iter(loader(ds, num_workers=workers, **(loader_kw or {})))
    warm = max(workers, 2) if warm is None else warm
    distinct, collate_s, collate_cpu_s, procs, t0 = [], 0.0, 0.0, [], time.perf_counter()
    for i in range(warm + batches):
        if i == warm:
            procs = psutil.Process().children()
            t_start, cpu0, main0 = time.perf_counter(), cpu_s(procs), time.process_time()
        got = next(it)
        tc, cc = time.perf_counter(), time.thread_time()
        if collate is not None:
            collate(got)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        if i == 0:
            first_s, first_loader_s = time.perf_counter() - t0, tc - t0
        elif i >= warm:
            collate_s, collate_cpu_s = collate_s + time.perf_counter() - tc, collate_cpu_s + time.thread_time() - cc
        distinct.append(len({k.rsplit("_x", 1)[0] for k in got["key"]}))  # <slide_id>_x<X>_y<Y>
    wall, cpu, main_cpu = time.perf_counter() - t_start, cpu_s(procs) - cpu0, time.process_time() - main0
    del it  # shuts the workers down
    rate = batches * batch / wall
    return {
        "workers": workers,
        "samples_per_s": rate,
        "per_worker": rate / workers,
        "cpu_per_worker": batches * batch / cpu if cpu > 0 else None,
        "first_batch_s": first_s,
        "first_batch_loader_s": first_loader_s,
        "collate_ms_per_batch": 1000 * collate_s / batches,
        "collate_cpu_ms_per_batch": 1000 * collate_cpu_s / batches,  # the calling thread's
        "main_cpu_ms_per_batch": 1000 * main_cpu / batches,
        "distinct_slides": distinct,
    }


# ------------------------------------------------------------------------------------------------- saving


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
    """The GPU and torch build, where the benchmark ran torch on CUDA ("" otherwise)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return ""
    return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, "


def save(name: str, printed: str, argv: list[str], folder: Path = RESULTS, script: str | None = None) -> Path:
    """Write ``folder/<name>.json`` from what the benchmark (``benchmarks/<script or name>.py``) printed; its path."""
    report = None
    for line in printed.splitlines():
        if line.startswith("JSON: "):
            report = json.loads(line[len("JSON: ") :])
    saved = {
        "benchmark": name,
        "command": " ".join(["python", f"benchmarks/{script or name}.py", *argv]),
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {_gpu()}Python {platform.python_version()}, "
        f"1-min load {os.getloadavg()[0]:.1f} when saved",
        "title": TITLES.get(name, name),
        "output_md": tables(printed),
        "report": report,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    path.write_text(json.dumps(saved, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return path


def run(name: str, main: Callable[[], int | None], script: str | None = None) -> int:
    """Run a benchmark's ``main`` and save its results as ``name`` (a benchmark may save some runs under another name
    than its own, ``script``) when it succeeds; its exit status. A child's or a smoke run saves nothing."""
    argv = sys.argv[1:]
    if "--child" in argv or "--smoke" in argv:
        return main() or 0
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        code = main() or 0
    if code == 0:
        print(f"saved {save(name, tee.copy.getvalue(), argv, script=script)}")
    return code
