"""Resume under torchrun (gloo, 2 ranks x 2 workers): a job stopped at step N and restarted from its saved loader
states yields, on every rank, the batches the uninterrupted job yields from step N on."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shardmaker as sm

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests"
COUNTS = (10, 7, 12, 5, 9, 14, 6, 11, 8)
BATCH, WORKERS, STEPS, STOP = 4, 2, 10, 4  # resampled: 10 steps, stopped after 4; epoch: stopped after 4


def _torchrun(*args: str, script: str = __file__, timeout: float = 150, nproc: int = 2) -> str:
    path = os.pathsep.join([str(ROOT), str(HELPERS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", script, *args]
    try:
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"torchrun hung (> {timeout} s): {exc.stderr!s:.4000}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    return done.stdout


@pytest.mark.timeout(400)
@pytest.mark.parametrize("mode", ["resampled", "epoch"])
def test_a_restarted_job_goes_on_with_the_uninterrupted_batches(tmp_path: Path, mode: str) -> None:
    out = sm.make_output(str(tmp_path / "out"), COUNTS)
    for phase in ("full", "first", "resume"):
        _torchrun(out.root, str(tmp_path), mode, phase)
    for rank in range(2):
        full = json.loads((tmp_path / f"full-{rank}.json").read_text())
        first = json.loads((tmp_path / f"first-{rank}.json").read_text())
        resumed = json.loads((tmp_path / f"resume-{rank}.json").read_text())
        assert len(first) == STOP and len(full) > STOP
        assert first + resumed == full, f"rank {rank}"
    keys = [k for rank in range(2) for step in json.loads((tmp_path / f"full-{rank}.json").read_text()) for k in step]
    if mode == "epoch":
        assert len(keys) == len(set(keys))  # the epoch, with its restart, never repeats a sample


@pytest.mark.timeout(400)
@pytest.mark.parametrize("new_ranks", [3, 1])
def test_an_epoch_stopped_on_two_ranks_finishes_on_another_world_size(tmp_path: Path, new_ranks: int) -> None:
    out = sm.make_output(str(tmp_path / "out"), COUNTS)
    _torchrun(out.root, str(tmp_path), "epoch", "full")
    _torchrun(out.root, str(tmp_path), "epoch", "first")
    _torchrun(out.root, str(tmp_path), "epoch", "regrow", nproc=new_ranks)
    whole = {k for r in range(2) for step in json.loads((tmp_path / f"full-{r}.json").read_text()) for k in step}
    before = [k for r in range(2) for step in json.loads((tmp_path / f"first-{r}.json").read_text()) for k in step]
    after = [
        k for r in range(new_ranks) for step in json.loads((tmp_path / f"regrow-{r}.json").read_text()) for k in step
    ]
    assert len(before + after) == len(set(before + after))  # no sample repeated
    lost = whole - set(before + after)
    assert len(lost) <= new_ranks * WORKERS * BATCH  # at most each new reader's partial last batch
    if new_ranks == 1:
        assert not lost


@pytest.mark.timeout(400)
def test_the_ddp_example_checkpoints_and_resumes(tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "out"), COUNTS)
    args = [out.root, "--batch-size", "4", "--workers", "2", "--checkpoint", str(tmp_path / "ckpt")]
    first = _torchrun(*args, "--steps", "3", script="examples/train_ddp.py")
    assert "rank 1: 3 batches" in first
    state = json.loads((tmp_path / "ckpt" / "loader-rank1.json").read_text())
    assert state["step"] == 3 and sum(state["loader"]["batches"]) == 3
    again = _torchrun(*args, "--steps", "7", "--resume", script="examples/train_ddp.py")
    assert "resumed at step 3" in again and "rank 1: 4 batches" in again


def _rank_main(source: str, work: str, mode: str, phase: str) -> None:
    import torch
    import torch.distributed as dist

    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    dl = loader(
        stream(
            source, batch_size=BATCH, resampled=mode == "resampled", shuffle=16, seed=7, drop_last=mode == "resampled"
        ),
        num_workers=WORKERS,
    )
    state_file = Path(work, f"state-{rank}.json")
    if phase == "resume":
        dl.load_state_dict(json.loads(state_file.read_text()))
    if phase == "regrow":  # another world size: every old rank's state
        dl.load_state_dict([json.loads(Path(work, f"state-{r}.json").read_text()) for r in range(2)])
    limit = {"full": STEPS, "first": STOP, "resume": STEPS - STOP}.get(phase) if mode == "resampled" else None
    if mode == "epoch" and phase == "first":
        limit = STOP
    steps = []
    for batch in dl:
        dist.all_reduce(torch.ones(1))  # ranks in step: a rank with an extra batch would hang here
        steps.append(batch["key"])
        if limit is not None and len(steps) == limit:
            break
    if phase == "first":
        state_file.write_text(json.dumps(dl.state_dict()))
    Path(work, f"{phase}-{rank}.json").write_text(json.dumps(steps))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(*sys.argv[1:5])


@pytest.mark.timeout(400)
def test_the_ddp_example_counts_epochs_in_all_and_seeds_its_model(tmp_path: Path) -> None:
    import torch

    out = sm.make_output(str(tmp_path / "out"), COUNTS)
    args = [out.root, "--epoch", "--batch-size", "4", "--workers", "2", "--epochs", "1", "--checkpoint"]
    first = _torchrun(*args, str(tmp_path / "a"), script="examples/train_ddp.py")
    assert "epoch 0:" in first and "epoch 1:" not in first
    twin = _torchrun(*args, str(tmp_path / "b"), script="examples/train_ddp.py")
    a, b = (torch.load(tmp_path / d / "model.pt", weights_only=True)["model"] for d in ("a", "b"))
    assert all(torch.equal(a[k], b[k]) for k in a)  # one seed, the same run: the model starts from one seed too
    assert twin.count("epoch 0:") == 1
    again = _torchrun(
        *args[:-3], "--epochs", "2", "--checkpoint", str(tmp_path / "a"), "--resume", script="examples/train_ddp.py"
    )
    assert "epoch 1:" in again and "epoch 0:" not in again  # --epochs is the total: only the epoch left runs
