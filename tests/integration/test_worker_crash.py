"""A build whose worker processes get killed (as the out-of-memory killer does) ends, and loses nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from buildtools import read_output

from wsishard.testing.synthetic import make_slides

# Installed as sitecustomize.py, so that every process of the build patches itself: forked workers and, once the
# pool has been restarted from a process that now runs threads, workers started by a forkserver too.
_KILLER = textwrap.dedent(
    """
    import os, signal
    import wsishard.builder.extract as extract
    import wsishard.builder.scan as scan

    read, scan_open = extract.block_samples, scan._scan_open

    def killing_read(reader, work, block, encode):  # slide-001 kills every worker that reads its pixels
        if work.slide_id == "slide-001":
            os.kill(os.getpid(), signal.SIGKILL)
        return read(reader, work, block, encode)

    def killing_scan(task, reader, record):  # slide-002 kills every worker that scans it
        if task.slide_id == "slide-002":
            os.kill(os.getpid(), signal.SIGKILL)
        return scan_open(task, reader, record)

    extract.block_samples, scan._scan_open = killing_read, killing_scan
    """
)
_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from wsishard.builder.grid import PatchOptions
    from wsishard.builder.options import BuildOptions
    from wsishard.builder.run import build

    options = BuildOptions(patch=PatchOptions(patch_size_px=64), shard_samples=64, jobs=2, qc=False)
    manifest = build([sys.argv[1]], sys.argv[2], options)
    print(json.dumps({s.slide_id: [s.status, s.reason, s.patches] for s in manifest.slides}))
    """
)


def test_killed_workers_fail_their_slides_and_the_build_finishes(tmp_path: Path) -> None:
    make_slides(tmp_path / "in", 5, seed=9, width=2048, height=2048)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_KILLER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "in"), str(out)], capture_output=True,
                          text=True, timeout=300, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    slides = json.loads(proc.stdout.strip().splitlines()[-1])
    assert slides["slide-001"][0] == "failed" and "worker process" in slides["slide-001"][1]
    assert slides["slide-002"][0] == "failed" and "died twice" in slides["slide-002"][1]
    ok = {k for k, (status, _, patches) in slides.items() if status == "ok" and patches > 0}
    assert ok == {"slide-000", "slide-003", "slide-004"}
    manifest, samples = read_output(str(out))
    assert {s.meta["slide_id"] for s in samples} == ok  # nothing of a failed slide in any shard
    assert sum(s.patches for s in manifest.slides) == len(samples) == manifest.total_samples
