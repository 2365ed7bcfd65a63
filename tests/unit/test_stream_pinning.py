"""Buffers page-locked in place (pinning.py) with stand-in CUDA calls: registered once each, handed back only after
the copies queued before they were let go, unregistered (after a device synchronisation) when the loader is done."""

from __future__ import annotations

import dataclasses
import logging

import pytest
import torch
from streamtools import FakeCuda

from wsishard.streaming.pinning import HostPins
from wsishard.streaming.ring import Lent, Returns

SHAPE = (2, 4, 4, 3)


def test_a_buffer_is_registered_once_and_unregistered_after_a_synchronisation() -> None:
    fake, storage = FakeCuda(), torch.UntypedStorage(64)
    pins: HostPins[int] = HostPins(fake.cuda())
    assert pins.register(storage) and pins.register(storage) and len(pins) == 1
    assert fake.calls == [("register", storage.data_ptr(), 64)]
    assert pins.close() == [] and len(pins) == 0
    assert fake.calls[1:] == [("sync",), ("unregister", storage.data_ptr())]


def test_keys_let_go_come_back_only_once_the_work_queued_before_has_finished() -> None:
    fake = FakeCuda()
    pins: HostPins[str] = HostPins(fake.cuda())
    assert pins.after_queued_work(["a"]) == []  # event 0
    assert pins.after_queued_work([]) == []  # nothing let go: no event
    assert pins.after_queued_work(["b", "c"]) == []  # event 1
    fake.done = 0
    assert pins.after_queued_work([]) == ["a"]
    fake.done = 1
    assert pins.after_queued_work(["d"]) == ["b", "c"]  # event 2, not finished
    assert pins.close() == ["d"]  # the device synchronised: all of it may go back
    assert [c for c in fake.calls if c[0] == "event"] == [("event", 0), ("event", 1), ("event", 2)]


def test_a_refused_registration_is_said_once_and_not_tried_again(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCuda(fail=2)
    pins: HostPins[int] = HostPins(fake.cuda())
    with caplog.at_level(logging.WARNING, logger="wsishard.streaming.pinning"):
        assert not pins.register(torch.UntypedStorage(8)) and not pins.register(torch.UntypedStorage(8))
    assert "CUDA error 2" in pins.failed and len(caplog.records) == 1
    assert [c[0] for c in fake.calls] == ["register"] and len(pins) == 0
    assert pins.close() == [] and [c[0] for c in fake.calls] == ["register"]  # nothing to unregister


def test_returns_hold_a_pinned_buffer_until_its_queued_copies_finished() -> None:
    fake = FakeCuda()
    flags = torch.tensor([1, 0], dtype=torch.uint8)
    received = torch.zeros(2 * 48 + 32, dtype=torch.uint8)  # a buffer by reference, as its first batch brings it
    returns = Returns(HostPins(fake.cuda()))
    got = returns.add(Lent((7, 0), 0, flags, received, SHAPE, 16))
    assert got is not None and fake.calls == [("register", received.data_ptr(), received.nbytes)]
    del received, got
    assert returns.release() == 0 and flags.tolist() == [1, 0]  # the next batch asked for, but a copy may still read it
    fake.done = 0
    assert returns.release() == 1 and flags.tolist() == [0, 0]
    flags[0] = 1  # filled again and named: no second registration
    got = returns.add(Lent((7, 0), 0, None, None, SHAPE, 16))
    assert got is not None and [c[0] for c in fake.calls].count("register") == 1
    del got
    assert returns.release() == 0 and flags.tolist() == [1, 0]  # event 1 not finished
    returns.close()
    assert flags.tolist() == [0, 0] and [c[0] for c in fake.calls][-2:] == ["sync", "unregister"]


def test_a_batch_by_tensor_is_not_registered() -> None:
    """Its image is a new mapping with every batch: registering it would pin memory that is soon unmapped."""
    fake = FakeCuda()
    returns = Returns(HostPins(fake.cuda()))
    returns.add(Lent((7, 0), 1, torch.tensor([1, 1], dtype=torch.uint8), torch.empty(SHAPE, dtype=torch.uint8)))
    assert fake.calls == []


def test_a_failure_to_unpin_is_said_and_never_masks_what_is_on_its_way_out(caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeCuda()
    cuda = fake.cuda()

    def down() -> None:
        raise RuntimeError("CUDA error: driver shutting down")

    broken = dataclasses.replace(cuda, synchronize=down)
    pins: HostPins[int] = HostPins(broken)
    assert pins.register(torch.UntypedStorage(8))
    with caplog.at_level(logging.WARNING, logger="wsishard.streaming.pinning"):
        assert pins.close() == []
    assert "driver shutting down" in caplog.text and len(pins) == 0


def test_a_torch_without_the_runtime_call_leaves_the_batches_unpinned(caplog: pytest.LogCaptureFixture) -> None:
    def missing(ptr: int, n: int) -> int:
        raise AttributeError("module 'torch._C._cudart' has no attribute 'cudaHostRegister'")

    pins: HostPins[int] = HostPins(dataclasses.replace(FakeCuda().cuda(), register=missing))
    with caplog.at_level(logging.WARNING, logger="wsishard.streaming.pinning"):
        assert not pins.register(torch.UntypedStorage(8))
    assert "AttributeError" in pins.failed and len(caplog.records) == 1 and len(pins) == 0
