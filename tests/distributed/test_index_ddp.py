"""A tampered shard index under torchrun, 2 ranks (gloo): with the scan split over the ranks only one rank reads the
bad index, and yet both raise the named error (an error flag travels with the scan's sum), and neither waits in the
collective for the other; with the whole scan on each rank, both find it themselves. The process group's timeout is
short (20 s) and the subprocess has a hard limit. Run as a script (under torchrun) this file is the per-rank program.
"""

from __future__ import annotations

import datetime
import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import shardmaker as sm
from test_distributed import _torchrun

from wsishard.format import shard_name
from wsishard.shards.index import index_name
from wsishard.shards.summary import index_build

COUNTS = (30, 30, 30, 30, 30, 30)
BAD = 1  # rank 1 reads shards 1, 3, 5 in a split scan: rank 0 never opens this index


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    root = tmp_path_factory.mktemp("ddp-index")
    out = sm.make_output(str(root / "out"), COUNTS, slides=3, slide_labels=(0, 1, 0))
    index_build(out.root)
    path = Path(out.root) / index_name(shard_name(BAD))
    with np.load(path, allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files}
    arrays["key"] = arrays["key"][::-1].copy()  # the same keys, in another order: select= would drop them
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    path.write_bytes(buf.getvalue())
    result = root / "result"
    result.mkdir()
    _torchrun(__file__, out.root, str(result), timeout=150)
    return [json.loads((result / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("scan", ["split", "whole"])
def test_every_rank_raises_the_named_index_error(ranks: list[dict], scan: str) -> None:
    bad = index_name(shard_name(BAD))
    for r in ranks:
        kind, message = r[scan]
        assert kind == "IndexFileError" and message.startswith("index ") and bad in message, (scan, r)
    assert "is not the index the build wrote" in ranks[BAD][scan][1]
    if scan == "split":  # rank 0 never read it: it names the index and the rank that did
        assert f"rank {BAD} found this index unusable" in ranks[0][scan][1]


def _keep(t: dict) -> object:
    return t["position"] % 2 == 0


def _attempt(root: str, split: bool) -> list[str]:
    from wsishard.streaming.sources import stream

    try:
        stream(root, batch_size=8, resampled=False, pad_last=True, select=_keep, split_scan=split)
    except Exception as exc:
        return [type(exc).__name__, str(exc)]
    return ["", "no error"]


def _rank_main(root: str, result_dir: str) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
    results = {"split": _attempt(root, True), "whole": _attempt(root, False)}
    Path(result_dir, f"rank{dist.get_rank()}.json").write_text(json.dumps(results))
    dist.all_reduce(torch.ones(1))  # both ranks got here: neither is left waiting in the scan's collective
    dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main(sys.argv[1], sys.argv[2])
