"""examples/train_jax.py runs a few steps on CPU, as a user runs it: a labelled build (its labels) and an
unlabelled one (which slide each patch came from), on 2 CPU devices."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import shardmaker as sm

pytest.importorskip("jax")
pytest.importorskip("optax")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("labelled", [True, False])
def test_train_jax_runs_steps_on_cpu(tmp_path: Path, labelled: bool) -> None:
    out = sm.make_output(str(tmp_path / "out"), (12, 12, 12, 12), labelled=labelled)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    cmd = [sys.executable, str(ROOT / "examples" / "train_jax.py"), out.root, "--steps", "4", "--batch-size", "4"]
    cmd += ["--workers", "1", "--log-every", "1", "--shuffle", "8"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["steps"] == 4 and summary["devices"] == 2 and summary["global_batch"] == 4
    assert len(summary["losses"]) == 4 and all(math.isfinite(x) and x > 0 for x in summary["losses"])
    assert summary["samples_per_s"] > 0
