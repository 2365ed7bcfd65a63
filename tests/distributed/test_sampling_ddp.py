"""pad_last and class weights under torchrun: 2 ranks (gloo) x 2 DataLoader workers, with hard time limits.

An all-reduce on every step makes an unequal batch count between ranks hang; the subprocess timeout then turns
that hang into a failure. Run as a script (under torchrun) this file is the per-rank program.
"""

from __future__ import annotations

import datetime
import json
import sys
from pathlib import Path

import pytest
import shardmaker as sm
from test_distributed import _torchrun

from wsishard.format import shard_name
from wsishard.shards.index import index_name
from wsishard.shards.summary import index_build

BATCH, WORKERS, STEPS = 64, 2, 40


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[sm.Output, sm.Output]:
    root = tmp_path_factory.mktemp("ddp-sampling")
    one = sm.make_output(str(root / "one"), (706,), slides=3)  # a one-shard validation build of 700-odd samples
    mixed = sm.make_output(str(root / "mixed"), (120, 95, 140, 101, 88, 130), slides=5, slide_labels=(0, 0, 0, 0, 1))
    index_build(mixed.root)
    return one, mixed


@pytest.fixture(scope="module")
def ranks(outputs: tuple[sm.Output, sm.Output], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    result = tmp_path_factory.mktemp("result")
    _torchrun(__file__, outputs[0].root, outputs[1].root, str(result), timeout=200)
    return [json.loads((result / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(300)
def test_pad_last_reads_every_sample_exactly_once_with_equal_batches(
    outputs: tuple[sm.Output, sm.Output], ranks: list[dict]
) -> None:
    assert ranks[0]["batches"] == ranks[1]["batches"] == ranks[0]["planned"] > 0
    valid = [k for r in ranks for k in r["valid"]]
    assert sorted(valid) == sorted(outputs[0].shard_of)  # all 706, none twice
    assert all(n == BATCH for r in ranks for n in r["sizes"])


@pytest.mark.timeout(300)
def test_class_weights_balance_labels_across_ranks(outputs: tuple[sm.Output, sm.Output], ranks: list[dict]) -> None:
    labels = [label for r in ranks for label in r["labels"]]
    assert len(labels) == 2 * STEPS * BATCH
    assert abs(sum(labels) / len(labels) - 0.5) < 0.04  # 5,120 draws: 4% is over 5 standard deviations


@pytest.mark.timeout(300)
def test_a_split_scan_reads_each_index_on_one_rank_and_plans_as_one_process(ranks: list[dict]) -> None:
    whole = ranks[0]["scan_whole"]
    assert whole["opened"] == [index_name(shard_name(i)) for i in range(6)]  # one process: every index
    for rank, r in enumerate(ranks):
        split = r["scan_split"]
        assert split["opened"] == [index_name(shard_name(i)) for i in range(rank, 6, 2)]  # its share only
        assert split["selected"] == whole["selected"] and split["totals"] == whole["totals"]
        assert r["scan_default"] == split  # the default splits whenever a process group exists
        assert r["scan_whole"] == whole
    assert 0 < sum(whole["selected"]) < 120 + 95 + 140 + 101 + 88 + 130


def _keep(t: dict) -> object:
    return t["position"] % 3 != 0


def _weigh(t: dict) -> object:
    return 1.0 + (t["position"] % 2) / 3


class _CountingOpener:
    """The default opener, noting which shard indexes it opened."""

    def __init__(self) -> None:
        from wsishard.storage.opener import StreamOpener

        self.inner, self.opened = StreamOpener(), []

    def __call__(self, location: str) -> object:
        if location.endswith(".idx.npz"):
            self.opened.append(location.rsplit("/", 1)[-1])
        return self.inner(location)


def _scan_record(mixed: str, split: bool | None) -> dict:
    from wsishard.streaming.sources import stream

    opener = _CountingOpener()
    ds = stream(mixed, batch_size=BATCH, select=_keep, weights=_weigh, opener=opener, split_scan=split)
    assert ds.sampling is not None
    return {
        "opened": sorted(opener.opened),
        "selected": ds.sampling.selected.tolist(),
        "totals": ds.sampling.totals.tolist(),
    }


def _rank_main(one: str, mixed: str, result_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    ds = stream(one, batch_size=BATCH, resampled=False, pad_last=True, shuffle=32, seed=3)
    valid: list[str] = []
    sizes: list[int] = []
    for batch in loader(ds, num_workers=WORKERS):
        dist.all_reduce(torch.ones(1))  # a rank with an extra batch would wait here for ever
        valid += [k for k, v in zip(batch["key"], batch["valid"].tolist(), strict=True) if v]
        sizes.append(len(batch["key"]))
    dist.all_reduce(torch.zeros(1))  # and here, one with a missing batch
    weighted = stream(mixed, batch_size=BATCH, weights="class", shuffle=64, seed=5)
    labels: list[int] = []
    for _, batch in zip(range(STEPS), loader(weighted, num_workers=WORKERS), strict=False):
        dist.all_reduce(torch.ones(1))
        labels += batch["label"].tolist()
    results = {
        "valid": valid,
        "sizes": sizes,
        "batches": len(sizes),
        "planned": ds.batches_per_rank(WORKERS),
        "labels": labels,
        "scan_whole": _scan_record(mixed, False),
        "scan_split": _scan_record(mixed, True),
        "scan_default": _scan_record(mixed, None),
    }
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2], sys.argv[3])
