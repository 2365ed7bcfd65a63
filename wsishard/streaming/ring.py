"""Batch buffers reused instead of allocated anew for every batch.

A fresh ``(256, 256, 256, 3)`` uint8 batch is 50 MB of new pages: in shared memory (a DataLoader worker) the first
write to each of its 12,288 pages faults, about 0.14 ms a sample, half of a JPEG's decode. A reader therefore
keeps a few buffers and fills one again once nothing uses it any more:

- In the process that consumes the batches (no worker), a buffer is free again when no tensor, view, numpy
  array or Python name refers to its storage but the ring's own.
- In a DataLoader worker, the worker cannot see what the main process holds: each batch it lends carries a
  :class:`Lent` ticket (the buffer, a slot, and a small shared flag array). The main process keeps the tickets
  (:class:`Returns`, kept by :class:`~wsishard.streaming.loader.ShardLoader`) and clears a slot's flag once
  nothing in the main process refers to the buffer any more; the worker fills only buffers whose flag is clear.
  Under ``ShardLoader`` (without pinned memory) a buffer travels to the main process once, with its first batch;
  later batches of it only name it (:class:`Lent`, by reference) and ``Returns`` gives them their image.

A buffer is never filled while anything that can see it may still read it. When every buffer is in use (a
consumer that keeps its batches, or one that never hands buffers back, such as a plain DataLoader over the
stream), the reader allocates a fresh batch as before: slower, never blocked. The use count of a storage is
read through ``torch._C._storage_Use_Count``; without it (another torch) nothing is ever reused.
"""

from __future__ import annotations

import ctypes
import math
import os
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from wsishard.streaming.pinning import HostPins

__all__ = ["ROW_OFFSET", "BatchBuffers", "Lending", "Lent", "Returns", "unused"]

_use_count: Any = getattr(torch._C, "_storage_Use_Count", None)
RING_SLOTS = 8  # buffers a reader keeps at most: 1 being filled, prefetched ones, the ones the loop still holds
# A batch starts 16 bytes past a 32-byte boundary (so does every image and row of it when the row's bytes are a multiple
# of 32, as for 256 px): libjpeg-turbo's SIMD colour conversion writes a 32-byte aligned output row with non-temporal
# stores, which on this project's VM made the whole decode ~25% slower (about 250 against 200 us a 256 px JPEG).
ROW_OFFSET = 16
ROW_SLACK = 32  # bytes a buffer holds beyond its batch, for that offset


def _ring_number() -> int:
    """A ring's number, drawn at random: a count would start again at 0 in every forked worker, and a worker of a
    later pass that got a finished worker's pid would then name a ring the main process still holds."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def _refs(holder: Any, key: Any) -> int:
    storage = holder[key]
    return sys.getrefcount(storage)


_ALONE = _refs([torch.UntypedStorage(1)], 0)  # what _refs counts for a storage its holder alone refers to


def unused(holder: Any, key: Any) -> bool:
    """True when nothing refers to the storage ``holder[key]`` but ``holder``: no tensor or view of it (a numpy
    array of a tensor holds the tensor) and no other Python name for the storage object itself."""
    if _use_count is None:
        return False
    return bool(_use_count(holder[key]._cdata) == 1) and _refs(holder, key) == _ALONE


def _new_storage(nbytes: int, shared: bool, populate: bool = False) -> torch.UntypedStorage:
    """``nbytes`` uninitialised bytes: in shared memory (a worker: handing it to the main process then passes a
    file descriptor, no copy), or numpy's allocation (which asks for transparent huge pages: a fresh 50 MB batch
    takes far fewer page faults than with torch's allocator). ``populate``: shared pages faulted in at once."""
    if not shared:
        return torch.from_numpy(np.empty(nbytes, dtype=np.uint8)).untyped_storage()
    storage = torch.UntypedStorage._new_shared(nbytes)
    if populate and _madvise is not None:  # where the kernel lacks it (before Linux 5.14) pages fault on first write
        _madvise(ctypes.c_void_p(storage.data_ptr()), ctypes.c_size_t(nbytes), _MADV_POPULATE_WRITE)
    return storage


def _libc_madvise() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).madvise if sys.platform == "linux" else None
    except (OSError, AttributeError):
        return None


_madvise = _libc_madvise()
_MADV_POPULATE_WRITE = 23  # linux/mman.h


def _view(storage: torch.UntypedStorage, shape: tuple[int, ...]) -> torch.Tensor:
    """The batch of ``shape`` in ``storage`` (:data:`ROW_SLACK` bytes longer), starting :data:`ROW_OFFSET` bytes past
    a 32-byte boundary."""
    return _at(storage, (ROW_OFFSET - storage.data_ptr()) % 32, shape)


def _at(storage: torch.UntypedStorage, start: int, shape: tuple[int, ...]) -> torch.Tensor:
    """A contiguous uint8 tensor of ``shape`` in ``storage`` from byte ``start`` on."""
    strides = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
    return torch.empty(0, dtype=torch.uint8).set_(storage, start, shape, strides)


Ring = tuple[int, int]  # (worker pid, the ring's random number): names a ring in the main process


@dataclass(frozen=True)
class Lending:
    """How a worker's ring lends its buffers (set by :class:`~wsishard.streaming.loader.ShardLoader` for its workers).

    Attributes:
        by_reference: a buffer crosses to the main process with its first batch only (see :class:`Lent`).
        prefill: buffers made before the first batch, their pages faulted in at once (``MADV_POPULATE_WRITE``,
            about half the cost of faulting 12,288 pages one by one), rather than while the first batches are made.
    """

    by_reference: bool = False
    prefill: int = 0


@dataclass(frozen=True)
class Lent:
    """A worker's buffer lent to the main process, which hands it back by clearing its ring's flag of ``slot``.

    By tensor (a plain DataLoader, pinned memory, another ``collate_fn``): ``image`` is the batch's own image tensor
    (pickled once with it, so the main process sees the buffer even after a pin-memory thread replaced the batch's
    image by a pinned copy) and ``flags`` the ring's flags, with every batch. By reference
    (:attr:`Lending.by_reference`, only under :class:`~wsishard.streaming.loader.ShardLoader`): the batch itself
    carries no image, ``image`` comes with a buffer's first batch only and ``flags`` with the ring's first; later
    batches name their buffer by ``ring`` and ``slot``, and ``shape``/``start`` place the batch in it (each tensor
    pickled would pass a file descriptor, ~0.4 ms of socket round trip between the processes, even for memory the
    main process has mapped already).
    """

    ring: Ring
    slot: int
    flags: torch.Tensor | None  # (slots,) uint8 in shared memory: 1 while the main process may use the buffer
    image: torch.Tensor | None  # (b, h, w, 3) uint8, the batch in the buffer
    shape: tuple[int, ...] | None = None  # by reference: the batch's (b, h, w, 3)
    start: int = 0  # by reference: the batch's first byte in the buffer


class BatchBuffers:
    """Up to :data:`RING_SLOTS` uint8 buffers of ``shape`` (``(b, h, w, 3)``), taken in turn by one reader.

    Args:
        shape: every buffer's shape.
        shared: in a DataLoader worker: buffers in shared memory, lent with a :class:`Lent` ticket.
        lending: in a worker, how buffers are lent (:class:`Lending`).
    """

    def __init__(self, shape: tuple[int, ...], shared: bool, slots: int = RING_SLOTS,
                 lending: Lending = Lending()) -> None:  # fmt: skip
        self.shape = shape
        self.shared = shared
        self.slots = slots
        self.by_reference = lending.by_reference and shared
        self.ring: Ring = (os.getpid(), _ring_number())
        self.storages: list[torch.UntypedStorage] = []
        if shared and _use_count is not None:
            self.storages = [_new_storage(math.prod(shape) + ROW_SLACK, shared, populate=True)
                             for _ in range(min(lending.prefill, slots))]  # fmt: skip
        self.fresh = 0  # batches allocated outside the ring because every buffer was in use
        self.flags = torch.zeros(slots, dtype=torch.uint8).share_memory_() if shared else torch.zeros(0)
        self._flags = self.flags.numpy()
        self._sent: set[int] = set()  # by reference: the slots whose buffer the main process was sent

    def take(self) -> tuple[torch.Tensor, Lent | None]:
        """A buffer to fill: a free one of the ring, a new one while the ring has room, else a fresh batch (no
        ticket). In a worker the buffer counts as lent from here on, until the main process hands it back."""
        for slot in range(len(self.storages)):
            if (not self._flags[slot]) if self.shared else unused(self.storages, slot):
                return self._lend(slot)
        nbytes = math.prod(self.shape) + ROW_SLACK
        if len(self.storages) < self.slots and _use_count is not None:
            self.storages.append(_new_storage(nbytes, self.shared))
            return self._lend(len(self.storages) - 1)
        self.fresh += 1
        return _view(_new_storage(nbytes, self.shared), self.shape), None

    def _lend(self, slot: int) -> tuple[torch.Tensor, Lent | None]:
        image = _view(self.storages[slot], self.shape)
        if not self.shared:
            return image, None
        self._flags[slot] = 1
        return image, Lent(self.ring, slot, self.flags, image)

    def hand_over(self, image: torch.Tensor, ticket: Lent) -> tuple[torch.Tensor | None, Lent]:
        """What a batch of ``image`` (the buffer of ``ticket``, or its first rows) sends the main process: its image
        tensor and ticket, or by reference no image and a ticket naming the buffer."""
        if not self.by_reference:
            return image, ticket
        first_of_ring, first = not self._sent, ticket.slot not in self._sent
        self._sent.add(ticket.slot)
        return None, Lent(self.ring, ticket.slot, self.flags if first_of_ring else None, image if first else None,
                          tuple(image.shape), int(image.storage_offset()))  # fmt: skip


class Returns:
    """In the main process: the buffers workers lent, each handed back once nothing here refers to it.

    The storages stay referenced here while the loader runs (no memory of their own: they are the workers'
    shared memory), so a buffer that comes back is the same mapping and costs the main process no page faults.
    """

    def __init__(self, pins: HostPins[tuple[Ring, int]] | None = None) -> None:
        self._storages: dict[tuple[Ring, int], torch.UntypedStorage] = {}  # (ring, slot) -> the buffer
        self._rings: dict[Ring, np.ndarray] = {}  # ring -> its flags (a numpy view, which keeps their tensor)
        self._lent: set[tuple[Ring, int]] = set()
        self._pins = pins  # buffers sent by reference page-locked in place (CUDA), handed back after queued copies

    def add(self, ticket: Lent) -> torch.Tensor | None:
        """Take a batch's ticket; by reference, the batch's image (a view of the buffer), else None (the batch
        carries its own image tensor).

        Raises:
            ValueError: a ticket by reference for a buffer or ring never sent (its first batch did not come here).
        """
        key = (ticket.ring, ticket.slot)
        if ticket.flags is not None and ticket.ring not in self._rings:
            self._rings[ticket.ring] = ticket.flags.numpy()
        if ticket.image is not None:
            self._storages[key] = ticket.image.untyped_storage()
            if self._pins is not None and ticket.shape is not None:  # by reference: the same buffer from now on
                self._pins.register(self._storages[key])
        if key not in self._storages or ticket.ring not in self._rings:
            raise ValueError(f"buffer {ticket.slot} of ring {ticket.ring} was never sent to this process")
        self._lent.add(key)
        if ticket.shape is None:
            return None
        return _at(self._storages[key], ticket.start, ticket.shape)

    def sweep(self) -> int:
        """Hand back every lent buffer nothing refers to any more; the number handed back."""
        back = [key for key in self._lent if unused(self._storages, key)]
        self._lent.difference_update(back)
        if self._pins is not None:  # only once the copies queued from them have finished
            back = self._pins.after_queued_work(back)
        for ring, slot in back:
            self._rings[ring][slot] = 0
        return len(back)

    def close(self) -> None:
        """Unpin the buffers (after the queued copies): the loader is done with its workers."""
        if self._pins is not None:
            for ring, slot in self._pins.close():
                self._rings[ring][slot] = 0

    def __len__(self) -> int:
        return len(self._lent)
