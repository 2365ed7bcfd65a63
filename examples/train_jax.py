"""Train a small CNN with JAX for a number of steps on a wsishard build output: CPU, one GPU, or many processes.

    python examples/train_jax.py OUT --steps 200 [--batch-size 64 --workers 4]
    # one process of several (each on its host, or several on one for a test):
    python examples/train_jax.py OUT --coordinator HOST:PORT --processes 2 --process-id 0

OUT is a build output folder, its manifest.json, or a URL prefix (s3://bucket/prefix). torch's DataLoader workers
read and decode (the stream is resampled: it never ends); ``wsishard.jax.loader`` makes each batch one global
``jax.Array`` sharded along the batch over every device of every process, and ``wsishard.jax.Collate`` normalises
and flips it on the devices. The model is plain JAX (``lax.conv_general_dilated``, NHWC) trained with optax's AdamW.
The last line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
WIDTHS = (16, 32, 64)  # three strided conv blocks, then global pooling and a linear head


def init_params(key: jax.Array, classes: int) -> dict[str, Any]:
    """He-initialised conv kernels (HWIO) and a linear head."""
    params: dict[str, Any] = {}
    c_in = 3
    for i, c_out in enumerate(WIDTHS):
        key, sub = jax.random.split(key)
        params[f"conv{i}"] = jax.random.normal(sub, (3, 3, c_in, c_out)) * np.sqrt(2 / (9 * c_in))
        params[f"bias{i}"] = jnp.zeros(c_out)
        c_in = c_out
    key, sub = jax.random.split(key)
    params["head"] = jax.random.normal(sub, (c_in, classes)) * np.sqrt(1 / c_in)
    params["head_bias"] = jnp.zeros(classes)
    return params


def forward(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """(B, h, w, 3) float -> (B, classes) logits."""
    for i in range(len(WIDTHS)):
        x = jax.lax.conv_general_dilated(
            x, params[f"conv{i}"], (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )
        x = jax.nn.relu(x + params[f"bias{i}"])
    return x.mean(axis=(1, 2)) @ params["head"] + params["head_bias"]


def loss_fn(params: dict[str, Any], x: jax.Array, y: jax.Array, valid: jax.Array) -> jax.Array:
    """Cross-entropy over the valid, labelled samples (label -1: unlabelled; valid False: pad_last's repeats)."""
    keep = valid & (y >= 0)
    losses = optax.softmax_cross_entropy_with_integer_labels(forward(params, x), jnp.maximum(y, 0))
    return jnp.sum(jnp.where(keep, losses, 0.0)) / jnp.maximum(jnp.sum(keep), 1)


def make_step(optimizer: optax.GradientTransformation) -> Any:
    @jax.jit
    def train_step(params: Any, state: Any, x: jax.Array, y: jax.Array, valid: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, valid)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    return train_step


def targets(batch: dict[str, Any], labelled: bool, slides: dict[str, int], sharding: Any) -> jax.Array:
    """The slide labels of a labelled build, else which slide each patch came from (a global array)."""
    if labelled:
        return batch["label"]
    ids = np.array([slides.get(m["slide_id"], -1) for m in batch["meta"]], dtype=np.int32)  # this process's (b,)
    return jax.make_array_from_process_local_data(sharding, ids, (ids.shape[0] * jax.process_count(),))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="build output folder, manifest path or URL prefix")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=64, help="samples per process and step")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per process")
    p.add_argument("--shuffle", type=int, default=1000, help="shuffle buffer, samples per worker")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--coordinator", default=None, help="HOST:PORT of jax.distributed's coordinator (process 0)")
    p.add_argument("--processes", type=int, default=1)
    p.add_argument("--process-id", type=int, default=0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.coordinator:  # before anything touches the devices; wsishard.stream() then reads the rank from jax
        jax.distributed.initialize(args.coordinator, num_processes=args.processes, process_id=args.process_id)
    import wsishard.jax as wjax
    from wsishard import load_manifest, stream

    manifest, _ = load_manifest(args.source)
    labels = [s.label for s in manifest.slides if s.label is not None]
    slides = {s.slide_id: i for i, s in enumerate(manifest.slides)}
    classes = max(labels) + 1 if labels else len(slides)
    ds = stream(args.source, batch_size=args.batch_size, resampled=True, shuffle=args.shuffle, seed=args.seed)
    batches = wjax.loader(ds, num_workers=args.workers)
    collate = wjax.Collate(mean=IMAGENET_MEAN, std=IMAGENET_STD, augment=True, seed=args.seed)
    replicated = NamedSharding(batches.sharding.mesh, PartitionSpec())  # type: ignore[attr-defined]
    params = jax.device_put(init_params(jax.random.key(args.seed), classes), replicated)
    optimizer = optax.adamw(1e-3)
    state = jax.device_put(optimizer.init(params), replicated)
    train_step = make_step(optimizer)
    losses, start, samples = [], time.perf_counter(), 0
    for step, batch in zip(range(args.steps), batches, strict=False):
        y = targets(batch, bool(labels), slides, batches.label_sharding)
        params, state, loss = train_step(params, state, collate(batch)["image"], y, batch["valid"])
        samples += batch["image"].shape[0]
        if step % args.log_every == 0 or step == args.steps - 1:  # float() waits for the step
            losses.append(float(loss))
            print(f"step {step}: loss {losses[-1]:.4f}", flush=True)
    elapsed = time.perf_counter() - start
    summary = {
        "steps": min(step + 1, args.steps),
        "global_batch": args.batch_size * jax.process_count(),
        "devices": jax.device_count(),
        "processes": jax.process_count(),
        "losses": losses,
        "samples_per_s": round(samples / elapsed, 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
