"""The decode floor and a worker's per-stage costs for ``bench_stream.py`` (kept apart so that script stays readable).

Both run inside DataLoader worker processes started exactly as the loader's are (same start method, same parent
process state: a worker inherits the main process's heap, which decides whether PIL's per-image allocations
fault in fresh pages), on the same bytes the loader decodes (the build's own shards, read by its own reader).

:func:`decode_floor` decodes every JPEG of the build in a tight loop, per worker, with ``workers`` workers running at
once (the loader's conditions with that many workers): with PIL (``Image.open(...).convert("RGB")`` as a numpy
array) and with libjpeg-turbo through imagecodecs straight into one reused ``(h, w, 3)`` slot in huge-page memory
(the loader's own decode call, nothing else, into the fastest memory it has: huge pages, rows 16 bytes past a 32-byte
boundary as the loader's, see :func:`huge_page_slot`), alternating in rounds so that all see the same machine; and
the same libjpeg-turbo call into successive slots of the loader's own batch memory (:class:`_BatchSlots`: shared
memory with 4 KiB pages, a batch never in cache), which any loader that hands over batches has to write. Each
decoder's libjpeg-turbo version is reported.

:func:`stage_costs` runs a worker's pipeline over the build cut after each stage, CPU time per sample: reading the
tar members into samples, + the shuffle buffer, + the ``.json``/label, + the decode into a reused slot (header
check included), + batching into the reader's buffers (the main process's hand-back played in the worker; timed from
the second batch on, as a loader's worker makes its buffers before its first batch). The difference to a whole
loader's worker CPU per sample is the DataLoader's hand-off.
"""

from __future__ import annotations

import contextlib
import io
import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psutil
import torch

ROUNDS = 4  # floor rounds per decoder, interleaved
DECODERS = ("pil", "turbo", "turbo_batch")  # every floor's decoders (see the module's docstring)


def cpu_s(procs: list[psutil.Process]) -> float:
    """User plus system CPU seconds of ``procs`` so far (a process that has ended counts nothing)."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def huge_page_slot(shape: tuple[int, ...]) -> np.ndarray:
    """An uninitialised uint8 array of ``shape`` inside one 2 MiB-aligned stretch of a numpy allocation (numpy asks
    for transparent huge pages on large ones), starting where the loader's batches start relative to a 32-byte
    boundary (:data:`wsishard.streaming.ring.ROW_OFFSET`: a 32-byte aligned row makes libjpeg-turbo use slower
    non-temporal stores here): the fastest memory the floor's decoder can write into."""
    from wsishard.streaming.ring import ROW_OFFSET

    nbytes = math.prod(shape)
    huge = 2 << 20
    base = np.empty(nbytes + 2 * huge, dtype=np.uint8)
    start = -base.ctypes.data % huge + ROW_OFFSET
    return base[start : start + nbytes].reshape(shape)


def _blobs(shards_dir: str) -> list[bytes]:
    """Every sample's image bytes, in shard order, read by the stream's own reader."""
    from wsishard.streaming.sources import stream
    from wsishard.streaming.stages import read_shard

    ds = stream(shards_dir, batch_size=1, resampled=False, seed=0)
    return [raw["image"] for ref in ds.shards for raw in read_shard(ref, ds.opener)]


class _FloorProbe(torch.utils.data.IterableDataset[dict[str, Any]]):
    """In each worker: ``n`` decodes per decoder, ``ROUNDS`` interleaved rounds; yields one dict of timings."""

    def __init__(self, shards_dir: str, n: int, names: tuple[str, ...] = DECODERS) -> None:
        super().__init__()
        self.shards_dir, self.n, self.names = shards_dir, n, names

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import imagecodecs
        from PIL import Image

        blobs = _blobs(self.shards_dir)
        slot = huge_page_slot((*np.asarray(Image.open(io.BytesIO(blobs[0]))).shape[:2], 3))  # (h, w, 3) uint8

        def pil(data: bytes) -> None:
            np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))  # (h, w, 3) uint8

        def turbo(data: bytes) -> None:
            imagecodecs.jpeg8_decode(data, out=slot)

        into_batches = _BatchSlots((*slot.shape[:2], 3)) if "turbo_batch" in self.names else None

        def turbo_batch(data: bytes) -> None:
            imagecodecs.jpeg8_decode(data, out=into_batches.next())  # type: ignore[union-attr]

        every: dict[str, Callable[[bytes], None]] = {"pil": pil, "turbo": turbo, "turbo_batch": turbo_batch}
        decoders = {name: every[name] for name in self.names}
        per_round = max(self.n // ROUNDS, 1)
        for fn in decoders.values():
            for data in blobs[:50]:  # warm-up
                fn(data)
        wall = dict.fromkeys(decoders, 0.0)
        cpu = dict.fromkeys(decoders, 0.0)
        for r in range(ROUNDS):  # every image decoded once a round or more (n >= the build's samples)
            work = [blobs[(r * per_round + i) % len(blobs)] for i in range(per_round)]
            for name, fn in decoders.items():
                t0, c0 = time.perf_counter(), time.process_time()
                for data in work:
                    fn(data)
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
        done = per_round * ROUNDS
        yield {name: {"samples_per_s": done / wall[name], "cpu_samples_per_s": done / cpu[name]} for name in decoders}


class _BatchSlots:
    """Successive slots of batches in the loader's own batch memory: a worker's ring of shared-memory buffers
    (:class:`~wsishard.streaming.ring.BatchBuffers`, 4 KiB pages, made and faulted in before the first batch), three
    in turn as under a loader whose main process holds one batch while two are prefetched."""

    def __init__(self, hw_c: tuple[int, int, int], batch: int = 256) -> None:
        from wsishard.streaming.ring import BatchBuffers, Lending

        self.ring = BatchBuffers((batch, *hw_c), shared=True, lending=Lending(reuse=True, prefill=3))
        self.held: list[Any] = []  # tickets of the buffers "the main process" holds, oldest first
        self.batch, self.slots, self.i = batch, np.empty((0, *hw_c), dtype=np.uint8), batch

    def next(self) -> np.ndarray:
        if self.i == self.batch:
            image, ticket = self.ring.take()
            self.held.append(ticket)
            if len(self.held) > 2:
                old = self.held.pop(0)
                old.flags[old.slot] = 0  # handed back, as the main process does once a batch is let go
            self.slots, self.i = image.numpy(), 0
        self.i += 1
        return self.slots[self.i - 1]


def decode_floor(shards_dir: str, workers: int, n: int, decoders: tuple[str, ...] = DECODERS) -> dict[str, Any]:
    """Per-worker decode rates with ``workers`` decoding at once: mean over workers, for each of ``decoders``
    (PIL, libjpeg-turbo into one slot, libjpeg-turbo into batch memory)."""
    import imagecodecs
    from PIL import features

    dl = torch.utils.data.DataLoader(_FloorProbe(shards_dir, n, decoders), batch_size=None, num_workers=workers)
    results = list(dl)
    out: dict[str, Any] = {"workers": workers, "decodes_per_worker": n}
    for name in decoders:
        out[name] = {key: float(np.mean([r[name][key] for r in results])) for key in results[0][name]}
        out[name]["libjpeg_turbo"] = imagecodecs.jpeg8_version()
    if "pil" in out:
        out["pil"]["libjpeg_turbo"] = features.version("libjpeg_turbo") or "not libjpeg-turbo"
    return out


class _StageProbe(torch.utils.data.IterableDataset[dict[str, float]]):
    """In one worker: the pipeline over every shard, cut after each stage; yields CPU seconds per sample."""

    def __init__(self, shards_dir: str, batch: int, shuffle: int) -> None:
        super().__init__()
        self.shards_dir, self.batch, self.shuffle = shards_dir, batch, shuffle

    def __iter__(self) -> Iterator[dict[str, float]]:
        from wsishard.streaming.decode import DecodeIntoBatches, checked_label, decode_into
        from wsishard.streaming.sources import stream
        from wsishard.streaming.stages import read_shard, shuffled

        ds = stream(self.shards_dir, batch_size=self.batch, resampled=False, seed=0)
        n = int(ds.counts.sum())
        hw = ds.image_hw
        slot = huge_page_slot((*hw, 3))  # (h, w, 3) uint8, as the floor's

        def samples() -> Iterator[Any]:
            for i, ref in enumerate(ds.shards):
                yield from shuffled(read_shard(ref, ds.opener), self.shuffle, (0, i))

        def read() -> None:
            for ref in ds.shards:
                for _ in read_shard(ref, ds.opener):
                    pass

        def shuffle() -> None:
            for _ in samples():
                pass

        def fields() -> None:  # the loop's checks (the JSON parsed, the label)
            for raw in samples():
                checked_label(raw)

        def decode() -> None:
            for raw in samples():
                decode_into(raw, slot)

        def batches() -> tuple[float, int]:
            """Timed from the second batch on: the ring's buffer is made (its pages faulted in) with the first, as a
            loader's worker makes its buffers before its first batch."""
            made = DecodeIntoBatches(self.batch, hw, drop_last=False)(samples())
            _hand_back(next(made))
            c0, done = time.process_time(), 0
            for batch in made:
                done += len(batch["key"])
                _hand_back(batch)
            return time.process_time() - c0, done

        cuts: dict[str, Callable[[], tuple[float, int] | None]] = {"read": read, "+ shuffle": shuffle,
            "+ checks (json, header)": fields, "+ decode into slot": decode, "+ batches": batches}  # fmt: skip
        best = dict.fromkeys(cuts, float("inf"))
        for _ in range(3):  # the best of three passes (the first also warms the page cache): this VM drifts
            for name, fn in cuts.items():
                c0 = time.process_time()
                timed = fn()
                cpu, done = timed if timed is not None else (time.process_time() - c0, n)
                best[name] = min(best[name], cpu / done)
        yield best


def _hand_back(batch: Any) -> None:
    """Hand a batch's buffer back at once, as the main process does once a batch is let go."""
    ticket = batch.pop("buffer", None)
    if ticket is not None:
        ticket.flags[ticket.slot] = 0


def stage_costs(shards_dir: str, batch: int, shuffle: int = 1000) -> dict[str, float]:
    """CPU seconds per sample of a worker's pipeline cut after each stage (cumulative), in one DataLoader worker."""
    dl = torch.utils.data.DataLoader(_StageProbe(shards_dir, batch, shuffle), batch_size=None, num_workers=1)
    return next(iter(dl))
