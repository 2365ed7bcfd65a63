"""The ``wsishard`` command: argparse over the library. Logging and progress bars are set up here only."""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from wsishard import __version__
from wsishard.builder.grid import PatchOptions
from wsishard.builder.inputs import label_table, mpp_table
from wsishard.builder.merge import merge
from wsishard.builder.options import BuildOptions, BuildProgress
from wsishard.builder.run import build
from wsishard.builder.tissue import TissueOptions
from wsishard.errors import OptionError, WsiShardError
from wsishard.format import IMAGE_FORMATS
from wsishard.report import details, summary
from wsishard.shards.verify import VerifyProgress, format_report, verify
from wsishard.storage.opener import load_manifest
from wsishard.storage.secrets import redact

logger = logging.getLogger("wsishard")

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)
EXIT_OK, EXIT_FAILED_SLIDES, EXIT_USAGE = 0, 1, 2


def parse_size(text: str) -> int:
    """``512MB`` -> 512000000, ``1GiB`` -> 1073741824, ``100k`` -> 100000, ``4096`` -> 4096."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 512MB, 1GiB, 100000)")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " kmgt".index(unit.lower() or " "))


def _number(kind: type, ok: Callable[[Any], bool], rule: str) -> Callable[[str], Any]:
    """An argparse ``type``: ``kind(text)``, refused with ``rule`` unless ``ok(value)``."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {'an integer' if kind is int else 'a number'}: {text!r}") from None
        if not ok(value):
            raise argparse.ArgumentTypeError(f"{rule}: {text!r}")
        return value

    return parse


def _positive(kind: type) -> Callable[[str], Any]:
    return _number(kind, lambda v: v > 0, "must be > 0")


_non_negative = _number(float, lambda v: v >= 0, "must be >= 0")
_fraction = _number(float, lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1")


def _table(read: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` reading a per-slide CSV table; its OptionError becomes a usage error."""

    def parse(path: str) -> Any:
        try:
            return read(path)
        except OptionError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


_mpp_table = _table(mpp_table)
_label_table = _table(label_table)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows a default only where there is one worth showing."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        hidden = default is None or default is False or default == {} or default == ({}, [])
        if not hidden and default != argparse.SUPPRESS and "%(default)" not in text and "(default" not in text:
            text += " (default: %(default)s)"
        return text


def _add_build_parser(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="turn slides into mixed tissue-patch WebDataset shards",
        description="Detect tissue (Otsu), cut a patch grid at a target resolution, and write the tissue patches "
        "into WebDataset tar shards that mix slides, with a manifest and QC pictures. "
        "Exit status: 0 all slides built, 1 some slides failed (listed in the summary and the manifest), 2 bad usage.",
        formatter_class=_HelpFormatter,
    )
    p.add_argument(
        "slides",
        nargs="+",
        metavar="SLIDES",
        help="slide folders (searched recursively), slide files, or text files listing slide paths",
    )
    p.add_argument("-o", "--output", required=True, metavar="OUT", help="output folder: shards, manifest.json, qc/")
    g = p.add_argument_group("patches")
    g.add_argument("--mpp", type=_positive(float), default=0.5, metavar="UM", help="target microns per pixel")
    g.add_argument("--patch-size", type=_positive(int), default=256, metavar="PX", help="patch width = height")
    g.add_argument(
        "--stride",
        type=_positive(int),
        metavar="PX",
        help="grid step at the target mpp (default: the patch size, no overlap)",
    )
    g.add_argument(
        "--min-tissue",
        type=_fraction,
        default=0.5,
        metavar="FRAC",
        help="keep patches with at least this fraction of tissue",
    )
    g.add_argument("--max-patches-per-slide", type=_positive(int), metavar="N", help="keep a seeded random subset")
    g.add_argument("--allow-upsample", action="store_true", help="allow a target finer than the slide's level 0")
    g = p.add_argument_group("resolution")
    g.add_argument(
        "--mpp-csv",
        type=_mpp_table,
        default={},
        metavar="CSV",
        help="slide,mpp lines that override "
        "the slides' own level-0 mpp (slide = path, file name or file name without extension)",
    )
    g.add_argument(
        "--default-mpp",
        type=_positive(float),
        metavar="UM",
        help="level-0 mpp for slides that report none (without it such a slide fails with a clear reason)",
    )
    g = p.add_argument_group("tissue detection (Otsu on a low-resolution view; lengths in microns)")
    t = TissueOptions()
    g.add_argument(
        "--thumb-mpp", type=_positive(float), default=t.thumb_mpp, metavar="UM", help="resolution detection runs at"
    )
    g.add_argument(
        "--tissue-median-um", type=_non_negative, default=t.median_um, metavar="UM", help="median blur radius"
    )
    g.add_argument("--tissue-close-um", type=_non_negative, default=t.close_um, metavar="UM", help="closing radius")
    g.add_argument(
        "--min-object-um2",
        type=_non_negative,
        default=t.min_object_um2,
        metavar="UM2",
        help="drop objects this small or smaller (dust)",
    )
    g.add_argument(
        "--min-hole-um2",
        type=_non_negative,
        default=t.min_hole_um2,
        metavar="UM2",
        help="fill holes this small or smaller",
    )
    g.add_argument(
        "--no-darkness",
        action="store_true",
        help="saturation only (by default darkness against the glass counts too)",
    )
    g.add_argument(
        "--tissue-threshold",
        type=_fraction,
        metavar="T",
        help="fixed threshold (0..1) on the stain feature instead of Otsu's",
    )
    g = p.add_argument_group("output")
    g.add_argument("--format", choices=IMAGE_FORMATS, default="jpg", help="jpg (lossy) or png/webp (lossless)")
    g.add_argument("--quality", type=int, choices=range(1, 101), metavar="1..100", default=90, help="JPEG quality")
    g.add_argument(
        "--shard-size",
        type=parse_size,
        default="256MB",
        metavar="BYTES",
        help="about this many bytes per shard: 512MB, 1GiB, ...",
    )
    g.add_argument("--shard-samples", type=_positive(int), metavar="N", help="at most N samples per shard")
    g.add_argument(
        "--labels",
        type=_label_table,
        default=({}, []),
        metavar="CSV",
        help="slide,label lines written as .cls: integers, or class names numbered in sorted order",
    )
    g.add_argument(
        "--group-slides",
        type=_positive(int),
        default=32,
        metavar="N",
        help="slides mixed together in each group of shards",
    )
    g.add_argument("--no-qc", action="store_true", help="skip the qc/<slide>.png pictures")
    g = p.add_argument_group("run")
    g.add_argument("--seed", type=int, default=0, help="seeds every random choice: same inputs and seed, same shards")
    g.add_argument("--jobs", type=_positive(int), metavar="N", help="worker processes (default: all cores)")
    g.add_argument("--no-fast-path", action="store_true", help="read every slide through OpenSlide")
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a build with other slides or options in OUT "
        "(without it that is refused; the same build is resumed)",
    )
    g.add_argument(
        "--part",
        type=_part,
        metavar="I/N",
        help="build only part I of N (1-based) and write a part "
        "manifest; `wsishard merge OUT` joins the parts (default in a Slurm array job: "
        "SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT)",
    )
    g.add_argument(
        "--scratch",
        metavar="DIR",
        help="local folder for copies of slides read from object storage "
        "(one slide per worker at a time, plus one group's staged patches; default: a temporary folder)",
    )
    _add_storage_option(g)
    g.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_build)


def _part(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match.group(1)) <= int(match.group(2)):
        raise argparse.ArgumentTypeError(f"not a part I/N with 1 <= I <= N: {text!r}")
    return int(match.group(1)), int(match.group(2))


def slurm_part(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """The part of a Slurm array task (1-based), from ``SLURM_ARRAY_TASK_ID``/``_COUNT``/``_MIN``, or None."""
    try:
        task = int(environ["SLURM_ARRAY_TASK_ID"]) - int(environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        count = int(environ["SLURM_ARRAY_TASK_COUNT"])
    except (KeyError, ValueError):
        return None
    return (task + 1, count) if 0 <= task < count else None


def _storage_option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("expected key=value (the value is not shown here)")
    try:
        parsed: Any = json.loads(value)  # numbers, true/false, JSON objects
    except json.JSONDecodeError:
        parsed = value
    return key.strip(), parsed


def _add_storage_option(group: Any) -> None:
    group.add_argument(
        "--storage-option",
        type=_storage_option,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec option for s3:// and other URLs, e.g. endpoint_url=http://127.0.0.1:9000 "
        "(credentials: the standard AWS sources, or key=... secret=...); repeatable",
    )


def _options(args: argparse.Namespace) -> BuildOptions:
    tissue_kw: dict[str, Any] = {
        "thumb_mpp": args.thumb_mpp, "median_um": args.tissue_median_um, "close_um": args.tissue_close_um,
        "min_object_um2": args.min_object_um2, "min_hole_um2": args.min_hole_um2, "use_darkness": not args.no_darkness,
        "fixed_threshold": args.tissue_threshold,
    }  # fmt: skip
    labels, names = args.labels
    return BuildOptions(
        patch=PatchOptions(target_mpp=args.mpp, patch_size_px=args.patch_size, stride_px=args.stride,
                           min_tissue=args.min_tissue, max_patches_per_slide=args.max_patches_per_slide,
                           allow_upsample=args.allow_upsample),
        tissue=TissueOptions(**tissue_kw), image_format=args.format, quality=args.quality,
        shard_size_bytes=args.shard_size, shard_samples=args.shard_samples, group_slides=args.group_slides,
        seed=args.seed, jobs=args.jobs, qc=not args.no_qc, fast_path=not args.no_fast_path,
        default_mpp=args.default_mpp, mpp_overrides=args.mpp_csv, labels=labels, label_names=tuple(names),
    )  # fmt: skip


class _Bars:
    """tqdm bars for the build: slides scanned, then patches written (quiet when not a terminal)."""

    def __init__(self, quiet: bool) -> None:
        self.disable = True if quiet else None  # None: tqdm turns itself off when stderr is not a terminal
        self.scan: tqdm | None = None
        self.extract: tqdm | None = None

    def __call__(self, event: BuildProgress) -> None:
        if event.stage == "scan":
            if self.scan is None:
                self.scan = tqdm(total=event.total, desc="scan", unit="slide", disable=self.disable)
            self.scan.update(event.done - self.scan.n)
            return
        if self.extract is None:
            self.close()
            self.extract = tqdm(total=event.patches_total, desc="extract", unit="patch", disable=self.disable)
        self.extract.update(event.patches_done - self.extract.n)
        self.extract.set_postfix_str(f"{event.done}/{event.total} shards", refresh=False)

    def close(self) -> None:
        for bar in (self.scan, self.extract):
            if bar is not None:
                bar.close()


def _cmd_build(args: argparse.Namespace) -> int:
    options = _options(args)
    bars = _Bars(args.quiet)
    try:
        part = args.part or slurm_part(os.environ)
        manifest = build(args.slides, args.output, options, progress=bars, storage_options=dict(args.storage_option),
                         part=part, overwrite=args.overwrite, scratch=args.scratch)  # fmt: skip
    finally:
        bars.close()
    print(summary(manifest, args.output))
    return EXIT_FAILED_SLIDES if manifest.failed_slides else EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    manifest = merge(args.output, dict(args.storage_option))
    print(summary(manifest, args.output))
    return EXIT_FAILED_SLIDES if manifest.failed_slides else EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    bar: tqdm | None = None

    def progress(event: VerifyProgress) -> None:
        nonlocal bar
        if bar is None:
            bar = tqdm(total=event.bytes_total, desc="verify", unit="B", unit_scale=True, disable=args.quiet or None)
        bar.update(event.bytes_done - bar.n)

    try:
        report = verify(args.output, dict(args.storage_option), progress, jobs=args.jobs)
    finally:
        if bar is not None:
            bar.close()
    print(format_report(report))
    return EXIT_OK if report.ok else EXIT_FAILED_SLIDES


def _cmd_inspect(args: argparse.Namespace) -> int:
    manifest, _root = load_manifest(args.output, dict(args.storage_option))
    print(details(manifest, max_rows=args.rows))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from wsishard.testing.demo import run_demo

    bars = _Bars(args.quiet)
    try:
        return run_demo(args.output, print, n_slides=args.slides, jobs=args.jobs, progress=bars)
    finally:
        bars.close()


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="wsishard", description="Whole-slide images to mixed tissue-patch "
                                  "WebDataset shards, streamed into PyTorch with two-level DDP sharding.")  # fmt: skip
    top.add_argument("--version", action="version", version=f"wsishard {__version__}")
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_build_parser(sub)
    p = sub.add_parser("inspect", help="print a readable summary of a build output's manifest")
    p.add_argument("output", help="build output folder, manifest.json path, or URL prefix")
    p.add_argument("--rows", type=_positive(int), default=50, help="rows of the slide and shard tables")
    _add_storage_option(p)
    p.set_defaults(func=_cmd_inspect)
    p = sub.add_parser("verify", help="re-read every shard and check sizes, sha256 and sample counts")
    p.add_argument("output", help="build output folder, manifest.json path, or URL prefix")
    p.add_argument("--jobs", type=_positive(int), default=4, metavar="N", help="shards read at once")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_storage_option(p)
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser("merge", help="join the part manifests of a cluster build (build --part I/N) into one")
    p.add_argument("output", help="the build output all parts wrote to (folder or URL prefix)")
    _add_storage_option(p)
    p.set_defaults(func=_cmd_merge)
    p = sub.add_parser("demo", help="generate demo slides offline, build them into shards, stream a few batches")
    p.add_argument("-o", "--output", default="wsishard-demo", help="folder for the demo slides and shards")
    p.add_argument("--slides", type=_positive(int), default=8, help="demo slides to generate")
    p.add_argument("--jobs", type=_positive(int), default=None, help="worker processes (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logger.setLevel(logging.DEBUG if args.verbose else logging.WARNING)  # -v: wsishard's own debug lines only
    try:
        code: int = args.func(args)
    except WsiShardError as exc:
        print(f"wsishard {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # storage, credentials, disk: one line (credentials redacted), traceback with -v
        if args.verbose:
            logger.exception("wsishard %s failed", args.command)
        options = dict(getattr(args, "storage_option", []) or [])
        print(f"wsishard {args.command}: error: {redact(f'{type(exc).__name__}: {exc}', options)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("wsishard: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
