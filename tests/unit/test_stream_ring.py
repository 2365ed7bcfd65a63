"""The ring of batch buffers: a buffer is filled again only once nothing refers to it, in the process that uses the
batches (use counts) and across the worker boundary (tickets handed back by the main process)."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from typing import Any

import pytest
import torch

from wsishard.streaming.ring import ROW_OFFSET, BatchBuffers, Lending, Lent, Returns

SHAPE = (2, 4, 4, 3)  # (b, h, w, 3)


def _ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_in_process_a_buffer_comes_back_once_the_batch_is_let_go() -> None:
    ring = BatchBuffers(SHAPE, shared=False)
    first, ticket = ring.take()
    assert ticket is None and first.shape == SHAPE and first.dtype == torch.uint8
    first.fill_(7)
    second, _ = ring.take()
    assert _ptr(second) != _ptr(first)  # the first is still held: a second buffer
    address = _ptr(first)
    del first
    third, _ = ring.take()
    assert _ptr(third) == address  # the let-go buffer, filled again
    assert ring.fresh == 0


HOLDERS = {
    "view": lambda t: t[1:],
    "numpy": lambda t: t.numpy(),
    "storage": lambda t: t.untyped_storage(),
    "permuted": lambda t: t.permute(0, 3, 1, 2),
    "list": lambda t: [t],
}


@pytest.mark.parametrize("holder", HOLDERS.values(), ids=HOLDERS.keys())
def test_anything_that_can_still_see_a_buffer_keeps_it(holder: Callable[[torch.Tensor], Any]) -> None:
    ring = BatchBuffers(SHAPE, shared=False, slots=2)
    batch, _ = ring.take()
    batch.fill_(3)
    kept = holder(batch)
    address, start, n = _ptr(batch), batch.storage_offset(), batch.numel()
    del batch
    others = [ring.take()[0] for _ in range(3)]  # the other slot, then fresh batches: never the kept buffer
    assert address not in {_ptr(t) for t in others}
    assert ring.fresh == 2
    seen = kept[0] if isinstance(kept, list) else kept
    if isinstance(seen, torch.UntypedStorage):  # the whole buffer: the batch is a stretch of it
        seen = torch.empty(0, dtype=torch.uint8).set_(seen)[start : start + n]
    assert torch.all(torch.as_tensor(seen).view(torch.uint8) == 3)
    del kept, others, seen
    assert _ptr(ring.take()[0]) == address  # nothing refers to it any more: filled again


def test_in_a_worker_buffers_are_lent_until_handed_back() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2)
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


def test_returns_hand_a_buffer_back_only_once_nothing_refers_to_it() -> None:
    flags = torch.tensor([1, 1], dtype=torch.uint8)
    image = torch.empty(SHAPE, dtype=torch.uint8)  # as the main process receives it
    returns = Returns()
    assert returns.add(Lent((7, 0), 1, flags, image)) is None  # by tensor: the batch carries its image
    view = image[0]
    del image
    assert returns.sweep() == 0 and flags.tolist() == [1, 1] and len(returns) == 1
    del view
    assert returns.sweep() == 1 and flags.tolist() == [1, 0] and len(returns) == 0
    assert returns.sweep() == 0  # handed back once


@pytest.mark.parametrize("shared", [False, True], ids=["in-process", "worker"])
def test_no_image_row_starts_on_a_32_byte_boundary(shared: bool) -> None:
    """libjpeg-turbo writes 32-byte aligned rows with non-temporal stores (slower here): every row of every image of
    a batch, from the ring or fresh, starts ROW_OFFSET bytes past a boundary."""
    ring = BatchBuffers((3, 8, 32, 3), shared=shared, slots=1)
    for image, _ in (ring.take(), ring.take()):  # the ring's buffer, then a fresh one
        rows = image.numpy().reshape(-1, 32 * 3)  # (b * h, w * 3)
        assert {rows[i].ctypes.data % 32 for i in range(len(rows))} == {ROW_OFFSET}
        assert image.is_contiguous() and image.shape == (3, 8, 32, 3)


def test_by_reference_a_buffer_travels_with_its_first_batch_only() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(by_reference=True))
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
    del received
    assert returns.sweep() == 0 and flags.tolist() == [1, 0]  # the batch's image still sees the buffer
    del got
    assert returns.sweep() == 1 and flags.tolist() == [0, 0]
    flags[0] = 1  # the worker fills it again and names it
    got = returns.add(Lent((7, 0), 0, None, None, (1, *SHAPE[1:]), 16))
    assert got is not None and got.shape == (1, *SHAPE[1:]) and torch.all(got == 4)
    assert returns.sweep() == 0 and flags.tolist() == [1, 0]  # kept by the loop: never filled again
    del got
    assert returns.sweep() == 1 and flags.tolist() == [0, 0]


def test_a_batch_naming_a_buffer_never_sent_is_refused() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(by_reference=True))
    image, lent = ring.take()
    assert lent is not None
    ring.hand_over(image, lent)  # its first batch, never received
    _, later = ring.hand_over(image, lent)
    with pytest.raises(ValueError, match="never sent"):
        Returns().add(later)


def test_a_worker_ring_makes_its_prefill_of_buffers_before_the_first_batch() -> None:
    ring = BatchBuffers(SHAPE, shared=True, slots=4, lending=Lending(prefill=3))
    made = [s.data_ptr() for s in ring.storages]
    assert len(made) == 3 and all(s.is_shared() for s in ring.storages)
    taken = [ring.take()[0] for _ in range(3)]
    assert [_ptr(t) for t in taken] == made  # the prefilled buffers, in turn
    assert _ptr(ring.take()[0]) not in made and len(ring.storages) == 4  # then the ring grows as before
    assert len(BatchBuffers(SHAPE, shared=True, slots=2, lending=Lending(prefill=5)).storages) == 2
    assert BatchBuffers(SHAPE, shared=False, lending=Lending(prefill=3)).storages == []  # in-process: as it goes


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
