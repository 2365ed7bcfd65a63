"""A build whose worker processes get killed (as the out-of-memory killer does) ends, and loses nothing else."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from buildtools import read_output

from wsishard.testing.synthetic import make_slides

# Installed as sitecustomize.py, so that every process of the build patches itself: forked workers and, once the
# pool has been restarted from a process that now runs threads, workers started by a forkserver too.
_KILLER = textwrap.dedent(
    """
    import os, signal
    import wsishard.builder.extract.extract as extract
    import wsishard.builder.scan.scan as scan

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
    from wsishard.builder.scan.grid import PatchOptions
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.run.orchestrate import build

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
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path / "in"), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    slides = json.loads(proc.stdout.strip().splitlines()[-1])
    assert slides["slide-001"][0] == "failed" and "worker process" in slides["slide-001"][1]
    assert slides["slide-002"][0] == "failed" and "died twice" in slides["slide-002"][1]
    ok = {k for k, (status, _, patches) in slides.items() if status == "ok" and patches > 0}
    assert ok == {"slide-000", "slide-003", "slide-004"}
    manifest, samples = read_output(str(out))
    assert {s.meta["slide_id"] for s in samples} == ok  # nothing of a failed slide in any shard
    assert sum(s.patches for s in manifest.slides) == len(samples) == manifest.total_samples


# ---- issue 28, item 9: workers end with the build's process, however it ends -----------------------------------

_STALL = textwrap.dedent(
    """
    import os, time
    import wsishard.builder.scan.scan as scan

    def stalled_scan(task, reader, record):  # a worker that says it is scanning, then scans for a long time
        open(os.path.join(os.environ["WSISHARD_TEST_MARKS"], str(os.getpid())), "w").close()
        time.sleep(300)

    scan._scan_open = stalled_scan
    """
)
_BUILD = textwrap.dedent(
    """
    import sys, threading, time
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.run.orchestrate import build

    if sys.argv[3] == "threads":  # a caller running threads gets workers from a forkserver
        threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
    build([sys.argv[1]], sys.argv[2], BuildOptions(jobs=2, qc=False))
    """
)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (an ended process not yet reaped holds no memory)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("caller", ["plain", "threads"])
def test_workers_end_when_the_build_process_is_killed(tmp_path: Path, caller: str) -> None:
    make_slides(tmp_path / "in", 2, seed=3, width=1024, height=1024)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_STALL)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {
        **os.environ,
        "WSISHARD_TEST_MARKS": str(marks),
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _BUILD, str(tmp_path / "in"), str(tmp_path / "out"), caller],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < deadline, "the workers never started scanning"
            time.sleep(0.05)
            workers = [int(p.name) for p in marks.iterdir()]
        assert all(map(_running, workers)) and proc.pid not in workers
        proc.kill()  # SIGKILL: no handler, no cleanup runs in the build's process
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30  # a bound for a loaded machine, not a speed requirement
        while any(map(_running, workers)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if _running(pid)], "workers outlived the build's process"
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in workers:  # what the old behaviour left running (and only that: not a pid reused since)
            with contextlib.suppress(OSError):
                if f"WSISHARD_TEST_MARKS={marks}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    os.kill(pid, signal.SIGKILL)
