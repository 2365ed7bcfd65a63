#!/usr/bin/env python
"""The sampling features' "done when" figures at full size, on bench_stream.py --sampling's labelled build (too slow
for CI).

Example::

    python scripts/sampling_checks.py --quick

- ``weights="class"``: 100,000 samples from 2 ranks x 2 workers (each reader's pipeline run here, as its worker
  would): each label's share against 50% +/- 2% (the build's own mix is about 80/20: every fifth slide is label 1).
- ``weights="slide"``: the same readers, each slide's share against an equal share +/- 10% (relative).
- ``select=`` (``tissue >= 0.75``) with ``pad_last`` over 2 ranks x 2 workers: every valid sample inside the mask,
  each selected sample exactly once, equal batch counts.
- Resume: a loader (2 workers) with ``weights="class"`` and ``select=`` restored from its ``state_dict()`` after
  15 batches yields the uninterrupted run's next 25.

Prints a table and ``JSON: {...}``, saved as ``benchmarks/results/sampling_checks.json`` (benchresults.py).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import time
from pathlib import Path
from typing import Any

from bench_stream import FULL, QUICK, _tissue, labelled
from benchkit import markdown, verdict

TWO = [(r, w) for r in range(2) for w in range(2)]


def _readers(source: str, per_reader: int, **kw: Any) -> list[dict[str, Any]]:
    from wsishard.streaming.sources import stream
    from wsishard.streaming.world import World

    ds = stream(source, batch_size=250, seed=1, shuffle=500, world=World(rank=0, world_size=2), **kw)
    out = []
    for rank, worker in TWO:
        world = World(rank=rank, world_size=2, worker=worker, num_workers=2)
        for batch in itertools.islice(ds.pipeline(world, 0), per_reader // 250):
            out += [
                {"label": label, "slide": key.rsplit("_x", 1)[0]}
                for label, key in zip(batch["label"].tolist(), batch["key"], strict=True)
            ]
    return out


def check_class(source: str, total: int) -> dict[str, Any]:
    drawn = _readers(source, total // 4, weights="class")
    share = sum(d["label"] == 1 for d in drawn) / len(drawn)
    return {"samples": len(drawn), "label1_share": share, "pass": abs(share - 0.5) <= 0.02}


def check_slide(source: str, total: int) -> dict[str, Any]:
    drawn = _readers(source, total // 4, weights="slide")
    counts = collections.Counter(d["slide"] for d in drawn)
    fair = len(drawn) / len(counts)
    worst = max(abs(n - fair) / fair for n in counts.values())
    return {"samples": len(drawn), "slides": len(counts), "worst_relative_error": worst, "pass": worst <= 0.10}


def check_select(source: str) -> dict[str, Any]:
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream
    from wsishard.streaming.world import World

    valid, inside, batches = [], True, []
    for rank in range(2):
        ds = stream(
            source, batch_size=64, resampled=False, select=_tissue, pad_last=True, world=World(rank=rank, world_size=2)
        )
        n = 0
        for batch in loader(ds, num_workers=2):
            n += 1
            for key, meta, ok in zip(batch["key"], batch["meta"], batch["valid"].tolist(), strict=True):
                if ok:
                    valid.append(key)
                    inside &= meta["tissue"] >= 0.75
        batches.append(n)
        selected = int(ds.counts.sum())
    return {
        "selected": selected,
        "valid": len(valid),
        "distinct": len(set(valid)),
        "inside_mask": bool(inside),
        "batches_per_rank": batches,
        "pass": inside and len(valid) == len(set(valid)) == selected and batches[0] == batches[1],
    }


def check_resume(source: str) -> dict[str, Any]:
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    def fresh() -> Any:
        return loader(stream(source, batch_size=64, seed=4, weights="class", select=_tissue), num_workers=2)

    reference = [tuple(b["key"]) for b in itertools.islice(fresh(), 40)]
    first = fresh()
    taken = [tuple(b["key"]) for b in itertools.islice(first, 15)]
    state = json.loads(json.dumps(first.state_dict()))
    again = fresh()
    again.load_state_dict(state)
    rest = [tuple(b["key"]) for b in itertools.islice(again, 25)]
    return {"batches": 40, "resumed_at": 15, "pass": taken + rest == reference}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="bench_stream's quick build")
    ap.add_argument("--workdir", default="/tmp/wsishard-bench-stream", help="cache of slides and shards")
    ap.add_argument("--samples", type=int, default=100_000, help="weighted draws over the 4 readers")
    args = ap.parse_args()
    source = str(labelled(Path(args.workdir), QUICK if args.quick else FULL))
    result: dict[str, Any] = {}
    for name, fn in (
        ("class", lambda: check_class(source, args.samples)),
        ("slide", lambda: check_slide(source, args.samples)),
        ("select", lambda: check_select(source)),
        ("resume", lambda: check_resume(source)),
    ):
        t0 = time.perf_counter()
        result[name] = {**fn(), "seconds": round(time.perf_counter() - t0, 1)}
    rows = [
        (
            name,
            verdict(r["pass"]),
            json.dumps({k: v for k, v in r.items() if k not in ("pass", "seconds")}, default=float),
            r["seconds"],
        )
        for name, r in result.items()
    ]
    print(markdown(("check", "verdict", "figures", "seconds"), rows, "The sampling features' checks at full size"))
    print("JSON: " + json.dumps(result, default=float))


if __name__ == "__main__":
    import benchresults

    raise SystemExit(benchresults.run("sampling_checks", main))
