"""wsishard.jax.loader in one process: the torch loader's batches as global jax.Arrays, copied out of its reused
buffers, padded epochs marked valid, and its position saved and restored. Two processes:
tests/distributed/test_jax_distributed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
from streamtools import COUNTS

from wsishard.streaming.loader import loader as torch_loader
from wsishard.streaming.sources import stream

jax = pytest.importorskip("jax")
wjax = pytest.importorskip("wsishard.jax")


def _epoch(out: sm.Output, **kw: object):  # type: ignore[no-untyped-def]
    return stream(out.root, batch_size=4, resampled=False, shuffle=8, seed=3, **kw)  # type: ignore[arg-type]


def test_kept_batches_equal_the_torch_loaders_own_copies(stream_out: sm.Output) -> None:
    """Reused buffers (the default) under 2 workers: every jax batch kept in a list still holds its own pixels."""
    kept = list(wjax.loader(_epoch(stream_out), num_workers=2))
    fresh = list(torch_loader(_epoch(stream_out), num_workers=2, reuse_buffers=False, pin_memory=False))
    assert len(kept) == len(fresh) > 3
    for mine, ref in zip(kept, fresh, strict=True):
        assert isinstance(mine["image"], jax.Array) and mine["image"].dtype == np.uint8
        assert mine["image"].sharding.is_equivalent_to(wjax.default_sharding(), 4)
        assert np.array_equal(np.asarray(mine["image"]), ref["image"].numpy())
        assert np.asarray(mine["label"]).tolist() == ref["label"].tolist()
        assert mine["key"] == ref["key"] and np.asarray(mine["valid"]).all()
        assert [m["slide_id"] for m in mine["meta"]] == [m["slide_id"] for m in ref["meta"]]
    assert {k for b in kept for k in b["key"]} <= set(stream_out.shard_of)


def test_pad_last_marks_the_repeats_and_yields_every_sample_once(stream_out: sm.Output) -> None:
    batches = list(wjax.loader(_epoch(stream_out, pad_last=True), num_workers=2))
    valid = [k for b in batches for k, v in zip(b["key"], np.asarray(b["valid"]).tolist(), strict=True) if v]
    assert sorted(valid) == sorted(stream_out.shard_of) and len(valid) == sum(COUNTS)
    assert all(b["image"].shape == (4, 16, 16, 3) for b in batches)
    assert sum(len(b["key"]) for b in batches) > sum(COUNTS)  # sum(COUNTS) = 74 is no multiple of 4: repeats


def test_state_dict_resumes_where_the_loop_stood(stream_out: sm.Output) -> None:
    whole = [b["key"] for b in wjax.loader(_epoch(stream_out), num_workers=2)]
    first = wjax.loader(_epoch(stream_out), num_workers=2)
    it = iter(first)
    taken = [next(it)["key"] for _ in range(3)]
    state = first.state_dict()
    del it
    again = wjax.loader(_epoch(stream_out), num_workers=2)
    again.load_state_dict(state)
    rest = [b["key"] for b in again]
    assert taken + rest == whole


def test_torch_only_options_and_a_sharding_of_another_kind_are_refused(stream_out: sm.Output) -> None:
    with pytest.raises(ValueError, match="decode"):
        wjax.loader(_epoch(stream_out), num_workers=0, decode="device")
    single = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with pytest.raises(ValueError, match=r"NamedSharding .*got SingleDeviceSharding"):
        wjax.loader(_epoch(stream_out), num_workers=0, sharding=single)


_FOUR_DEVICES = """
import json, sys
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec
import wsishard.jax as wjax
from wsishard.streaming.sources import stream

mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
ds = stream(sys.argv[1], batch_size=2, resampled=False, shuffle=0, seed=0, drop_last=False)
batch = next(iter(wjax.loader(ds, num_workers=0, sharding=NamedSharding(mesh, PartitionSpec("data")))))
out = {"shape": list(batch["image"].shape), "devices": len(batch["image"].sharding.device_set)}
try:
    next(iter(wjax.loader(ds, num_workers=0)))  # 2 rows over 4 devices, each its own block
except ValueError as exc:
    out["refused"] = str(exc)
print(json.dumps(out))
"""


def test_a_two_axis_mesh_splits_the_batch_over_its_data_axis_and_an_unsplittable_batch_is_named(
    stream_out: sm.Output, tmp_path: Path
) -> None:
    """4 CPU devices (a fresh interpreter: the device count is fixed when jax starts)."""
    script = tmp_path / "four.py"
    script.write_text(_FOUR_DEVICES)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(script), stream_out.root]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["shape"] == [2, 16, 16, 3] and out["devices"] == 4
    assert out["refused"] == (
        "a global batch of 2 samples (2 a process) does not split into the sharding's 4 blocks along the batch: give "
        "each process a batch_size that is a multiple of 4"
    )


def test_a_short_batch_under_several_processes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under several processes every process's batch must be full (a global array of P x B rows): the one short
    batch of a 3-sample epoch is refused by name, before any array is made. (One real process, told there are
    two: the two-process run is tests/distributed/test_jax_distributed.py's.)"""
    out = sm.make_output(str(tmp_path / "out"), (3,))
    ds = stream(out.root, batch_size=4, resampled=False, drop_last=False, shuffle=0, seed=0)
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    with pytest.raises(ValueError, match=r"a batch of 3 samples, not batch_size=4: .*pad_last=True"):
        next(iter(wjax.JaxLoader(torch_loader(ds, num_workers=0, pin_memory=False))))
