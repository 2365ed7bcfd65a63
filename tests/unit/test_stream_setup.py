"""Stream set-up without reading shards: option validation, the world from torchrun's environment, and the
split stages (which must split exactly as webdataset's splitters do)."""

from __future__ import annotations

import pytest

from wsishard.streaming.config import StreamConfig
from wsishard.streaming.world import World, detect_world


@pytest.mark.parametrize(
    ("kw", "bad"),
    [
        ({"batch_size": 0}, "0"),
        ({"batch_size": 2, "shuffle": -5}, "-5"),
        ({"batch_size": 2, "seed": -1}, "-1"),
        ({"batch_size": 2, "on_error": "ignore"}, "ignore"),
    ],
)
def test_config_validation_names_the_bad_value(kw: dict, bad: str) -> None:
    with pytest.raises(ValueError, match=bad):
        StreamConfig(**kw)


def test_detect_world_reads_torchrun_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert detect_world() == World(rank=1, world_size=3)
    monkeypatch.delenv("RANK")
    assert detect_world() == World()
