"""The public names of ``wsishard``, the one list of them: type checkers read it, and at run time ``__init__.py``
reads it too and loads each name from its module on first use (``import wsishard`` pays for no torch)."""

__version__: str

from wsishard.builder.inputs.sources import find_slides as find_slides
from wsishard.builder.options.buildopts import BuildOptions as BuildOptions
from wsishard.builder.options.buildopts import BuildProgress as BuildProgress
from wsishard.builder.options.patchopts import PatchOptions as PatchOptions
from wsishard.builder.options.tissueopts import TissueOptions as TissueOptions
from wsishard.builder.run.merge import merge as merge
from wsishard.builder.run.orchestrate import build as build
from wsishard.builder.scan.tissue import detect_tissue as detect_tissue
from wsishard.errors import ManifestError as ManifestError
from wsishard.errors import MissingMppError as MissingMppError
from wsishard.errors import OptionError as OptionError
from wsishard.errors import OutputError as OutputError
from wsishard.errors import ResourceError as ResourceError
from wsishard.errors import ShardError as ShardError
from wsishard.errors import SlideError as SlideError
from wsishard.errors import TopologyError as TopologyError
from wsishard.errors import WsiShardError as WsiShardError
from wsishard.format import PatchMeta as PatchMeta
from wsishard.format import is_context_member as is_context_member
from wsishard.format import is_sample_member as is_sample_member
from wsishard.format import patch_meta as patch_meta
from wsishard.manifest import Manifest as Manifest
from wsishard.manifest import ShardRecord as ShardRecord
from wsishard.manifest import SlideRecord as SlideRecord
from wsishard.shards.verify import VerifyReport as VerifyReport
from wsishard.shards.verify import verify as verify
from wsishard.slide import open_slide as open_slide
from wsishard.storage.opener import StreamOpener as StreamOpener
from wsishard.storage.opener import load_manifest as load_manifest
from wsishard.storage.retry import RetryPolicy as RetryPolicy
from wsishard.streaming.collate import DeviceBatch as DeviceBatch
from wsishard.streaming.collate import GpuCollate as GpuCollate
from wsishard.streaming.config import StreamConfig as StreamConfig
from wsishard.streaming.dataset import ShardStream as ShardStream
from wsishard.streaming.decode import Batch as Batch
from wsishard.streaming.decode import Metas as Metas
from wsishard.streaming.decode import Sample as Sample
from wsishard.streaming.loader import ShardLoader as ShardLoader
from wsishard.streaming.loader import loader as loader
from wsishard.streaming.monitor import LoaderReport as LoaderReport
from wsishard.streaming.monitor import MonitoredLoader as MonitoredLoader
from wsishard.streaming.multicrop import MultiCrop as MultiCrop
from wsishard.streaming.plain import register_gopen_schemes as register_gopen_schemes
from wsishard.streaming.plain import shard_urls as shard_urls
from wsishard.streaming.planner import Plan as Plan
from wsishard.streaming.planner import Spec as Spec
from wsishard.streaming.planner import plan_epoch as plan_epoch
from wsishard.streaming.sources import stream as stream
from wsishard.streaming.stain import StainOptions as StainOptions
from wsishard.streaming.stain import StainTable as StainTable
from wsishard.streaming.stain import StainTarget as StainTarget
from wsishard.streaming.world import World as World
from wsishard.streaming.world import detect_world as detect_world
