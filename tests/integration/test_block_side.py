"""The read blocks' side: by default about 2048 output px (8x8 patches of 256 px), fewer where a shard holds less
than a block of each of its group's slides; chosen per build, recorded, and fewer tile decodes in a build of many
shards than the 4x4 blocks before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.patchopts import PatchOptions
from wsishard.builder.run.orchestrate import build
from wsishard.errors import OptionError
from wsishard.slide.tiff import TILES
from wsishard.testing.synthetic import make_slide


@pytest.mark.parametrize(
    ("slides", "options", "side"),
    [
        (4, {}, 8),  # 256 px patches, 256 MB shards: 8x8
        (4, {"patch": PatchOptions(patch_size_px=512)}, 4),  # 2048 px a side
        (4, {"patch": PatchOptions(patch_size_px=4096)}, 1),
        (4, {"patch": PatchOptions(patch_size_px=64)}, 8),  # never more than 8 patches a side
        (24, {"shard_samples": 300}, 3),  # 300 // 24 slides a group = 12 patches: 3x3 of each slide in every shard
        (100, {"shard_samples": 300}, 3),  # 4 groups of 25 slides (sizes within one): 300 // 25 = 12 -> 3x3
        (1000, {"shard_size_bytes": 16 << 20}, 5),  # ~1,000 patches of ~16 KB a shard over 32 slides
        (3, {"shard_samples": 5}, 1),
        (4, {"patch": PatchOptions(block_patches=4)}, 4),  # given: kept
    ],
)
def test_the_default_block_side(slides: int, options: dict[str, object], side: int) -> None:
    chosen = BuildOptions(**options).with_block_side(slides)  # type: ignore[arg-type]
    assert chosen.patch.block_patches == chosen.block_side == side
    assert BuildOptions(**options).patch.block_patches == options.get("patch", PatchOptions()).block_patches  # type: ignore[union-attr]


def test_a_given_block_a_shard_cannot_hold_is_refused() -> None:
    with pytest.raises(OptionError, match=r"invalid shard_samples: 10 \(need >= 16: one block\)"):
        BuildOptions(shard_samples=10, patch=PatchOptions(block_patches=4))


def test_default_blocks_decode_fewer_tiles_in_a_build_of_many_shards(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slide's blocks are dealt to different shards, so the tiles along two blocks' common edge are decoded once per
    block: larger blocks have fewer such edges. Same patches either way; the manifest records the side chosen. The
    tile cache is cut to 1 MB (about 20 tiles at 1/2), as small beside this slide as 16 MB is beside a real one."""
    monkeypatch.setattr(TILES, "max_bytes", 1 << 20)
    (tmp_path / "in").mkdir()
    make_slide(tmp_path / "in" / "s.svs", width=6144, height=6144, mpp=0.2520, tissue_fraction=0.5, seed=3)
    decodes: dict[str, int] = {}
    keys: dict[str, dict[str, int]] = {}
    for name, block in (("4x4", 4), ("default", None)):
        options = BuildOptions(
            patch=PatchOptions(patch_size_px=128, block_patches=block), shard_samples=60, jobs=1, qc=False
        )
        before = TILES.misses
        manifest = build([str(tmp_path / "in")], str(tmp_path / name), options)
        decodes[name] = TILES.misses - before
        assert len(manifest.shards) >= 4
        recorded = json.loads((tmp_path / name / "manifest.json").read_text())["options"]["patch"]["block_patches"]
        assert recorded == (block or 7)  # 2048 // 128 = 16 -> at most 8; 60 patches a shard of one slide -> 7
        keys[name] = {s.slide_id: s.patches for s in manifest.slides}
    assert keys["default"] == keys["4x4"]
    assert decodes["default"] < 0.95 * decodes["4x4"], decodes
