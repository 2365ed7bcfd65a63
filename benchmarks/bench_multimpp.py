"""The 3-mpp build (``--mpp 0.5 1.0 2.0``) against three builds of one mpp each, side by side: CPU seconds
(``jobs=1``: all in the build's process), the samples per mpp, the (slide, x, y) they share and the PSNR of the
shared patches.

Slides: synthetic H&E at real scanners' level-0 mpp (Aperio AT2 0.2520, GT450 0.2631, NanoZoomer 0.2265, 3DHistech
0.2425), default build options but ``jobs=1`` (every CPU second then in the one process measured: user + system,
after the imports). Each build runs in a child process; rounds interleave the four builds. The machine is shared.

    python benchmarks/bench_multimpp.py [--rounds 3] [--size 8192] [--smoke]
"""

from __future__ import annotations

import argparse
import io
import json
import resource
import sys
import tarfile
from pathlib import Path

import benchkit as bk
import numpy as np
from benchkit import run

MPPS = (0.5, 1.0, 2.0)
SCANNERS = (0.2520, 0.2631, 0.2265, 0.2425)
log = bk.logger("bench_multimpp")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # jobs=1: the build's every thread is in this process
    return usage.ru_utime + usage.ru_stime


def child(slides: str, out: str, mpps: list[float]) -> None:
    """One build in this process (``jobs=1``, after its imports): its CPU seconds on stdout's last line."""
    import wsishard
    from wsishard.builder.run.orchestrate import build

    t0 = _cpu()
    build([slides], out, wsishard.BuildOptions.from_keywords(mpp=mpps if len(mpps) > 1 else mpps[0], jobs=1))
    print(json.dumps({"cpu_s": _cpu() - t0}))


def _samples(out: Path) -> dict[tuple[float, str, int, int], np.ndarray]:
    from PIL import Image

    got = {}
    for tar_path in sorted(out.glob("shard-*.tar")):
        with tarfile.open(tar_path) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar}  # type: ignore[union-attr]
        for name, data in members.items():
            if name.endswith(".json"):
                meta = json.loads(data)
                image = Image.open(io.BytesIO(members[name[: -len("json")] + "jpg"]))
                got[(round(meta["patch_mpp"], 6), meta["slide_id"], meta["x"], meta["y"])] = np.asarray(image)
    return got


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)  # 99: identical


def _compare(work: Path) -> list[dict[str, object]]:
    multi = _samples(work / "out-multi")
    rows = []
    for mpp in MPPS:
        one = _samples(work / f"out-{mpp}")
        mine = {k: v for k, v in multi.items() if k[0] == mpp}
        both = mine.keys() & one.keys()
        psnr = [_psnr(mine[k], one[k]) for k in both]
        overlap = len(both) / max(len(mine.keys() | one.keys()), 1)
        low, mid = round(min(psnr, default=0.0), 2), round(float(np.median(psnr or [0])), 2)
        rows.append(
            dict(mpp=mpp, multi=len(mine), single=len(one), overlap=round(overlap, 4), psnr_min=low, psnr_median=mid)
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--size", type=int, default=8192, help="level-0 px a side of each slide")
    p.add_argument("--workdir", default="/tmp/bench_multimpp")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", nargs=3, metavar=("SLIDES", "OUT", "MPPS"))
    args = p.parse_args()
    if args.child:
        child(args.child[0], args.child[1], [float(m) for m in args.child[2].split(",")])
        return 0
    size, rounds = (3072, 1) if args.smoke else (args.size, args.rounds)
    work = Path(args.workdir) / f"s{size}"
    slides = work / "slides"
    if not slides.is_dir():
        from wsishard.testing.synthetic import make_slide

        slides.mkdir(parents=True)
        for i, mpp in enumerate(SCANNERS):
            log(f"slide {i} at {mpp} mpp")
            make_slide(slides / f"scanner-{i}.svs", width=size, height=size, mpp=mpp, seed=70 + i, tissue_fraction=0.4)
    builds = {"multi": list(MPPS), **{str(m): [m] for m in MPPS}}

    def one(name: str, mpps: list[float]) -> float:
        import shutil

        out = work / f"out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        return float(bk.child_json(__file__, [str(slides), str(out), ",".join(map(str, mpps))])["cpu_s"])

    runs = bk.interleaved(rounds, {n: (lambda n=n, m=m: one(n, m)) for n, m in builds.items()}, log)  # type: ignore[misc]
    ratios = [r["multi"] / sum(r[str(m)] for m in MPPS) for r in runs]
    compare = _compare(work)
    head = f"{len(SCANNERS)} slides of {size} px at {', '.join(map(str, SCANNERS))} mpp, default options but jobs=1, "
    mid = bk.median_range(ratios)[0]
    print(
        bk.markdown(
            ["build", "CPU s: median [range]"],
            [(n, bk.spread([r[n] for r in runs], 2, " s")) for n in builds],
            head + f"{rounds} round(s); 3-mpp / three single builds: {bk.spread(ratios)} "
            f"(target <= 0.7x: {bk.verdict(mid <= 0.7)})",
            "lr",
        )
    )
    cols = ["mpp", "samples, 3-mpp", "samples, single", "(slide, x, y) shared", "PSNR min dB", "PSNR median dB"]
    rows = [
        (r["mpp"], r["multi"], r["single"], f"{r['overlap']:.2%}", r["psnr_min"], r["psnr_median"]) for r in compare
    ]
    print(
        "\n"
        + bk.markdown(cols, rows, "each scale of the 3-mpp build against its own build (99 dB: identical)", "rrrrrr")
    )
    report = {
        "size_px": size,
        "slide_mpps": SCANNERS,
        "rounds": runs,
        "ratio": ratios,
        "compare": compare,
        "load": bk.load(),
    }
    print("JSON: " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(run("bench_multimpp", main))
