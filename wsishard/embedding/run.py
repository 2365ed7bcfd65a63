"""``embed()``: a user's model over every patch of a build, each patch exactly once, one sample per slide out.

source manifest -> parts (consecutive shards, ~part_samples patches) dealt to ranks
  -> per part: stream(..., resampled=False, pad_last=True) over its shards -> loader -> GpuCollate -> model
     -> the part written atomically (skipped by a resumed run when present and of the same pass)
  -> (barrier) rank 0 joins every part into one sample per slide (:mod:`wsishard.embedding.output`)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from wsishard.embedding.model import check_features, load_model, model_name
from wsishard.embedding.options import EmbedOptions
from wsishard.embedding.output import is_embeddings, refuse_embeddings, write_output
from wsishard.embedding.parts import Part, PartData, deal_parts, read_part, source_id, write_part
from wsishard.errors import ManifestError, OptionError
from wsishard.format import MANIFEST_NAME
from wsishard.manifest import Manifest, expected_patch_size
from wsishard.progress import ProgressCallback, ignore_progress
from wsishard.storage.opener import load_manifest
from wsishard.storage.output import Destination
from wsishard.storage.secrets import redact
from wsishard.streaming.collate import GpuCollate
from wsishard.streaming.dataset import ShardStream
from wsishard.streaming.loader import ShardLoader
from wsishard.streaming.sources import stream
from wsishard.streaming.world import World, detect_world

logger = logging.getLogger(__name__)

__all__ = ["EmbedProgress", "embed"]


@dataclass(frozen=True)
class EmbedProgress:
    """Patches embedded by this rank so far (those of parts found complete included) of its ``total``."""

    done: int
    total: int
    seconds: float  # since this rank started embedding


@dataclass
class _Pass:
    """What every part of one pass shares: the model on its device, the collate, the options."""

    model: torch.nn.Module
    name: str
    device: torch.device
    collate: GpuCollate
    options: EmbedOptions
    dim: int | None = None


def embed(
    shards: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model: torch.nn.Module | str,
    options: EmbedOptions | None = None,
    storage_options: Mapping[str, Any] | None = None,
    world: World | None = None,
    progress: ProgressCallback[EmbedProgress] = ignore_progress,
) -> Manifest | None:
    """Embed every patch of the build ``shards`` with ``model`` into the embeddings output ``out``.

    Under torchrun every rank embeds the parts dealt to it; rank 0 then writes the output (after a barrier when a
    process group is initialised). A killed run, run again with the same arguments, embeds only the parts it had not
    written.

    Args:
        shards: a build output (folder, manifest path or URL prefix) of pixel patches.
        out: the embeddings output (folder or URL prefix).
        model: a ``torch.nn.Module`` mapping normalized float images (B, 3, H, W) to features (B, D), or
            ``"MODULE:CALLABLE"`` whose call returns one.
        options: :class:`~wsishard.embedding.options.EmbedOptions`.
        storage_options: fsspec options for URLs.
        world: rank and world size; detected (torch.distributed, torchrun) when None.
        progress: called with an :class:`EmbedProgress` after every batch.

    Returns:
        The output's manifest on rank 0; None on the other ranks.

    Raises:
        ManifestError: ``shards`` is not a readable build, or is an embeddings output itself.
        ModelError: the model does not import, is not a module, or returns another shape than (B, D).
        OptionError: ``dtype="fp16"`` on a CPU device.
    """
    opts = options or EmbedOptions()
    where = redact(os.fspath(shards), storage_options)
    source, _ = load_manifest(os.fspath(shards), dict(storage_options or {}))
    refuse_embeddings(source, where, "embed reads the patches of a build (wsishard build)")
    if not source.shards:
        raise ManifestError(where, "lists no shards")
    world = world or detect_world()
    dest = Destination(os.fspath(out), storage_options)
    _check_output(dest, redact(os.fspath(out), storage_options))
    run = _start(model, opts)
    sid = source_id(source)
    fingerprint = _fingerprint(sid, run.name, opts)
    mine = deal_parts(source.shards, opts.part_samples, world.world_size)[world.rank]
    data = _embed_parts(run, mine, os.fspath(shards), dict(storage_options or {}), dest, fingerprint, progress)
    if world.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
    if world.rank != 0:
        return None
    parts = deal_parts(source.shards, opts.part_samples, 1)[0]
    joined = [data.get(p.index) or read_part(dest, p.index, fingerprint, p.samples) for p in parts]
    missing = [p.index for p, d in zip(parts, joined, strict=True) if d is None]
    if missing:
        raise ManifestError(
            os.fspath(out),
            f"parts {missing[:5]} not embedded yet: other ranks still running or killed (under torchrun, initialise a "
            "process group so that rank 0 waits for them; or run embed again once every rank is done)",
        )
    dims = {d.features.shape[1] for d in joined if d is not None}
    record = {
        "source": where,
        "source_id": sid,
        "model": run.name,
        "dim": dims.pop() if len(dims) == 1 else run.dim,
        "patch_size": expected_patch_size(source, where),
    }
    chosen = {**opts.record(), "dtype": opts.dtype, "slides_per_shard": opts.slides_per_shard, "model": run.name}
    return write_output(dest, [d for d in joined if d is not None], source, record, chosen)


def _check_output(dest: Destination, where: str) -> None:
    """Refuse an output that holds something else than an embeddings output (a build's shards would be overwritten).

    Raises:
        ManifestError: ``out`` holds a manifest that is not an embeddings output's.
    """
    text = dest.read_bytes(MANIFEST_NAME)
    if text is not None and not is_embeddings(Manifest.from_json(text.decode(), where)):
        raise ManifestError(where, "holds a build of pixel patches: embed writes an output of its own (another -o)")


def _start(model: torch.nn.Module | str, opts: EmbedOptions) -> _Pass:
    """The model loaded, on its device, in eval mode, with its collate."""
    local = os.environ.get("LOCAL_RANK", "0")  # torchrun's documented convention: this rank's GPU
    device = torch.device(opts.device or (f"cuda:{local}" if torch.cuda.is_available() else "cpu"))
    if device.type == "cpu" and opts.dtype == "fp16":
        raise OptionError("dtype fp16 on a CPU: autocast there runs bf16 or fp32 (--dtype bf16 or fp32)")
    net = load_model(model, opts.weights).to(device).eval()
    collate = GpuCollate(device, mean=opts.mean, std=opts.std, reuse_output=False)
    return _Pass(net, model_name(model), device, collate, opts)


def _fingerprint(sid: str, name: str, opts: EmbedOptions) -> str:
    text = json.dumps({"source": sid, "model": name, "dtype": opts.dtype, **opts.record()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _embed_parts(
    run: _Pass,
    parts: list[Part],
    source: str,
    storage_options: dict[str, Any],
    dest: Destination,
    fingerprint: str,
    progress: ProgressCallback[EmbedProgress],
) -> dict[int, PartData]:
    """Every part of ``parts`` embedded (or read back when a previous run wrote it), by index."""
    total, done, start = sum(p.samples for p in parts), 0, time.perf_counter()
    data: dict[int, PartData] = {}
    base: ShardStream | None = None
    for part in parts:
        found = read_part(dest, part.index, fingerprint, part.samples)
        if found is None:
            if base is None:
                base = stream(
                    source,
                    batch_size=run.options.batch_size,
                    resampled=False,
                    shuffle=0,
                    seed=0,
                    pad_last=True,
                    world=World(),
                    storage_options=storage_options,
                    context=False,
                    mixed_mpp=True,
                    split_scan=False,
                )
            found = _embed_part(
                run, base, part, lambda n: progress(EmbedProgress(n, total, time.perf_counter() - start)), done
            )
            write_part(dest, part.index, fingerprint, found)
        else:
            logger.info("part %d: embedded before, kept", part.index)
        data[part.index] = found
        done += part.samples
        progress(EmbedProgress(done, total, time.perf_counter() - start))
    return data


def _embed_part(run: _Pass, base: ShardStream, part: Part, progress: ProgressCallback[int], before: int) -> PartData:
    """The patches of ``part``'s shards, each exactly once (epoch mode, ``pad_last``: the repeats padding the last
    batch are marked not valid and dropped), through the loader and the collate into the model."""
    ds = ShardStream([base.shards[i] for i in part.shards], base.config, world=World(), opener=base.opener)
    ds.check_topology(run.options.num_workers)
    # ShardLoader itself, not loader(): this rank reads its parts alone (a world of one), while loader() would gather
    # every rank's workers over the process group, a collective the other ranks, on parts of their own, are not in
    pin = run.device.type == "cuda"
    batches = ShardLoader(ds, num_workers=run.options.num_workers, pin_memory=pin, reuse_buffers=True)
    keys: list[str] = []
    slides: list[str] = []
    coords: list[tuple[int, int]] = []
    feats: list[np.ndarray] = []
    for batch in batches:
        marks = cast(Any, batch).get("valid")  # (b,) bool: the stream's pad_last marks
        valid = marks.cpu().numpy() if marks is not None else np.ones(len(batch["key"]), bool)  # (b,) bool
        out = _forward(run, batch)  # (b, D) float32 on the CPU
        for i in np.flatnonzero(valid).tolist():
            meta = batch["meta"][i]
            keys.append(batch["key"][i])
            slides.append(str(meta["slide_id"]))
            coords.append((int(meta["x"]), int(meta["y"])))
        feats.append(out[valid])
        progress(before + len(keys))
    if len(keys) != part.samples or len(set(keys)) != part.samples:
        raise ManifestError(
            base.shards[part.shards[0]].url, f"part {part.index}: {len(set(keys))} distinct patches of {part.samples}"
        )
    return PartData(keys, slides, np.concatenate(feats).astype(np.float16), np.array(coords, dtype=np.int32))


def _forward(run: _Pass, batch: Any) -> np.ndarray:
    """One batch through the collate (uint8 -> normalized float on the device), the resize and the model."""
    images = run.collate(batch)["image"]  # (b, 3, h, w) float32 on the device
    size = run.options.resize_px
    if size is not None and tuple(images.shape[-2:]) != (size, size):
        images = torch.nn.functional.interpolate(images, size=(size, size), mode="bilinear", antialias=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(run.options.dtype)
    with torch.inference_mode(), torch.autocast(run.device.type, dtype=dtype, enabled=dtype is not None):
        out = check_features(run.model(images), images.shape[0], run.name, run.dim)
    run.dim = int(out.shape[1])
    return out.float().cpu().numpy()  # (b, D) float32
