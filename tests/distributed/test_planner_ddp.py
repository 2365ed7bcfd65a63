"""The stream planner under torchrun on a labelled build of generated slides: 2 ranks (gloo) x 2 workers.

A weighted epoch of 1200 draws with pad_last; an epoch with select= stopped after 3 batches per rank, resumed in
one process with 3 workers, stopped after 2 batches and resumed with 2; two exact epochs of persistent workers; an
exact epoch on ranks with 1 and 3 workers. An
all-reduce on every step makes an unequal batch count between ranks hang (the subprocess timeout then fails the
test). Run as a script (under torchrun) this file is the per-rank program.
"""

from __future__ import annotations

import datetime
import itertools
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from test_distributed import _torchrun

LABELLED = {"slide-000": 1, "slide-001": 1, "slide-002": 0, "slide-003": 0, "slide-004": 0, "slide-005": 0}
OPTIONS: dict[str, Any] = {"batch_size": 16, "resampled": False, "pad_last": True, "shuffle": 32}


def _keep(t: dict) -> Any:
    return t["position"] % 3 != 0


@pytest.fixture(scope="module")
def labelled_build(cohort: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from buildtools import SMALL_BUILD

    from wsishard.builder.run.orchestrate import build

    out = tmp_path_factory.mktemp("labelled") / "out"
    labels = {**LABELLED, "slide-006": 0, "slide-007": 0}
    manifest = build([str(cohort)], str(out), replace(SMALL_BUILD, labels=labels))
    assert len(manifest.slides) == 8 and not manifest.failed_slides
    return out


@pytest.fixture(scope="module")
def ranks(labelled_build: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    result = tmp_path_factory.mktemp("result")
    _torchrun(__file__, str(labelled_build), str(result), timeout=280)
    return [json.loads((result / f"rank{r}.json").read_text()) for r in range(2)], result


@pytest.mark.timeout(400)
def test_a_weighted_epoch_of_1200_draws_is_exact_and_balanced(ranks: tuple[list[dict], Path]) -> None:
    got = ranks[0]
    assert got[0]["weighted_batches"] == got[1]["weighted_batches"] > 0  # every rank the same batches
    labels = [label for r in got for label in r["weighted_labels"]]
    assert len(labels) == 1200  # exactly epoch_size valid draws
    assert abs(sum(labels) / 1200 - 0.5) < 0.04  # a quarter of the samples are label 1, drawn half the time


@pytest.mark.timeout(400)
def test_a_select_epoch_resumed_on_one_process_twice_yields_every_selected_sample_once(
    labelled_build: Path, ranks: tuple[list[dict], Path]
) -> None:
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream
    from wsishard.streaming.world import World

    got, result = ranks
    states = [json.loads((result / f"state{r}.json").read_text()) for r in range(2)]
    taken = [k for r in got for k in r["select_taken"]]
    assert all(len(r["select_taken"]) == 3 * 16 for r in got)

    def one_process(workers: int) -> Any:
        ds = stream(str(labelled_build), seed=4, select=_keep, world=World(), **OPTIONS)
        return loader(ds, num_workers=workers)

    middle = one_process(3)
    middle.load_state_dict(states)
    taken += _valid(itertools.islice(middle, 2))
    last = one_process(2)
    last.load_state_dict(json.loads(json.dumps(middle.state_dict())))
    taken += _valid(last)
    whole = _valid(stream(str(labelled_build), seed=4, select=_keep, world=World(), **OPTIONS))
    assert len(whole) == int(one_process(0).dataset.counts.sum()) > 100
    assert sorted(taken) == sorted(whole)  # every selected sample, none twice


@pytest.mark.timeout(400)
def test_persistent_workers_give_two_exact_epochs_in_different_orders(ranks: tuple[list[dict], Path]) -> None:
    got = ranks[0]
    for epoch in range(2):
        keys = [k for r in got for k in r["persistent"][epoch]]
        assert len(keys) == len(set(keys)) == got[0]["samples"]
    assert got[0]["persistent"][0] != got[0]["persistent"][1]


@pytest.mark.timeout(400)
def test_ranks_with_different_worker_counts_share_an_exact_epoch(ranks: tuple[list[dict], Path]) -> None:
    """Rank 0 with 1 DataLoader worker, rank 1 with 3: the same batches on both, every sample once."""
    got = ranks[0]
    assert got[0]["ragged_batches"] == got[1]["ragged_batches"] > 0
    keys = [k for r in got for k in r["ragged"]]
    assert len(keys) == len(set(keys)) == got[0]["samples"]


def _valid(batches: Any) -> list[str]:
    return [k for b in batches for k, v in zip(b["key"], b["valid"].tolist(), strict=True) if v]


def _rank_main(build: str, result_dir: str) -> None:
    import hangdump
    import torch
    import torch.distributed as dist

    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    hangdump.arm()  # a hang prints every rank's (and worker's) stacks, not only the rank that timed out
    watch: dict[str, Any] = {"timeout": 60, "worker_init_fn": hangdump.worker}  # a hung worker fails its rank
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    rank = dist.get_rank()

    def steps(batches: Any) -> list[Any]:
        out = []
        for batch in batches:
            dist.all_reduce(torch.ones(1))  # a rank with an extra batch would wait here for ever
            out.append(batch)
        dist.all_reduce(torch.zeros(1))  # and here, one with a missing batch
        return out

    weighted = stream(build, weights="class", epoch_size=1200, seed=7, **OPTIONS)
    batches = steps(loader(weighted, num_workers=2, **watch))
    labels = [int(lab) for b in batches for lab, v in zip(b["label"].tolist(), b["valid"].tolist(), strict=True) if v]
    selected = loader(stream(build, seed=4, select=_keep, **OPTIONS), num_workers=2, **watch)
    taken = _valid(steps(itertools.islice(selected, 3)))
    Path(result_dir, f"state{rank}.json").write_text(json.dumps(selected.state_dict()))
    plain = stream(build, seed=9, **OPTIONS)
    persistent = loader(plain, num_workers=2, persistent_workers=True, **watch)
    epochs = [_valid(steps(persistent)) for _ in range(2)]
    ragged = loader(stream(build, seed=5, **OPTIONS), num_workers=1 if rank == 0 else 3, **watch)
    ragged_batches = steps(ragged)
    results = {
        "ragged": _valid(ragged_batches),
        "ragged_batches": len(ragged_batches),
        "weighted_batches": len(batches),
        "weighted_labels": labels,
        "select_taken": taken,
        "persistent": epochs,
        "samples": int(plain.counts.sum()),
    }
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(*sys.argv[1:])
