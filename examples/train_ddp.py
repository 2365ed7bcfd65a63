"""Train a small CNN with DistributedDataParallel on a wsishard build output.

    torchrun --nproc_per_node=K examples/train_ddp.py OUT --steps 200          # step-based (resampled)
    torchrun --nproc_per_node=K examples/train_ddp.py OUT --epoch --epochs 3   # exact epochs: 3 in all
    torchrun ... examples/train_ddp.py OUT --steps 200 --checkpoint ckpt --checkpoint-every 50
    torchrun ... examples/train_ddp.py OUT --steps 200 --checkpoint ckpt --resume   # goes on where it stopped
    torchrun --nproc_per_node=3 ... OUT --epoch --checkpoint ckpt --resume   # an epoch begun on 2 ranks, on 3

NCCL on GPUs (each rank bound to GPU LOCAL_RANK), gloo on CPU: it runs as is with 2 processes on one CPU
machine. Every (rank, worker) reads its own shards; in epoch mode every rank yields the same number of
batches, so the gradient all-reduce never waits for a rank that ran out. Only rank 0 prints. A checkpoint holds the
model and optimizer (rank 0) and each rank's loader state (plain JSON): resumed, the job sees the batches the
uninterrupted job would have seen.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from wsishard import GpuCollate, MonitoredLoader, ShardLoader, ShardStream, loader, stream

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_single import IMAGENET_MEAN, IMAGENET_STD, Targets, loss_fn, make_model


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="build output folder, manifest path or URL prefix")
    p.add_argument(
        "--steps", type=int, default=100, help="steps per rank in all, a resumed run's included (resampled mode)"
    )
    p.add_argument("--epoch", action="store_true", help="exact epochs instead of endless resampling")
    p.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="epochs in all with --epoch, a resumed run's included: a run resumed after epoch 2 of 3 runs epoch 3 only",
    )
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers per rank")
    p.add_argument("--shuffle", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--checkpoint", metavar="DIR", help="save model, optimizer and loader state here")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N", help="also every N steps (0: at the end)")
    p.add_argument("--resume", action="store_true", help="start from the checkpoint in --checkpoint")
    return p.parse_args()


def save(
    folder: str, rank: int, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer, dl: ShardLoader
) -> None:
    """Each rank's loader state as JSON; model and optimizer once, from rank 0."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, f"loader-rank{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump({"step": step, "loader": dl.state_dict()}, fh)
    if rank == 0:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(folder, "model.pt"))
    dist.barrier()


def restore(
    folder: str,
    rank: int,
    device: torch.device,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dl: ShardLoader,
) -> int:
    """Load what :func:`save` wrote; the step to go on from. (The checkpoint is this job's own: torch.load of it is
    safe; never torch.load anything from shards.)"""
    weights = torch.load(os.path.join(folder, "model.pt"), map_location=device, weights_only=True)
    model.load_state_dict(weights["model"])
    optimizer.load_state_dict(weights["optimizer"])

    def saved(r: int) -> dict:
        with open(os.path.join(folder, f"loader-rank{r}.json"), encoding="utf-8") as fh:
            return json.load(fh)

    old_world = saved(0)["loader"]["world_size"]
    if old_world == dist.get_world_size():
        dl.load_state_dict(saved(rank)["loader"])  # the same batches as the uninterrupted job
    else:  # another world size (epoch mode): the epoch finishes with what every old rank had left
        dl.load_state_dict([saved(r)["loader"] for r in range(old_world)])
    return int(saved(0)["step"])


def epoch_to_run(folder: str, ds: ShardStream) -> int:
    """The epoch a restored loader's next pass runs: the one the checkpoint was taken in, or the next when its
    rank 0 had taken all that epoch's batches (a checkpoint taken at an epoch's end)."""
    with open(os.path.join(folder, "loader-rank0.json"), encoding="utf-8") as fh:
        state = json.load(fh)["loader"]
    epoch = int(state["epoch"])
    done = sum(state["batches"]) >= ds.batches_per_rank(int(state["num_workers"]), epoch)
    return epoch + 1 if done else epoch


def setup() -> tuple[int, torch.device]:
    """Start the process group and bind this rank to its GPU (or the CPU)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", device_id=device)
        if torch.cuda.current_device() != local_rank:
            raise RuntimeError(f"rank bound to cuda:{torch.cuda.current_device()}, LOCAL_RANK is {local_rank}")
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(minutes=5))
    return dist.get_rank(), device


def main() -> None:
    args = parse_args()
    rank, device = setup()
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING, format=f"[rank {rank}] %(asctime)s %(name)s %(message)s"
    )
    ds = stream(args.source, batch_size=args.batch_size, resampled=not args.epoch, shuffle=args.shuffle, seed=args.seed)
    dl = loader(ds, num_workers=args.workers)
    batches = MonitoredLoader(dl, every=args.log_every, rank=rank)
    to_device = GpuCollate(device, mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=True, seed=args.seed + rank)
    targets = Targets(args.source)
    torch.manual_seed(args.seed)  # the same initial weights (and so the same run) for the same seed
    model = DistributedDataParallel(
        make_model(targets.classes).to(device), device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = restore(args.checkpoint, rank, device, model.module, optimizer, dl) if args.resume and args.checkpoint else 0
    epoch = epoch_to_run(args.checkpoint, ds) if step else 0
    if rank == 0 and step:
        print(f"resumed at step {step}" + (f", in epoch {epoch}" if args.epoch else ""))

    def checkpoint(done: int) -> None:
        if args.checkpoint and (done == -1 or (args.checkpoint_every and done % args.checkpoint_every == 0)):
            save(args.checkpoint, rank, step, model.module, optimizer, dl)

    def train_step(batch: dict) -> float:
        loss = loss_fn(model(to_device(batch)["image"]), targets(batch, device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # all-reduces gradients: every rank must take the same number of steps
        optimizer.step()
        return float(loss.item())

    if args.epoch:
        while epoch < args.epochs:  # --epochs is the total: a resumed run finishes its epoch, then does the rest
            steps = 0
            for batch in batches:  # each pass over the loader is the next epoch (a resumed one: the rest of it)
                train_step(batch)
                steps, step = steps + 1, step + 1
                checkpoint(step)
            if rank == 0:
                print(
                    f"epoch {epoch}: {steps} batches on rank 0, "
                    f"{ds.batches_per_rank(args.workers, epoch)} planned per rank"
                )
            epoch += 1
    else:
        for _, batch in zip(range(step, args.steps), batches, strict=False):
            loss = train_step(batch)
            if rank == 0 and step % args.log_every == 0:
                print(f"step {step}: loss {loss:.4f}")
            step += 1
            checkpoint(step)
    checkpoint(-1)
    summaries: list[dict | None] = [None] * dist.get_world_size()
    dist.all_gather_object(summaries, dict(batches.summary()))
    if rank == 0:
        for s in summaries:
            assert s is not None
            print(
                f"rank {s['rank']}: {s['step']} batches, {s['samples_per_s']:.1f} samples/s, "
                f"data wait {100 * s['data_wait_fraction']:.0f}%"
            )
    dist.barrier()  # every rank is done: nothing is in flight between them any more
    # Leave without the process group's and the interpreter's C++ teardown: under load, gloo aborted a rank at exit
    # now and then ("terminate called without an active exception", exit -6) after training had finished.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
