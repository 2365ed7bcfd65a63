"""The embedding pass's parts: cut from the shard list alone (the same on any topology, so a run resumes on another),
every part dealt to exactly one rank, the ranks' patches balanced."""

from __future__ import annotations

import pytest

from wsishard.embedding.parts import deal_parts
from wsishard.manifest import ShardRecord

COUNTS = [40, 40, 17, 40, 40, 3, 40, 33, 40]


def _shards(counts: list[int]) -> list[ShardRecord]:
    return [
        ShardRecord(name=f"shard-{i:06d}-0000.tar", samples=n, bytes=1, sha256="0" * 64) for i, n in enumerate(counts)
    ]


@pytest.mark.parametrize("world", [1, 2, 3, 4, 16])
def test_every_part_goes_to_one_rank_and_the_parts_do_not_depend_on_the_topology(world: int) -> None:
    ranks = deal_parts(_shards(COUNTS), 60, world)
    parts = sorted((p for r in ranks for p in r), key=lambda p: p.index)
    assert parts == deal_parts(_shards(COUNTS), 60, 1)[0]  # the same parts on any number of ranks
    assert sorted(i for p in parts for i in p.shards) == list(range(len(COUNTS)))  # every shard in one part
    assert all(p.samples == sum(COUNTS[i] for i in p.shards) for p in parts)
    assert all(p.samples >= 60 for p in parts[:-1])  # parts of at least part_samples, the last one the rest
    loads = [sum(p.samples for p in r) for r in ranks]
    biggest = max(p.samples for p in parts)
    assert max(loads) - min(loads) <= biggest  # greedy: no rank more than one part ahead
