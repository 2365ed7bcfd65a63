"""wsishard: whole-slide images to mixed tissue-patch WebDataset shards, streamed into PyTorch.

Public names are loaded on first use, so that ``import wsishard`` (and every build worker, which imports
submodules) does not pay for torch and webdataset unless the streaming side is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_EXPORTS: dict[str, str] = {
    # build side
    "build": "wsishard.builder.run",
    "BuildOptions": "wsishard.builder.options",
    "BuildProgress": "wsishard.builder.options",
    "find_slides": "wsishard.builder.inputs",
    "PatchOptions": "wsishard.builder.grid",
    "TissueOptions": "wsishard.builder.tissue",
    "detect_tissue": "wsishard.builder.tissue",
    "Manifest": "wsishard.manifest",
    "ShardRecord": "wsishard.manifest",
    "SlideRecord": "wsishard.manifest",
    "PatchMeta": "wsishard.format",
    "load_manifest": "wsishard.storage.opener",
    "open_slide": "wsishard.slide",
    # training side
    "stream": "wsishard.streaming.sources",
    "loader": "wsishard.streaming.loader",
    "ShardStream": "wsishard.streaming.dataset",
    "ShardLoader": "wsishard.streaming.loader",
    "StreamConfig": "wsishard.streaming.dataset",
    "detect_world": "wsishard.streaming.world",
    "Batch": "wsishard.streaming.decode",
    "Metas": "wsishard.streaming.decode",
    "Sample": "wsishard.streaming.decode",
    "World": "wsishard.streaming.world",
    "EpochPlan": "wsishard.streaming.partition",
    "plan_epoch": "wsishard.streaming.partition",
    "GpuCollate": "wsishard.streaming.collate",
    "DeviceBatch": "wsishard.streaming.collate",
    "StainOptions": "wsishard.streaming.stain",
    "StainTable": "wsishard.streaming.stain",
    "StainTarget": "wsishard.streaming.stain",
    "MonitoredLoader": "wsishard.streaming.monitor",
    "LoaderReport": "wsishard.streaming.monitor",
    "StreamOpener": "wsishard.storage.opener",
    "register_gopen_schemes": "wsishard.streaming.plain",
    "shard_urls": "wsishard.streaming.plain",
    "is_sample_member": "wsishard.format",
    "is_context_member": "wsishard.format",
    "verify": "wsishard.shards.verify",
    "VerifyReport": "wsishard.shards.verify",
    "merge": "wsishard.builder.merge",
    "RetryPolicy": "wsishard.storage.retry",
    # errors
    "WsiShardError": "wsishard.errors",
    "OptionError": "wsishard.errors",
    "OutputError": "wsishard.errors",
    "ResourceError": "wsishard.errors",
    "SlideError": "wsishard.errors",
    "MissingMppError": "wsishard.errors",
    "ShardError": "wsishard.errors",
    "ManifestError": "wsishard.errors",
    "TopologyError": "wsishard.errors",
}

__all__ = [
    "Batch",
    "BuildOptions",
    "BuildProgress",
    "DeviceBatch",
    "EpochPlan",
    "GpuCollate",
    "LoaderReport",
    "Manifest",
    "ManifestError",
    "Metas",
    "MissingMppError",
    "MonitoredLoader",
    "OptionError",
    "OutputError",
    "PatchMeta",
    "PatchOptions",
    "ResourceError",
    "RetryPolicy",
    "Sample",
    "ShardError",
    "ShardLoader",
    "ShardRecord",
    "ShardStream",
    "SlideError",
    "SlideRecord",
    "StainOptions",
    "StainTable",
    "StainTarget",
    "StreamConfig",
    "StreamOpener",
    "TissueOptions",
    "TopologyError",
    "VerifyReport",
    "World",
    "WsiShardError",
    "__version__",
    "build",
    "detect_tissue",
    "detect_world",
    "find_slides",
    "is_context_member",
    "is_sample_member",
    "load_manifest",
    "loader",
    "merge",
    "open_slide",
    "plan_epoch",
    "register_gopen_schemes",
    "shard_urls",
    "stream",
    "verify",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wsishard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from wsishard.builder.grid import PatchOptions
    from wsishard.builder.inputs import find_slides
    from wsishard.builder.merge import merge
    from wsishard.builder.options import BuildOptions, BuildProgress
    from wsishard.builder.run import build
    from wsishard.builder.tissue import TissueOptions, detect_tissue
    from wsishard.errors import (
        ManifestError,
        MissingMppError,
        OptionError,
        OutputError,
        ResourceError,
        ShardError,
        SlideError,
        TopologyError,
        WsiShardError,
    )
    from wsishard.format import PatchMeta, is_context_member, is_sample_member
    from wsishard.manifest import Manifest, ShardRecord, SlideRecord
    from wsishard.shards.verify import VerifyReport, verify
    from wsishard.slide import open_slide
    from wsishard.storage.opener import StreamOpener, load_manifest
    from wsishard.storage.retry import RetryPolicy
    from wsishard.streaming.collate import DeviceBatch, GpuCollate
    from wsishard.streaming.dataset import ShardStream, StreamConfig
    from wsishard.streaming.decode import Batch, Metas, Sample
    from wsishard.streaming.loader import ShardLoader, loader
    from wsishard.streaming.monitor import LoaderReport, MonitoredLoader
    from wsishard.streaming.partition import EpochPlan, plan_epoch
    from wsishard.streaming.plain import register_gopen_schemes, shard_urls
    from wsishard.streaming.sources import stream
    from wsishard.streaming.stain import StainOptions, StainTable, StainTarget
    from wsishard.streaming.world import World, detect_world
