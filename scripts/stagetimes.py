"""Where a build's CPU time goes, per process and stage: timers wrapped around the build's own functions.

Used by ``bench_build.py``'s build child: :func:`install` wraps (in this process, before ``build`` forks its workers,
which inherit the wrappers) the functions that make up each stage, and each process writes its figures to
``<folder>/<pid>.json`` whenever it finishes a unit of work (a slide scanned, a segment extracted) and on
:func:`dump`. Time is exclusive: a stage called from another (the scan's few encoded patches, the QC picture inside
the scan) counts for the innermost one only. CPU time of the calling thread (``time.thread_time``): robust to other
load on the machine. Stages:

- ``scan``: opening the slide, the low-resolution view, tissue detection, the grid, the stain fit;
- ``qc``: the QC picture (its view, drawing, PNG);
- ``decode``: a block's stage 1 (tiles decoded, at 1/k by DCT scaling, into the block's reduced region);
- ``resample``: stage 2, one patch cut from the reduced region at exactly the target mpp;
- ``scores``: the per-patch quality scores; ``encode``: the JPEG; ``write``: tar records and the shard file;
- ``other``: the rest of the process's CPU (start-up, the pool, planning, the manifest).
"""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

STAGES = ("scan", "qc", "decode", "resample", "scores", "encode", "write")
# (module, attribute (Class.method allowed), stage); the units end with a dump of this process's figures
_WRAPPED = [
    ("wsishard.builder.scan", "scan_slide", "scan"),
    ("wsishard.builder.scan", "_write_qc", "qc"),
    ("wsishard.builder.patches", "reduced_read", "decode"),
    ("wsishard.builder.context", "reduced_read", "decode"),
    ("wsishard.builder.resample", "Reduced.cut", "resample"),
    ("wsishard.builder.patches", "quality_scores", "scores"),
    ("wsishard.builder.patches", "encode_image", "encode"),
    ("wsishard.builder.context", "encode_image", "encode"),
    ("wsishard.builder.extract", "sample_records", "write"),
    ("wsishard.builder.extract", "ShardWriter.append", "write"),
    ("wsishard.builder.extract", "ShardWriter.commit", "write"),
]
_UNITS = {"scan_slide", "extract_segment"}


class _Timer:
    def __init__(self) -> None:
        self.folder: Path | None = None
        self.cpu_s: dict[str, float] = dict.fromkeys(STAGES, 0.0)
        self.calls: dict[str, int] = dict.fromkeys(STAGES, 0)
        self.stack: list[float] = []  # per open call: CPU time its inner stages took

    def wrap(self, fn: Any, stage: str | None, unit: bool) -> Any:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.stack.append(0.0)
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.thread_time() - t0
                inner = self.stack.pop()
                if stage is not None:
                    self.cpu_s[stage] += spent - inner
                    self.calls[stage] += 1
                    if self.stack:
                        self.stack[-1] += spent
                elif self.stack:
                    self.stack[-1] += inner
                if unit:
                    self.dump()

        return timed

    def dump(self) -> None:
        if self.folder is not None:
            cpu = time.process_time()
            figures = {"pid": os.getpid(), "cpu_s": cpu, "stages_cpu_s": self.cpu_s, "calls": self.calls}
            tmp = self.folder / f".{os.getpid()}.tmp"
            tmp.write_text(json.dumps(figures))
            os.replace(tmp, self.folder / f"{os.getpid()}.json")


TIMER = _Timer()


def install(folder: str) -> None:
    """Wrap the build's stage functions; every process of the build then reports into ``folder``."""
    import importlib

    TIMER.folder = Path(folder)
    TIMER.folder.mkdir(parents=True, exist_ok=True)
    for module_name, attr, stage in [*_WRAPPED, ("wsishard.builder.extract", "extract_segment", None)]:
        module = importlib.import_module(module_name)
        owner, name = (getattr(module, attr.split(".")[0]), attr.split(".")[1]) if "." in attr else (module, attr)
        setattr(owner, name, TIMER.wrap(getattr(owner, name), stage, name in _UNITS))
    import wsishard.builder.extract as extract
    import wsishard.builder.run as run  # it calls these two through names of its own
    import wsishard.builder.scan as scan

    run.scan_slide, run.extract_segment = scan.scan_slide, extract.extract_segment


def dump() -> None:
    TIMER.dump()


def collect(folder: str) -> dict[str, Any]:
    """Every process's figures: ``{"processes": [...], "cpu_s": {stage: total}, "share": {stage: fraction}}``."""
    procs = [json.loads(p.read_text()) for p in sorted(Path(folder).glob("*.json"))]
    total = sum(p["cpu_s"] for p in procs)
    stages = {s: sum(p["stages_cpu_s"][s] for p in procs) for s in STAGES}
    stages["other"] = max(0.0, total - sum(stages.values()))
    share = {s: v / total if total > 0 else 0.0 for s, v in stages.items()}
    return {"processes": procs, "cpu_s": stages, "total_cpu_s": total, "share": share}
