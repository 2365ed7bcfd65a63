"""Issue 46's done-when: two ``jax.distributed`` processes of 2 CPU devices each, no torch.distributed, stream one
padded epoch through ``wsishard.jax.loader`` (process 0 with 2 DataLoader workers, process 1 with 1: gathered and
planned alike): every batch one global (2 x B, h, w, 3) array over the 4 devices, every sample valid exactly once
over both processes, as many batches on each, and ``wsishard.jax.Collate`` of the global batch bit for bit
``GpuCollate``'s. Hard time limits: a hang fails. Run as a script, this file is the per-process program.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shardmaker as sm

pytest.importorskip("jax")

ROOT = Path(__file__).resolve().parents[2]
COUNTS = (10, 7, 12, 5, 9, 14, 6, 11, 8)  # 82 samples: no multiple of the global batch, so the last ones pad
BATCH, WORKERS, SEED = 4, 2, 5
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _free_port() -> int:
    from servers import free_port

    return free_port()


@pytest.fixture(scope="module")
def processes(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = sm.make_output(str(tmp_path_factory.mktemp("jaxdist")), COUNTS)
    result = tmp_path_factory.mktemp("result")
    port = _free_port()
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "JAX_PLATFORMS": "cpu",
    }
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, out.root, str(result), str(i), str(port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=180)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        tails = " | ".join(p.communicate()[0][-3000:] for p in procs)
        pytest.fail(f"a jax.distributed process hung (> 180 s): {tails}")
    for p, log in zip(procs, logs, strict=True):
        assert p.returncode == 0, log[-6000:]
    found = [json.loads((result / f"process{i}.json").read_text()) for i in range(2)]
    return [{**f, "expected": sorted(out.shard_of)} for f in found]


@pytest.mark.timeout(300)
def test_one_padded_epoch_over_two_processes_and_four_devices(processes: list[dict]) -> None:
    a, b = processes
    assert a["rank"] == 0 and b["rank"] == 1 and a["world_size"] == b["world_size"] == 2  # from jax.distributed
    assert a["batches"] == b["batches"] > 0
    assert a["workers_by_rank"] == b["workers_by_rank"] == [2, 1]  # gathered over jax: both plan the same readers
    for p in processes:
        assert p["shapes"] == [[2 * BATCH, 16, 16, 3]] * p["batches"]
        assert p["devices"] == [4] * p["batches"] and p["local_shards"] == [2] * p["batches"]
        assert p["rows_match"] == [True] * p["batches"]  # each process's rows of the global array are its batch
    valid = [k for p in processes for k, v in zip(p["keys"], p["valid"], strict=True) if v]
    assert sorted(valid) == a["expected"] and len(valid) == sum(COUNTS)
    assert len(a["keys"]) + len(b["keys"]) == 2 * BATCH * a["batches"] > sum(COUNTS)  # padded
    assert a["valid_sums"] == b["valid_sums"]  # a jitted sum over the global valid array: the same on both
    assert sum(a["valid_sums"]) == sum(COUNTS)


@pytest.mark.timeout(300)
def test_the_jax_collate_of_the_global_batch_is_gpu_collates(processes: list[dict]) -> None:
    for p in processes:
        assert p["collate_diff"] == [0.0] * p["batches"]  # bit for bit


def _process_main(build: str, result: str, process_id: int, port: int) -> None:
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
    )
    import jax.numpy as jnp
    import numpy as np
    import torch
    from jax.experimental import multihost_utils

    import wsishard.jax as wjax
    from wsishard.streaming.collate import GpuCollate
    from wsishard.streaming.sources import stream

    assert not torch.distributed.is_initialized()
    ds = stream(build, batch_size=BATCH, resampled=False, pad_last=True, shuffle=8, seed=0)
    collate = wjax.Collate(mean=MEAN, std=STD, augment=True, seed=SEED)
    reference = GpuCollate("cpu", mean=MEAN, std=STD, augment=True, seed=SEED)
    total = jax.jit(lambda v: jnp.sum(v.astype(jnp.int32)))
    rec: dict = {"rank": ds.world.rank, "world_size": ds.world.world_size, "keys": [], "valid": []}
    for name in ("shapes", "devices", "local_shards", "rows_match", "valid_sums", "collate_diff"):
        rec[name] = []
    for batch in wjax.loader(ds, num_workers=WORKERS - process_id):  # 2 and 1: gathered, planned alike
        image, valid = batch["image"], batch["valid"]
        mine = sorted(image.addressable_shards, key=lambda s: s.index[0].start)
        rows = np.concatenate([np.asarray(s.data) for s in mine])  # this process's rows of the global batch
        full = np.asarray(multihost_utils.process_allgather(image, tiled=True))  # (2B, h, w, 3) on every process
        rec["rows_match"].append(
            mine[0].index[0].start == process_id * BATCH
            and bool(np.array_equal(rows, full[process_id * BATCH : (process_id + 1) * BATCH]))
        )
        rec["shapes"].append(list(image.shape))
        rec["devices"].append(len(image.sharding.device_set))
        rec["local_shards"].append(len(mine))
        rec["keys"] += batch["key"]
        flags = sorted(valid.addressable_shards, key=lambda s: s.index[0].start)
        rec["valid"] += np.concatenate([np.asarray(s.data) for s in flags]).tolist()
        rec["valid_sums"].append(int(total(valid)))
        out = collate(batch)["image"]
        ref = reference.images(torch.from_numpy(full)).permute(0, 2, 3, 1).numpy()
        diff = max(float(np.abs(np.asarray(s.data) - ref[s.index]).max()) for s in out.addressable_shards)
        rec["collate_diff"].append(diff)
    rec["batches"] = len(rec["shapes"])
    rec["workers_by_rank"] = list(ds.workers_by_rank or ())
    Path(result, f"process{process_id}.json").write_text(json.dumps(rec))
    jax.distributed.shutdown()


if __name__ == "__main__":
    _process_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
