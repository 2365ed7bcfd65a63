"""The loader alone against the libjpeg-turbo floor in interleaved pairs of short slices (bench_stream's steadier
second reading).

Each round of bench_stream measures a floor, then a whole loader run, then the floor again: steps of 1.5-2.5 s, and
this machine's speed moves by 10% within seconds, so a round's ratio swings by as much and a five-round median lands
a few percent either side. Here one loader stays alive and is paused between slices: in each pair, once its workers
are idle (their prefetched batches made), ``w`` floor processes decode the same number of JPEGs per worker as the
loader's slice will make, all at once, into one hot slot each; then the loader's prefetched batches are taken
(untimed), one more batch per worker brings it to its steady state, and the next ``k`` batches are timed. A pair's
ratio is the loader's samples/s per worker over the floor's per process; slices of about half a second, many pairs.
Pausing the loader costs it, if anything: the floor has run on its cores in between.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import psutil
from streambench_floor import cpu_s


def _floor_process(shards_dir: str, conn: Connection) -> None:
    """A floor process: decode the build's JPEGs by libjpeg-turbo into one hot slot, ``n`` at a time on request,
    answering with the seconds each request took."""
    import imagecodecs
    from streambench_floor import _blobs, huge_page_slot

    blobs = _blobs(shards_dir)
    slot = huge_page_slot((*imagecodecs.jpeg8_decode(blobs[0]).shape[:2], 3))  # (h, w, 3) uint8
    for data in blobs[:50]:  # warm-up
        imagecodecs.jpeg8_decode(data, out=slot)
    pos = 0
    conn.send("ready")
    while (n := conn.recv()) is not None:
        t0 = time.perf_counter()
        for i in range(n):
            imagecodecs.jpeg8_decode(blobs[(pos + i) % len(blobs)], out=slot)
        pos += n
        conn.send(time.perf_counter() - t0)


def _wait_idle(procs: list[psutil.Process], poll_s: float = 0.05, limit_s: float = 60.0) -> None:
    """Until the processes use no CPU over ``poll_s`` (the loader's workers, their prefetched batches made).

    Raises:
        RuntimeError: still busy after ``limit_s`` (a worker that never rests would otherwise hang the benchmark).
    """
    last, deadline = cpu_s(procs), time.monotonic() + limit_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        now = cpu_s(procs)
        if now == last:
            return
        last = now
    raise RuntimeError(f"the loader's workers were still busy after {limit_s:.0f} s; no pair can be timed")


def interleaved(source: str, workers: int, pairs: int, k: int, *, batch: int, seed: int) -> dict[str, Any]:
    """``pairs`` pairs of (floor slice, loader slice) with ``workers`` workers; ``k`` timed batches a loader slice.

    Returns the per-pair ratios (loader samples/s per worker over floor samples/s per process) and both rates.
    """
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    ctx = mp.get_context("fork")
    pool: list[tuple[Any, Connection]] = []
    for _ in range(workers):
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_floor_process, args=(source, theirs), daemon=True)
        proc.start()
        pool.append((proc, ours))
    for _, conn in pool:
        conn.recv()  # ready
    floor_pids = {proc.pid for proc, _ in pool}
    prefetch = 2  # DataLoader's default, as the benchmark's other loader runs
    dl = loader(stream(source, batch_size=batch, resampled=True, seed=seed), num_workers=workers,
                prefetch_factor=prefetch)  # fmt: skip
    it = iter(dl)
    try:
        for _ in range(3 * workers):  # warm-up: the workers' rings made, their first batches
            next(it)
        procs = [p for p in psutil.Process().children() if p.pid not in floor_pids]
        n_floor = k * batch // workers  # per floor process: as many as each loader worker makes in a slice
        floor, load = [], []
        for _ in range(pairs):
            _wait_idle(procs)
            for _, conn in pool:
                conn.send(n_floor)
            floor.append(float(np.mean([n_floor / conn.recv() for _, conn in pool])))
            for _ in range(prefetch * workers + workers):  # the prefetched batches, then into the steady state
                next(it)
            t0 = time.perf_counter()
            for _ in range(k):
                next(it)
            load.append(k * batch / (time.perf_counter() - t0) / workers)
    finally:
        del it  # shuts the loader's workers down
        for proc, conn in pool:
            conn.send(None)
            proc.join(timeout=10)
    ratios = [lo / fl for lo, fl in zip(load, floor, strict=True)]
    return {"workers": workers, "pairs": pairs, "k": k, "ratios": ratios, "floor_per_worker": floor,
            "loader_per_worker": load}  # fmt: skip
