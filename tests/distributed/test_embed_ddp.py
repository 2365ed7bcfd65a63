"""``wsishard.embed`` under torchrun, 2 ranks (gloo): each rank embeds the parts dealt to it, rank 0 joins them, and
the output is the single-process run's, every source patch exactly once; then both ranks stream it as bags (an exact
epoch with pad_last: every slide once, over both ranks). Run as a script (under torchrun) this file is the per-rank
program."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from test_distributed import _torchrun

PART_SAMPLES = 50


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from embedmodels import make_source

    return make_source(tmp_path_factory.mktemp("embed-ddp"))


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

    # bags under 2 ranks, epoch mode, pad_last: every slide exactly once, each bag its slide's patch count
    assert ranks[0]["batches"] == ranks[1]["batches"] > 0
    seen = sorted(tuple(b) for r in ranks for b in r["bags"])
    counts: dict[str, int] = {}
    for p in patches:
        counts[p.meta["slide_id"]] = counts.get(p.meta["slide_id"], 0) + 1
    assert seen == sorted(counts.items())


@pytest.mark.timeout(300)
def test_the_cli_under_torchrun_waits_for_every_rank_before_joining(source: Path, tmp_path: Path) -> None:
    from buildtools import read_output

    cli = ["-m", "wsishard.cli", "embed", str(source), "-o", str(tmp_path / "cli")]
    cli += ["--model", "embedmodels:mean_linear"]
    flags = ["--device", "cpu", "--batch-size", "16", "--num-workers", "1", "--part-samples", str(PART_SAMPLES), "-q"]
    done = _torchrun(*cli, *flags, timeout=240)
    assert "slides" in done.stdout  # rank 0's summary line
    _, patches = read_output(str(source))
    _, slides = read_output(str(tmp_path / "cli"))
    keys = [k for s in slides for k in json.loads(s.members["keys.json"])]
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
    dist.barrier()  # the output is written (rank 0): stream it as bags, an exact epoch over both ranks
    ds = wsishard.stream(out, batch_size=1, resampled=False, pad_last=True, seed=3)
    bags, batches = [], 0
    for batch in wsishard.loader(ds, num_workers=1):
        batches += 1
        bags += [[k, int(m.sum())] for k, m, v in zip(batch["key"], batch["mask"], batch["valid"], strict=True) if v]
    record = {"total": totals[-1], "wrote": manifest is not None, "bags": bags, "batches": batches}
    Path(result, f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(*sys.argv[1:])
