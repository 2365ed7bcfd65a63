"""Real multi-process runs: torchrun, gloo, 2 ranks x 2 DataLoader workers, with hard time limits.

An all-reduce on every step makes an unequal batch count between ranks hang; the subprocess timeout then
turns that hang into a failure. Run as a script (under torchrun) this file is the per-rank program.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shardmaker as sm

ROOT = Path(__file__).resolve().parents[2]  # tests/distributed/ -> the repository
HELPERS = ROOT / "tests"  # shardmaker, imported when torchrun runs this file as a script
COUNTS = (10, 7, 12, 5, 9, 14, 6, 11, 8)  # 82 samples, uneven on purpose
BATCH, WORKERS, EPOCHS, STEPS = 4, 2, 2, 12


def _torchrun(*args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(ROOT), str(HELPERS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *args]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun hung (> {timeout} s): {exc.stdout!s:.2000} {exc.stderr!s:.4000}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> sm.Output:
    return sm.make_output(str(tmp_path_factory.mktemp("ddp")), COUNTS)


@pytest.fixture(scope="module")
def ranks(out: sm.Output, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    result = tmp_path_factory.mktemp("result")
    _torchrun(__file__, out.root, str(result))
    return [json.loads((result / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(240)
def test_epoch_mode_equal_batches_and_each_sample_at_most_once(out: sm.Output, ranks: list[dict]) -> None:
    for epoch in range(EPOCHS):
        runs = [r["epochs"][epoch] for r in ranks]
        assert runs[0]["batches"] == runs[1]["batches"] == runs[0]["planned"] > 0
        keys = [k for run in runs for k in run["keys"]]
        assert len(keys) == len(set(keys)) == 2 * runs[0]["planned"] * BATCH
        assert set(keys) <= set(out.shard_of)
        assert sum(COUNTS) - len(keys) < 2 * (max(COUNTS) + WORKERS * BATCH)  # the documented drop bound
    orders = [[k for r in ranks for k in r["epochs"][e]["keys"]] for e in range(EPOCHS)]
    assert orders[0] != orders[1]  # a new order each epoch, without set_epoch


@pytest.mark.timeout(240)
def test_resampled_mode_runs_fixed_steps_and_each_reader_owns_its_shards(out: sm.Output, ranks: list[dict]) -> None:
    owner: dict[str, tuple[int, int]] = {}
    for rank, run in enumerate(ranks):
        assert len(run["resampled"]) == STEPS
        for step, keys in enumerate(run["resampled"]):
            assert len(keys) == BATCH
            reader = (rank, step % WORKERS)  # the DataLoader takes batches from its workers round-robin
            for key in keys:
                assert owner.setdefault(out.shard_of[key], reader) == reader
    assert len(set(owner.values())) == 2 * WORKERS


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [[], ["--epoch"]], ids=["resampled", "epoch"])
def test_train_ddp_example_runs_under_torchrun(out: sm.Output, mode: list[str]) -> None:
    done = _torchrun("examples/train_ddp.py", out.root, "--steps", "5", "--batch-size", "4", "--workers", "2", *mode)
    assert "rank 1:" in done.stdout and "samples/s" in done.stdout
    if mode:
        assert "planned per rank" in done.stdout


def _rank_main(source: str, result_dir: str) -> None:
    import torch
    import torch.distributed as dist

    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, results = dist.get_rank(), {"epochs": [], "resampled": []}
    ds = stream(source, batch_size=BATCH, resampled=False, shuffle=16, seed=7)
    batches = loader(ds, num_workers=WORKERS)
    for epoch in range(EPOCHS):
        keys, n = [], 0
        for batch in batches:
            dist.all_reduce(torch.ones(1))  # a rank with an extra batch would wait here for ever
            keys += batch["key"]
            n += 1
        dist.all_reduce(torch.zeros(1))  # and here, one with a missing batch
        results["epochs"].append({"keys": keys, "batches": n, "planned": ds.batches_per_rank(WORKERS, epoch)})
    ds = stream(source, batch_size=BATCH, resampled=True, shuffle=16, seed=7)
    for _, batch in zip(range(STEPS), loader(ds, num_workers=WORKERS), strict=False):
        dist.all_reduce(torch.ones(1))
        results["resampled"].append(batch["key"])
    Path(result_dir, f"rank{rank}.json").write_text(json.dumps(results))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
