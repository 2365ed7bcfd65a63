"""``wsishard.embed`` under torchrun, 2 ranks (gloo): each rank embeds the parts dealt to it, rank 0 joins them, and
the output is the single-process run's, every source patch exactly once. Run as a script (under torchrun) this file
is the per-rank program."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_distributed import _torchrun

PART_SAMPLES = 50


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from buildtools import SMALL_BUILD

    from wsishard.builder.run import build
    from wsishard.testing.synthetic import make_slides

    root = tmp_path_factory.mktemp("embed-ddp")
    make_slides(root / "slides", 3, seed=21, width=2048, height=2048)
    build([str(root / "slides")], str(root / "out"), replace(SMALL_BUILD, shard_samples=40))
    return root / "out"


def _options():
    from wsishard.embedding.options import EmbedOptions

    return EmbedOptions(device="cpu", batch_size=16, num_workers=1, part_samples=PART_SAMPLES)


@pytest.mark.timeout(300)
def test_two_ranks_embed_their_own_parts_and_rank_0_writes_the_single_process_output(
    source: Path, tmp_path: Path
) -> None:
    from buildtools import read_output

    import wsishard

    _torchrun(__file__, str(source), str(tmp_path / "ddp"), str(tmp_path), timeout=240)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    _, patches = read_output(str(source))
    assert ranks[0]["total"] > 0 and ranks[1]["total"] > 0  # both ranks embedded a share
    assert ranks[0]["total"] + ranks[1]["total"] == len(patches)
    assert ranks[0]["wrote"] and not ranks[1]["wrote"]  # rank 0 alone writes the output

    wsishard.embed(source, tmp_path / "one", model="embedmodels:mean_linear", options=_options(), world=None)
    _, ddp = read_output(str(tmp_path / "ddp"))
    _, one = read_output(str(tmp_path / "one"))
    assert [(s.key, s.members["keys.json"], s.members["features.npy"]) for s in ddp] == [
        (s.key, s.members["keys.json"], s.members["features.npy"]) for s in one
    ]
    keys = [k for s in ddp for k in json.loads(s.members["keys.json"])]
    assert sorted(keys) == sorted(p.key for p in patches)


def _rank_main(source: str, out: str, result: str) -> None:
    import torch.distributed as dist

    import wsishard

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    totals: list[int] = []
    manifest = wsishard.embed(
        source, out, model="embedmodels:mean_linear", options=_options(), progress=lambda e: totals.append(e.total)
    )
    Path(result, f"rank{rank}.json").write_text(json.dumps({"total": totals[-1], "wrote": manifest is not None}))
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(*sys.argv[1:])
