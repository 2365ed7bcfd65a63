"""Batch buffers reused instead of allocated anew for every batch.

A fresh ``(256, 256, 256, 3)`` uint8 batch is 50 MB of new pages, and faulting them in costs about as much as
decoding the batch's JPEGs. A reader under :class:`~wsishard.streaming.loader.ShardLoader` therefore keeps a ring of
a few buffers and fills one again once the training loop is done with it.

The ownership rule (:class:`Lending` ``reuse=True``, set by ``ShardLoader``): **a batch's images are valid until the
loop takes the next batch.** Keep a batch longer (a list of batches, a batch queued for another thread) and copy
its image (``batch["image"].clone()``), or build the loader with ``reuse_buffers=False``.

- In the process that consumes the batches (no worker), the ring alternates between two buffers: the batch being
  filled never is the one the loop holds.
- In a DataLoader worker, the worker cannot see what the main process does: each batch it lends carries a
  :class:`Lent` ticket (the buffer, a slot, and a small shared flag array). The main process keeps the tickets
  (:class:`Returns`, kept by ``ShardLoader``) and clears every flag it holds when the loop asks for the next batch;
  the worker fills only buffers whose flag is clear. Under ``ShardLoader`` (without pinned memory) a buffer
  travels to the main process once, with its first batch; later batches of it only name it (:class:`Lent` by
  reference) and ``Returns`` gives them their image.

Without ``reuse`` (iterating a :class:`~wsishard.streaming.dataset.ShardStream` directly, a plain DataLoader over
it, ``reuse_buffers=False``) every batch is a fresh buffer that belongs to its receiver.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from wsishard.streaming.pinning import HostPins

__all__ = ["ROW_OFFSET", "UNLENT", "BatchBuffers", "Handed", "Lending", "Lent", "Returns", "Tagged"]

RING_SLOTS = 8  # buffers a worker keeps at most: 1 being filled, prefetched ones, the ones on their way to the loop
# A batch starts 16 bytes past a 32-byte boundary (so does every image and row of it when the row's bytes are a multiple
# of 32, as for 256 px): libjpeg-turbo's SIMD colour conversion writes a 32-byte aligned output row with non-temporal
# stores, which makes the whole decode markedly slower.
ROW_OFFSET = 16
ROW_SLACK = 32  # bytes a buffer holds beyond its batch, for that offset


def _ring_number() -> int:
    """A ring's number, drawn at random: a count would start again at 0 in every forked worker, and a worker of a
    later pass that got a finished worker's pid would then name a ring the main process still holds."""
    return int.from_bytes(os.urandom(8), "little") >> 1


def _new_storage(nbytes: int, shared: bool) -> torch.UntypedStorage:
    """``nbytes`` bytes: in shared memory (a worker: handing it to the main process then passes a file descriptor,
    no copy; its pages are faulted in here, once), or numpy's allocation (which asks for transparent huge pages:
    a fresh 50 MB batch takes far fewer page faults than with torch's allocator)."""
    local = torch.from_numpy(np.empty(nbytes, dtype=np.uint8))
    return (local.share_memory_() if shared else local).untyped_storage()


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
    """How a reader's ring lends its buffers (set by :class:`~wsishard.streaming.loader.ShardLoader`).

    Attributes:
        reuse: buffers are filled again under the ownership rule (module docstring); without it every batch is a
            fresh buffer of its own.
        by_reference: in a worker, a buffer crosses to the main process with its first batch only (see :class:`Lent`).
        prefill: in a worker, buffers made before the first batch, rather than while the first batches are made.
        encoded: batches of the samples' JPEG bytes, no pixels (``loader(..., decode="device")``: decoded by
            :class:`~wsishard.streaming.collate.GpuCollate` on the GPU); no buffer is lent.
    """

    reuse: bool = False
    by_reference: bool = False
    prefill: int = 0
    encoded: bool = False


@dataclass(frozen=True)
class Lent:
    """A worker's buffer lent to the main process, which hands it back by clearing its ring's flag of ``slot``.

    By tensor (pinned memory by DataLoader's thread): ``image`` is the batch's own image tensor and ``flags`` the
    ring's flags, with every batch. By reference (:attr:`Lending.by_reference`): the batch itself carries no image,
    ``image`` comes with a buffer's first batch only and ``flags`` with the ring's first; later batches name their
    buffer by ``ring`` and ``slot``, and ``shape``/``start`` place the batch in it (each tensor pickled would pass a
    file descriptor between the processes, even for memory the main process has mapped already).
    """

    ring: Ring
    slot: int
    flags: torch.Tensor | None  # (slots,) uint8 in shared memory: 1 while the main process may use the buffer
    image: torch.Tensor | None  # (b, h, w, 3) uint8, the batch in the buffer
    shape: tuple[int, ...] | None = None  # by reference: the batch's (b, h, w, 3)
    start: int = 0  # by reference: the batch's first byte in the buffer
    context_shape: tuple[int, ...] | None = None  # by reference, with context: the batch's (b, K, h, w, 3)
    context_start: int = 0  # by reference: the context's first byte in the buffer


class Handed(dict[str, Any]):
    """A batch on its way from a DataLoader worker to :class:`~wsishard.streaming.loader.ShardLoader`: a plain dict
    of the batch's keys, with what only the loader reads as attributes (they pickle with it), never as keys:
    ``ticket``, the :class:`Lent` buffer the batch lies in (None: a buffer of its own), ``worker``, the logical
    worker that made it, and ``position``, the items of its plan that worker had passed after it. The loader yields
    a plain ``dict`` of the keys."""

    ticket: Lent | None = None
    worker: int = 0
    position: int | None = None


class Tagged(NamedTuple):
    """What a ``collate_fn`` of the user's made of a :class:`Handed` batch, with the batch's ``worker`` and
    ``position`` carried beside it (a NamedTuple: DataLoader's ``pin_memory`` pins ``value`` and keeps the rest)."""

    value: Any
    worker: int
    position: int | None


UNLENT = Lending()  # no reuse: every batch a fresh buffer of its own


class BatchBuffers:
    """The uint8 buffers of ``shape`` (``(b, h, w, 3)``) one reader fills with its batches, and with
    ``context_shape`` (``(b, K, h', w', 3)``) each batch's context patches in the same buffer, after its images
    (:meth:`context_of`): lent, pinned and handed back with them.

    Without :attr:`Lending.reuse`, every batch is a fresh buffer. With it: in-process, two buffers in turn; in a
    worker, up to ``slots`` buffers, each lent until the main process hands it back, and a fresh batch when every
    one is lent (slower, never blocked).

    Args:
        shape: every buffer's shape.
        shared: in a DataLoader worker: buffers in shared memory, lent with a :class:`Lent` ticket.
        slots: buffers a worker's ring keeps at most.
        lending: how buffers are lent (:class:`Lending`).
        context_shape: each batch's context, or None.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        shared: bool,
        slots: int = RING_SLOTS,
        lending: Lending = UNLENT,
        context_shape: tuple[int, ...] | None = None,
    ) -> None:
        self.shape = shape
        self.context_shape = context_shape
        self.image_bytes = -(-math.prod(shape) // 32) * 32  # the context starts as the images do, past a boundary
        self.shared = shared
        self.reuse = lending.reuse
        self.slots = slots if shared else 2
        self.by_reference = lending.by_reference and shared and self.reuse
        self.ring: Ring = (os.getpid(), _ring_number())
        body = math.prod(shape) if context_shape is None else self.image_bytes + math.prod(context_shape)
        self.nbytes = body + ROW_SLACK
        self.storages: list[torch.UntypedStorage] = []
        if shared and self.reuse:
            self.storages = [_new_storage(self.nbytes, shared) for _ in range(min(lending.prefill, slots))]
        self.fresh = 0  # worker: batches allocated outside the ring because every buffer was lent
        self.flags = torch.zeros(slots, dtype=torch.uint8).share_memory_() if shared else torch.zeros(0)
        self._flags = self.flags.numpy()
        self._sent: set[int] = set()  # by reference: the slots whose buffer the main process was sent
        self._turn = 0  # in-process: the buffer of the next batch

    def take(self) -> tuple[torch.Tensor, Lent | None]:
        """A buffer to fill (module docstring). In a worker the buffer counts as lent from here on, until the main
        process hands it back; the ticket is None for a buffer that is not the ring's."""
        if not self.reuse:
            return _view(_new_storage(self.nbytes, self.shared), self.shape), None
        if not self.shared:
            slot, self._turn = self._turn, (self._turn + 1) % self.slots
            if slot == len(self.storages):
                self.storages.append(_new_storage(self.nbytes, False))
            return _view(self.storages[slot], self.shape), None
        for slot in range(len(self.storages)):
            if not self._flags[slot]:
                return self._lend(slot)
        if len(self.storages) < self.slots:
            self.storages.append(_new_storage(self.nbytes, self.shared))
            return self._lend(len(self.storages) - 1)
        self.fresh += 1
        return _view(_new_storage(self.nbytes, self.shared), self.shape), None

    def _lend(self, slot: int) -> tuple[torch.Tensor, Lent]:
        image = _view(self.storages[slot], self.shape)
        self._flags[slot] = 1
        return image, Lent(self.ring, slot, self.flags, image)

    def context_of(self, image: torch.Tensor) -> torch.Tensor:
        """The context of the batch whose images are ``image`` (a buffer :meth:`take` gave): (b, K, h', w', 3)
        uint8 in the same buffer, after the images."""
        assert self.context_shape is not None, "a ring without context"
        return _at(image.untyped_storage(), int(image.storage_offset()) + self.image_bytes, self.context_shape)

    def hand_over(
        self, image: torch.Tensor, ticket: Lent, context: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, Lent]:
        """What a batch of ``image`` (the buffer of ``ticket``, or its first rows) and ``context`` (its context, in
        the same buffer) sends the main process: its image tensor and ticket, or by reference no image and a ticket
        naming the buffer (and where the image and the context lie in it)."""
        if not self.by_reference:
            return image, ticket
        first_of_ring, first = not self._sent, ticket.slot not in self._sent
        self._sent.add(ticket.slot)
        flags = self.flags if first_of_ring else None
        placed = () if context is None else (tuple(context.shape), int(context.storage_offset()))
        return None, Lent(
            self.ring,
            ticket.slot,
            flags,
            image if first else None,
            tuple(image.shape),
            int(image.storage_offset()),
            *placed,
        )


class Returns:
    """In the main process: the buffers workers lent, handed back when the loop asks for the next batch.

    The storages stay referenced here while the loader runs (no memory of their own: they are the workers'
    shared memory), so a buffer that comes back is the same mapping and costs the main process no page faults.
    """

    def __init__(self, pins: HostPins[tuple[Ring, int]] | None = None) -> None:
        self._buffers_by_slot: dict[tuple[Ring, int], torch.UntypedStorage] = {}  # (ring, slot) -> the buffer
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
            self._buffers_by_slot[key] = ticket.image.untyped_storage()
            if self._pins is not None and ticket.shape is not None:  # by reference: the same buffer from now on
                self._pins.register(self._buffers_by_slot[key])
        if key not in self._buffers_by_slot or ticket.ring not in self._rings:
            raise ValueError(f"buffer {ticket.slot} of ring {ticket.ring} was never sent to this process")
        self._lent.add(key)
        if ticket.shape is None:
            return None
        return _at(self._buffers_by_slot[key], ticket.start, ticket.shape)

    def context(self, ticket: Lent) -> torch.Tensor | None:
        """By reference, the context of a batch whose ticket :meth:`add` took (a view of its buffer); else None."""
        if ticket.context_shape is None:
            return None
        return _at(self._buffers_by_slot[(ticket.ring, ticket.slot)], ticket.context_start, ticket.context_shape)

    def release(self) -> int:
        """Hand back every buffer lent so far (the loop has asked for the next batch); the number handed back (with
        pinned buffers, those whose queued copies have finished)."""
        back = list(self._lent)
        self._lent.clear()
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
