"""wsishard: whole-slide images to mixed tissue-patch WebDataset shards, streamed into PyTorch.

Public names are loaded on first use, so that ``import wsishard`` (and every build worker, which imports
submodules) does not pay for torch and webdataset unless the streaming side is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    # build side
    "build": "wsishard.build",
    "BuildOptions": "wsishard.build",
    "BuildProgress": "wsishard.build",
    "find_slides": "wsishard.inputs",
    "PatchOptions": "wsishard.grid",
    "TissueOptions": "wsishard.tissue",
    "detect_tissue": "wsishard.tissue",
    "Manifest": "wsishard.format",
    "ShardRecord": "wsishard.format",
    "SlideRecord": "wsishard.format",
    "PatchMeta": "wsishard.format",
    "load_manifest": "wsishard.storage",
    "open_slide": "wsishard.slide",
    # training side
    "stream": "wsishard.stream",
    "loader": "wsishard.stream",
    "ShardStream": "wsishard.stream",
    "ShardLoader": "wsishard.stream",
    "StreamConfig": "wsishard.stream",
    "detect_world": "wsishard.stream",
    "Batch": "wsishard.samples",
    "Sample": "wsishard.samples",
    "World": "wsishard.partition",
    "EpochPlan": "wsishard.partition",
    "plan_epoch": "wsishard.partition",
    "GpuCollate": "wsishard.collate",
    "DeviceBatch": "wsishard.collate",
    "MonitoredLoader": "wsishard.monitor",
    "LoaderReport": "wsishard.monitor",
    "StreamOpener": "wsishard.storage",
    "register_gopen_schemes": "wsishard.storage",
    "verify": "wsishard.verify",
    "VerifyReport": "wsishard.verify",
    "merge": "wsishard.merge",
    "RetryPolicy": "wsishard.remote",
    # errors
    "WsiShardError": "wsishard.errors",
    "OptionError": "wsishard.errors",
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
    "MissingMppError",
    "MonitoredLoader",
    "OptionError",
    "PatchMeta",
    "PatchOptions",
    "RetryPolicy",
    "Sample",
    "ShardError",
    "ShardLoader",
    "ShardRecord",
    "ShardStream",
    "SlideError",
    "SlideRecord",
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
    "load_manifest",
    "loader",
    "merge",
    "open_slide",
    "plan_epoch",
    "register_gopen_schemes",
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
    from wsishard.build import BuildOptions, BuildProgress, build
    from wsishard.collate import DeviceBatch, GpuCollate
    from wsishard.errors import (
        ManifestError,
        MissingMppError,
        OptionError,
        ShardError,
        SlideError,
        TopologyError,
        WsiShardError,
    )
    from wsishard.format import Manifest, PatchMeta, ShardRecord, SlideRecord
    from wsishard.grid import PatchOptions
    from wsishard.inputs import find_slides
    from wsishard.merge import merge
    from wsishard.monitor import LoaderReport, MonitoredLoader
    from wsishard.partition import EpochPlan, World, plan_epoch
    from wsishard.remote import RetryPolicy
    from wsishard.samples import Batch, Sample
    from wsishard.slide import open_slide
    from wsishard.storage import StreamOpener, load_manifest, register_gopen_schemes
    from wsishard.stream import ShardLoader, ShardStream, StreamConfig, detect_world, loader, stream
    from wsishard.tissue import TissueOptions, detect_tissue
    from wsishard.verify import VerifyReport, verify
