"""The ring of batch buffers: a buffer is filled again only under the ownership rule (a batch is valid until the loop
takes the next), in the process that uses the batches (two buffers in turn) and across the worker boundary (tickets
handed back by the main process); without reuse every batch is memory of its own."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
import torch

from wsishard.streaming.ring import RING_SLOTS, ROW_OFFSET, BatchBuffers, Lending, Lent, Returns

SHAPE = (2, 4, 4, 3)  # (b, h, w, 3)


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


REUSE = Lending(reuse=True)


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "worker"])
def test_without_reuse_every_batch_is_memory_of_its_own(shared: bool) -> None:
    ring = BatchBuffers(SHAPE, shared=shared)
    taken = [ring.take() for _ in range(RING_SLOTS + 2)]
    assert all(ticket is None for _, ticket in taken)
    assert len({_ptr(image) for image, _ in taken}) == len(taken)
    assert all(image.is_shared() == shared for image, _ in taken)
    for i, (image, _) in enumerate(taken):
        image.fill_(i)
    assert all(torch.all(image == i) for i, (image, _) in enumerate(taken))  # none was written over


def test_in_process_two_buffers_take_turns() -> None:
    """The batch being filled is never the one the loop holds: that one is valid until the loop takes the next."""
    ring = BatchBuffers(SHAPE, shared=False, lending=REUSE)
    first, ticket = ring.take()
    assert ticket is None and first.shape == SHAPE and first.dtype == torch.uint8
    second, _ = ring.take()
    third, _ = ring.take()
    assert _ptr(second) != _ptr(first) and _ptr(third) == _ptr(first)
    assert _ptr(ring.take()[0]) == _ptr(second) and ring.fresh == 0


def test_in_a_worker_buffers_are_lent_until_handed_back() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2, lending=REUSE)
    a, lent_a = ring.take()
    b, lent_b = ring.take()
    assert a.is_shared() and lent_a is not None and lent_b is not None and lent_a.image is a
    assert lent_a.slot != lent_b.slot and ring.flags.tolist() == [1, 1]
    c, lent_c = ring.take()  # both lent: a fresh shared batch, no ticket
    assert lent_c is None and c.is_shared() and ring.fresh == 1
    del a, b, c  # the worker letting go changes nothing: the main process holds lent buffers
    assert ring.take()[1] is None
    ring.flags[lent_b.slot] = 0  # handed back
    d, lent_d = ring.take()
    assert lent_d is not None and lent_d.slot == lent_b.slot and _ptr(d) == _ptr(lent_b.image)


def test_returns_hand_back_every_lent_buffer_at_the_next_request_once() -> None:
    flags = torch.tensor([1, 1], dtype=torch.uint8)
    image = torch.empty(SHAPE, dtype=torch.uint8)  # as the main process receives it
    returns = Returns()
    assert returns.add(Lent((7, 0), 1, flags, image)) is None  # by tensor: the batch carries its image
    assert len(returns) == 1 and flags.tolist() == [1, 1]
    assert returns.release() == 1 and flags.tolist() == [1, 0] and len(returns) == 0
    assert returns.release() == 0  # handed back once


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "worker"])
def test_no_image_row_starts_on_a_32_byte_boundary(shared: bool) -> None:
    """libjpeg-turbo writes 32-byte aligned rows with non-temporal stores (slower here): every row of every image of
    a batch, from the ring or fresh, starts ROW_OFFSET bytes past a boundary."""
    ring = BatchBuffers((3, 8, 32, 3), shared=shared, slots=1, lending=REUSE)
    for image, _ in (ring.take(), ring.take(), BatchBuffers((3, 8, 32, 3), shared=shared).take()):
        rows = image.numpy().reshape(-1, 32 * 3)  # (b * h, w * 3)
        assert {rows[i].ctypes.data % 32 for i in range(len(rows))} == {ROW_OFFSET}
        assert image.is_contiguous() and image.shape == (3, 8, 32, 3)


def test_by_reference_a_buffer_travels_with_its_first_batch_only() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(reuse=True, by_reference=True))
    a, lent = ring.take()
    assert lent is not None
    sent, first = ring.hand_over(a, lent)
    assert sent is None and first.image is a and first.flags is ring.flags
    assert first.shape == SHAPE and first.start == a.storage_offset()
    ring.flags[first.slot] = 0  # handed back by the main process
    b, lent = ring.take()  # the same buffer again, for a short last batch
    assert lent is not None and lent.slot == first.slot and _ptr(b) == _ptr(a)
    sent, later = ring.hand_over(b[:1], lent)
    assert sent is None and later.image is None and later.flags is None
    assert later.shape == (1, *SHAPE[1:]) and later.start == first.start
    c, lent = ring.take()  # the other buffer: its first batch carries it, not the ring's flags
    assert lent is not None
    _, other = ring.hand_over(c, lent)
    assert other.image is c and other.flags is None


def test_by_reference_the_main_process_gives_each_batch_its_buffer_and_hands_it_back() -> None:
    flags = torch.tensor([1, 0], dtype=torch.uint8)
    received = torch.zeros(2 * 48 * 3 + 32, dtype=torch.uint8)  # the buffer as its first batch brought it
    received[16:].fill_(4)
    returns = Returns()
    got = returns.add(Lent((7, 0), 0, flags, received, SHAPE, 16))
    assert got is not None and got.shape == SHAPE and _ptr(got) == _ptr(received) and torch.all(got == 4)
    assert flags.tolist() == [1, 0]  # lent while the loop holds the batch
    assert returns.release() == 1 and flags.tolist() == [0, 0]  # the loop asked for the next batch
    flags[0] = 1  # the worker fills it again and names it
    got = returns.add(Lent((7, 0), 0, None, None, (1, *SHAPE[1:]), 16))
    assert got is not None and got.shape == (1, *SHAPE[1:]) and torch.all(got == 4)
    assert returns.release() == 1 and flags.tolist() == [0, 0]


def test_a_batch_naming_a_buffer_never_sent_is_refused() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(reuse=True, by_reference=True))
    image, lent = ring.take()
    assert lent is not None
    ring.hand_over(image, lent)  # its first batch, never received
    _, later = ring.hand_over(image, lent)
    with pytest.raises(ValueError, match="never sent"):
        Returns().add(later)


def test_a_worker_ring_makes_its_prefill_of_buffers_before_the_first_batch() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=4, lending=Lending(reuse=True, prefill=3))
    made = [s.data_ptr() for s in ring.storages]
    assert len(made) == 3 and all(s.is_shared() for s in ring.storages)
    taken = [ring.take()[0] for _ in range(3)]
    assert [_ptr(t) for t in taken] == made  # the prefilled buffers, in turn
    assert _ptr(ring.take()[0]) not in made and len(ring.storages) == 4  # then the ring grows as before
    assert len(BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(reuse=True, prefill=5)).storages) == 2
    assert BatchBuffers(SHAPE, shared=False, lending=Lending(reuse=True, prefill=3)).storages == []  # as it goes


def _first_ring(queue: Any) -> None:
    queue.put(BatchBuffers(SHAPE, shared=True, slots=1).ring)


def test_the_first_rings_of_two_workers_have_different_numbers() -> None:
    """A later pass's worker that got a finished worker's pid must not name that worker's ring: numbers are not a
    count that starts again at 0 in every forked worker."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    for _ in range(2):
        child = ctx.Process(target=_first_ring, args=(queue,))
        child.start()
        child.join(60)
    first, second = queue.get(timeout=10), queue.get(timeout=10)
    assert first[1] != second[1]
