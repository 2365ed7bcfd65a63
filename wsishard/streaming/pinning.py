"""The workers' batch buffers page-locked in place, so that CUDA copies read straight from them.

DataLoader's ``pin_memory`` copies every batch into fresh page-locked memory in a thread of the main process (a batch
of 256 patches of 256 px is 50 MB), which can hold many workers back. The ring's buffers are reused
(:mod:`wsishard.streaming.ring`), so :class:`HostPins` registers each once with CUDA (``cudaHostRegister``: the
same shared pages, page-locked where they are) and no batch is copied: ``batch["image"].is_pinned()`` is True
and ``.to("cuda", non_blocking=True)`` reads the worker's buffer itself.

Such a copy may still be queued when the training loop asks for the next batch. A buffer is therefore handed back to
its worker only once the work queued on the current CUDA stream (of the current device: bind each rank to its GPU
with ``torch.cuda.set_device``, as ``examples/train_ddp.py`` does) at that moment has finished, an event recorded
then, on the thread that iterates the loader; a copy queued on another stream (``nn.DataParallel``'s scatter, a
prefetch thread of one's own) is the caller's to synchronise. Before the buffers are unregistered the device is
synchronised. What stays page-locked is the rings' buffers, at most ``RING_SLOTS`` (8) a worker, for as long as the
loader's iterator runs.

Where registering fails (an old driver, a limit on locked memory), the batches stay unpinned and correct:
:class:`~wsishard.streaming.collate.GpuCollate` then pins a copy itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import torch

__all__ = ["Cuda", "HostPins"]

logger = logging.getLogger(__name__)
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Cuda:
    """The CUDA calls :class:`HostPins` makes (tests give it stand-ins)."""

    register: Callable[[int, int], int]  # (pointer, bytes) -> CUDA error code, 0 for success
    unregister: Callable[[int], int]  # pointer -> CUDA error code
    event: Callable[[], Any]  # a new event with record(), query() and synchronize()
    synchronize: Callable[[], None]  # wait for all work on the device


def cuda_runtime() -> Cuda | None:
    """The real calls, or None where no CUDA device is there. CUDA is initialised at the first call made, not here
    (a loader made before the process forks others that use CUDA must not have started it)."""
    if not torch.cuda.is_available():
        return None
    return Cuda(
        register=lambda ptr, n: int(torch.cuda.cudart().cudaHostRegister(ptr, n, 0)),
        unregister=lambda ptr: int(torch.cuda.cudart().cudaHostUnregister(ptr)),
        event=torch.cuda.Event,
        synchronize=torch.cuda.synchronize,
    )


class HostPins(Generic[K]):
    """Buffers page-locked in place until :meth:`close`, and the hand-backs that wait for queued copies. The buffers
    must stay mapped until then.

    Args:
        cuda: the CUDA calls (:func:`cuda_runtime`).
    """

    def __init__(self, cuda: Cuda) -> None:
        self._cuda = cuda
        # the registered buffers' pointers (their owner keeps them mapped until close())
        self._pinned: set[int] = set()
        self._waiting: list[tuple[Any, list[K]]] = []  # (event, the keys let go when it was recorded)
        self.failed = ""  # why registering failed once (then nothing more is registered)

    def register(self, storage: torch.UntypedStorage) -> bool:
        """Page-lock ``storage`` in place (once); False where CUDA refused it."""
        ptr = storage.data_ptr()
        if ptr in self._pinned:
            return True
        if self.failed:
            return False
        try:
            err: int | str = self._cuda.register(ptr, storage.nbytes())
        except (AttributeError, RuntimeError, AssertionError) as exc:  # a torch without cudart's bindings
            err = f"{type(exc).__name__}: {exc}"
        if err:
            self.failed = f"cudaHostRegister of a {storage.nbytes()} byte batch buffer failed with CUDA error {err}"
            logger.warning("%s: batches stay unpinned (GpuCollate pins a copy of each)", self.failed)
            return False
        self._pinned.add(ptr)
        return True

    def after_queued_work(self, keys: Iterable[K]) -> list[K]:
        """Keys let go now (their buffers no longer referred to here) -> the keys whose buffers may go back: those
        whose copies, queued before they were let go, have finished."""
        keys = list(keys)
        if keys:
            event = self._cuda.event()
            event.record()
            self._waiting.append((event, keys))
        done: list[K] = []
        while self._waiting and self._waiting[0][0].query():
            done += self._waiting.pop(0)[1]
        return done

    def close(self) -> list[K]:
        """Wait for every queued copy, unregister every buffer; the keys still waiting (all may go back now)."""
        done = [key for _, keys in self._waiting for key in keys]
        self._waiting.clear()
        if self._pinned:
            try:  # also while an error of the loop's is on its way out, or CUDA is going down with the process
                self._cuda.synchronize()
                for ptr in self._pinned:
                    self._cuda.unregister(ptr)
            except Exception as exc:  # never mask the error on its way out: say this one and go on
                logger.warning("unpinning the loader's batch buffers failed: %s: %s", type(exc).__name__, exc)
            self._pinned.clear()
        return done

    def __len__(self) -> int:
        return len(self._pinned)
