"""Is my GPU starved? Throughput and data-wait monitoring around any loader.

:class:`MonitoredLoader` times how long the training loop blocks in ``next(loader)`` versus the whole step.
A data-wait fraction near 0 means the loader keeps up; near 1 means the model waits for data. The step
time is measured on the CPU: when the loop synchronizes with the GPU once per step (``loss.item()``, a DDP
all-reduce, an optimizer step that reads a scalar), it is the GPU's step time too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypedDict

from wsishard.streaming.world import detect_world

logger = logging.getLogger(__name__)

__all__ = ["LoaderReport", "MonitoredLoader"]


class LoaderReport(TypedDict):
    """One report, over the ``steps`` batches since the previous one (or over the whole run)."""

    rank: int
    step: int  # batches yielded so far
    steps: int  # batches in this window
    samples_per_s: float
    batches_per_s: float
    data_wait_fraction: float  # time blocked in next(loader) / wall time of the window
    window_s: float
    startup_s: float  # time to the first batch (worker start-up), excluded from the windows


def _batch_len(batch: Any) -> int:
    if isinstance(batch, dict):
        for value in batch.values():
            if hasattr(value, "shape") and len(value.shape) > 0:
                return int(value.shape[0])
            if isinstance(value, list):
                return len(value)
    return len(batch) if hasattr(batch, "__len__") else 1


class MonitoredLoader:
    """Wrap a loader; every ``every`` batches compute a :class:`LoaderReport` for this rank.

    Every rank computes its own reports (``last``, the ``on_report`` callback); only rank 0 logs them
    (logger ``wsishard.streaming.monitor``, level INFO). Time to the first batch is reported as ``startup_s`` and
    left out of the windows.

    Args:
        loader: any iterable of batches (dicts with a leading batch dimension, or sized batches).
        every: batches per report window, >= 1.
        rank: this process's rank; detected (torch.distributed / torchrun) when None.
        on_report: called with each report, on every rank.

    Raises:
        ValueError: ``every`` below 1.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        *,
        every: int = 100,
        rank: int | None = None,
        on_report: Callable[[LoaderReport], None] | None = None,
    ) -> None:
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        if rank is None:
            rank = detect_world().rank
        self.loader = loader
        self.every = every
        self.rank = rank
        self.on_report = on_report
        self.last: LoaderReport | None = None
        self.step = 0
        self.startup_s = 0.0
        self._window = [0.0, 0.0, 0, 0]  # wall s, wait s, batches, samples
        self._total = [0.0, 0.0, 0, 0]

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.loader)
        start = time.perf_counter()
        last: float | None = None
        while True:
            before = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            now = time.perf_counter()
            self.step += 1
            if last is None:  # the first batch of a pass waits for worker start-up
                self.startup_s = now - start
            else:
                self._add(now - last, now - before, _batch_len(batch))
            last = now
            yield batch

    def _add(self, wall: float, wait: float, samples: int) -> None:
        for acc in (self._window, self._total):
            acc[0], acc[1], acc[2], acc[3] = acc[0] + wall, acc[1] + wait, acc[2] + 1, acc[3] + samples
        if self._window[2] < self.every:
            return
        self.last = self._make(*self._window)
        self._window = [0.0, 0.0, 0, 0]
        if self.on_report is not None:
            self.on_report(self.last)
        if self.rank == 0:
            logger.info(
                "step %d: %.1f samples/s, %.2f batches/s, data wait %.0f%%",
                self.step,
                self.last["samples_per_s"],
                self.last["batches_per_s"],
                100 * self.last["data_wait_fraction"],
            )

    def _make(self, wall: float, wait: float, batches: float, samples: float) -> LoaderReport:
        wall = max(wall, 1e-9)
        return LoaderReport(
            rank=self.rank,
            step=self.step,
            steps=int(batches),
            samples_per_s=samples / wall,
            batches_per_s=batches / wall,
            data_wait_fraction=min(wait / wall, 1.0),
            window_s=wall,
            startup_s=self.startup_s,
        )

    def summary(self) -> LoaderReport:
        """Totals over every batch so far (start-up excluded)."""
        return self._make(*self._total)
