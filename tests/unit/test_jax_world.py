"""The world from ``jax.distributed``: detected when jax is imported and initialised (never imported to find out),
or asked for with ``World.jax()``."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from wsishard.errors import TopologyError
from wsishard.streaming.world import World, detect_world


def _fake_jax(initialised: bool, index: int, count: int) -> types.ModuleType:
    """A stand-in for an imported jax whose ``jax.distributed`` is (or is not) initialised: one process of a real
    multi-process job is tests/integration/test_jax_distributed.py's."""
    jax = types.ModuleType("jax")
    jax.distributed = types.SimpleNamespace(is_initialized=lambda: initialised)  # type: ignore[attr-defined]
    jax.process_index = lambda: index  # type: ignore[attr-defined]
    jax.process_count = lambda: count  # type: ignore[attr-defined]
    return jax


def test_an_initialised_jax_distributed_gives_the_rank_and_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setitem(sys.modules, "jax", _fake_jax(True, 1, 2))
    assert detect_world() == World(rank=1, world_size=2)
    monkeypatch.setitem(sys.modules, "jax", _fake_jax(False, 1, 2))  # imported, not initialised: one process
    assert detect_world() == World()


def test_jax_distributed_and_torchrun_environment_that_disagree_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "jax", _fake_jax(True, 1, 2))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(TopologyError, match=r"jax\.distributed says 1/2"):
        detect_world()
    monkeypatch.setenv("RANK", "1")
    assert detect_world() == World(rank=1, world_size=2)


def test_world_jax_of_a_single_process() -> None:
    pytest.importorskip("jax")
    assert World.jax() == World(rank=0, world_size=1)


def test_detecting_the_world_never_imports_jax() -> None:
    code = (
        "import sys, json\nfrom wsishard.streaming.world import detect_world\nimport wsishard\n"
        "w = detect_world()\nprint(json.dumps(['jax' in sys.modules, w.rank, w.world_size]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.strip().splitlines()[-1]) == [False, 0, 1]
