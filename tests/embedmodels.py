"""Deterministic user models for ``wsishard embed`` tests, named as ``embedmodels:CALLABLE`` (tests/ is on the path).

``mean_linear``: per-channel means of the normalized image, then a fixed (3 -> 8) linear layer: the features of a
patch are computable by hand from its decoded JPEG.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

DIM = 8


class MeanLinear(torch.nn.Module):
    """(B, 3, H, W) -> (B, 8): spatial mean per channel, then a fixed linear map (seeded weights)."""

    def __init__(self) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(7)
        self.linear = torch.nn.Linear(3, DIM)
        with torch.no_grad():
            self.linear.weight.copy_(torch.randn(DIM, 3, generator=gen))
            self.linear.bias.copy_(torch.randn(DIM, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x.mean(dim=(2, 3)))


class WrongShape(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=3)  # (B, 3, H): not (B, D)


def mean_linear() -> torch.nn.Module:
    return MeanLinear()


def wrong_shape() -> torch.nn.Module:
    return WrongShape()


def not_a_module() -> object:
    return "a string"


def make_source(root: Path, labels: dict[str, int] | None = None) -> Path:
    """Three generated slides (2048 px a side) built into shards of 40 patches or fewer (64 px) under ``root``."""
    from buildtools import SMALL_BUILD

    from wsishard.builder.run.orchestrate import build
    from wsishard.testing.synthetic import make_slides

    make_slides(root / "slides", 3, seed=21, width=2048, height=2048)
    manifest = build(
        [str(root / "slides")], str(root / "out"), replace(SMALL_BUILD, shard_samples=40, labels=labels or {})
    )
    assert len(manifest.shards) >= 4 and not manifest.failed_slides
    return root / "out"
