"""Context patches in the stream: what a build's manifest says of them, and their decode into the batch.

A build made with context scales (``wsishard build --context-mpp``) records ``options["context_mpp"]`` (ascending
floats, K of them) and ``options["context_size"]`` (px), and every sample carries the members ``ctx0.<ext>`` ...
``ctx<K-1>.<ext>`` (:func:`wsishard.format.context_ext`). The stream decodes them into ``batch["context"]``,
``(b, K, size, size, 3)`` uint8, in the same shared buffer as the batch's images
(:class:`~wsishard.streaming.ring.BatchBuffers`). Builds without context (``context_mpp`` absent or empty) give no
``"context"``. Sources streamed together must agree on the scales and the size.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from wsishard.errors import ManifestError, ShardError
from wsishard.format import MAX_PATCH_PX, context_ext, image_header
from wsishard.manifest import Manifest
from wsishard.streaming.stages import RawSample

__all__ = ["ContextSpec", "check_context", "context_shape", "decode_context_into", "one_context", "read_context"]

MAX_SCALES = 64  # context scales a manifest may name: more is a damaged manifest, not a build


@dataclass(frozen=True)
class ContextSpec:
    """A build's context scales: each scale's mpp (ascending; empty: no context) and the patches' size, px."""

    mpp: tuple[float, ...] = ()
    size_px: int | None = None

    def describe(self) -> str:
        """``"context_mpp [2.0, 8.0] at 224 px"``, or ``"no context"``."""
        return f"context_mpp {list(self.mpp)} at {self.size_px} px" if self.mpp else "no context"


def read_context(manifest: Manifest, location: str, patch_size_px: int) -> ContextSpec:
    """The context scales ``manifest``'s build recorded: ``options["context_mpp"]`` and ``options["context_size"]``
    (the patch size where absent). An older build without them has none.

    Raises:
        ManifestError: they are there but are no list of (at most :data:`MAX_SCALES`) positive numbers and an
            integer px from 1 to :data:`~wsishard.format.MAX_PATCH_PX`.
    """
    options: Mapping[str, Any] = manifest.options if isinstance(manifest.options, dict) else {}
    mpp, size = options.get("context_mpp") or [], options.get("context_size")
    if not isinstance(mpp, list) or len(mpp) > MAX_SCALES or not all(_positive(v) for v in mpp):
        shown = repr(mpp) if len(repr(mpp)) <= 80 else repr(mpp)[:80] + "..."
        raise ManifestError(
            location, f"options.context_mpp is {shown}, not a list of at most {MAX_SCALES} mpp values > 0"
        )
    if not mpp:
        return ContextSpec()
    if size is None:
        size = patch_size_px
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_PATCH_PX:
        raise ManifestError(location, f"options.context_size is {size!r}, not a context patch size in px")
    return ContextSpec(tuple(float(v) for v in mpp), size)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def one_context(specs: Mapping[str, ContextSpec]) -> ContextSpec:
    """The context all sources share (by their redacted locations): a batch holds one ``(K, size)``.

    Raises:
        ManifestError: two sources differ (scales, their number, or size): both are named with theirs.
    """
    items = list(specs.items())
    first_where, first = items[0]
    for where, spec in items[1:]:
        if spec != first:
            raise ManifestError(
                f"{first_where}, {where}",
                f"the outputs have different context ({first_where}: "
                f"{first.describe()}; {where}: {spec.describe()}): stream them apart, or pass "
                "context=False to stream their main patches only",
            )
    return first


def check_context(scales: int, size_px: int | None) -> None:
    """Raise ``ValueError`` for a stream config's context fields that do not go together."""
    if isinstance(scales, bool) or not isinstance(scales, int) or scales < 0:
        raise ValueError(f"context_scales must be an integer >= 0, got {scales!r}")
    if scales and (size_px is None or size_px < 1):
        raise ValueError(f"context_size_px must be >= 1 px with {scales} context scale(s), got {size_px!r}")


def context_shape(config: Any) -> tuple[int, int] | None:
    """``(K, size)`` of the context a stream config decodes (a :class:`~wsishard.streaming.dataset.StreamConfig`),
    or None."""
    return (config.context_scales, config.context_size_px) if config.context_scales else None


Decoder = Callable[[RawSample, np.ndarray], None]  # decode a sample's image into a (h, w, 3) uint8 slot


def decode_context_into(raw: RawSample, slots: np.ndarray, decode_into: Decoder) -> None:
    """Decode the sample's context members into ``slots``, ``(K, size, size, 3)`` uint8, one scale each, through
    ``decode_into`` (:func:`~wsishard.streaming.decode.decode_into`, so they are checked and decoded as the main
    image is).

    Raises:
        ShardError: a member is no image of the slots' size, or does not decode (the member named).
    """
    for k, data in enumerate(raw["context"]):
        header = image_header(data)
        if header is not None and (header[2], header[1]) != slots.shape[1:3]:
            raise ShardError(
                raw["shard"],
                f"sample {raw['key']}: its context member {context_ext(k, header[0])} "
                f"is {header[1]}x{header[2]} px, not {slots.shape[2]}x{slots.shape[1]} px "
                "(the manifest's context_size)",
            )
        member: RawSample = {**raw, "key": f"{raw['key']} (context member ctx{k})", "image": data}
        decode_into(member, slots[k])
