"""The ``wsishard`` command: argparse over the library. Logging and progress bars are set up here only."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from wsishard import __version__, cliargs
from wsishard.builder.inputs.sources import check_output
from wsishard.builder.options.buildopts import BuildProgress
from wsishard.builder.options.config import options_toml
from wsishard.builder.plan.parts import array_part
from wsishard.buildflags import add_build_flags, add_storage_option, build_options
from wsishard.embedding.flags import add_embed_parser
from wsishard.errors import OptionError, WsiShardError
from wsishard.storage.secrets import redact
from wsishard.storage.urls import public_location

if TYPE_CHECKING:  # the commands' own modules are imported when one runs: ``--help`` starts without them
    from tqdm import tqdm

    from wsishard.manifest import Manifest
    from wsishard.shards.verify import VerifyProgress

logger = logging.getLogger("wsishard")

# 0 done; 1 some slides failed (or verify found damage); 2 bad usage or input: an error wsishard names (WsiShardError,
# argparse); 3 an error it does not name (storage, credentials, permissions, or a bug); 130 interrupted
EXIT_OK, EXIT_FAILED_SLIDES, EXIT_USAGE, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def _add_build_parser(sub: Any) -> None:
    p = sub.add_parser(
        "build",
        help="turn slides into mixed tissue-patch WebDataset shards",
        description="Detect tissue (Otsu), cut a patch grid at a target resolution, and write the "
        "tissue patches into WebDataset tar shards that mix slides, with a manifest and QC pictures. "
        "Exit status: 0 all slides built, 1 some slides failed (listed in the summary and the "
        "manifest), 2 bad usage or input, 3 another error (storage, permissions; -v shows its "
        "traceback).",
    )
    add_build_flags(p)
    p.set_defaults(func=_cmd_build)


class _Bars:
    """tqdm bars for the build: slides scanned, then patches written (quiet when not a terminal)."""

    def __init__(self, quiet: bool) -> None:
        self.disable = True if quiet else None  # None: tqdm turns itself off when stderr is not a terminal
        self.scan: tqdm | None = None
        self.extract: tqdm | None = None

    def __call__(self, event: BuildProgress) -> None:
        from tqdm import tqdm

        if event.stage == "scan":
            if self.scan is None:
                self.scan = tqdm(total=event.total, desc="scan", unit="slide", disable=self.disable)
            self.scan.update(event.done - self.scan.n)
            return
        if self.extract is None:
            self.close()
            self.extract = tqdm(total=event.patches_total, desc="extract", unit="patch", disable=self.disable)
        self.extract.total = event.patches_total  # grows as groups are planned, one after another
        self.extract.update(event.patches_done - self.extract.n)
        self.extract.set_postfix_str(f"{event.done}/{event.total} shards", refresh=False)

    def close(self) -> None:
        for bar in (self.scan, self.extract):
            if bar is not None:
                bar.close()


def build(*args: Any, **kwargs: Any) -> Manifest:
    """:func:`wsishard.builder.run.orchestrate.build`, imported when a build runs (the CLI starts without the
    builder)."""
    from wsishard.builder.run.orchestrate import build as run_build

    return run_build(*args, **kwargs)


def _cmd_build(args: argparse.Namespace) -> int:
    from wsishard.report import summary

    options = build_options(args)
    check_output(args.output)
    bars = _Bars(args.quiet)
    try:
        part = args.part or array_part(os.environ, args.part_count)
        manifest = build(
            args.slides,
            args.output,
            options,
            progress=bars,
            storage_options=dict(args.storage_option),
            part=part,
            overwrite=args.overwrite,
            scratch=args.scratch,
        )
    finally:
        bars.close()
    print(summary(manifest, args.output))
    return EXIT_FAILED_SLIDES if manifest.failed_slides else EXIT_OK


def _cmd_merge(args: argparse.Namespace) -> int:
    from wsishard.builder.run.merge import merge
    from wsishard.report import summary

    manifest = merge(args.output, dict(args.storage_option))
    print(summary(manifest, args.output))
    return EXIT_FAILED_SLIDES if manifest.failed_slides else EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from wsishard.shards.verify import format_report, verify

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
    from wsishard.qc_html import check_page_target, write_qc_page
    from wsishard.report import details, plural
    from wsishard.storage.opener import load_manifest

    if args.options and (args.qc or args.html is not None):
        raise OptionError("inspect --options prints the build's options alone: not with --qc or --html")
    manifest, root = load_manifest(args.output, dict(args.storage_option))
    if args.options:
        built = f"wsishard {manifest.wsishard_version}, {manifest.created}" if manifest.created else "wsishard"
        where = public_location(args.output)  # no credentials or signatures in the file
        header = [f"the options of the build in {where} ({built})", "wsishard build SLIDES -o OUT --config FILE"]
        print(options_toml(manifest.options, header), end="")
        return EXIT_OK
    if args.html is not None:
        check_page_target(root, args.html)  # before anything is drawn
    if args.qc:
        from wsishard.builder.qc.qcdraw import draw_pictures

        print(draw_pictures(manifest, root, dict(args.storage_option), jobs=args.jobs).line())
    if args.html is not None:
        write_qc_page(manifest, root, args.html)
        hint = "" if args.qc else "; pictures missing from OUT/qc/ are drawn by inspect --qc"
        print(f"{args.html}: {plural(len(manifest.slides), 'slide')}, failed first{hint}")
    elif not args.qc:
        from wsishard.shards.summary import label_totals, mpp_totals

        counts = label_totals(root, dict(args.storage_option))
        multi = isinstance(manifest.options.get("patch", {}).get("target_mpp"), list)  # a multi-mpp build's
        mpps = mpp_totals(root, [s.name for s in manifest.shards], dict(args.storage_option)) if multi else None
        print(details(manifest, max_rows=args.rows, label_counts=counts, mpp_counts=mpps))
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from wsishard.demo import run_demo  # here: the demo pulls in torch; the other commands do not

    bars = _Bars(args.quiet)
    try:
        return run_demo(args.output, print, n_slides=args.slides, jobs=args.jobs, progress=bars)
    finally:
        bars.close()


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line (``wsishard build: error: ...``), without the usage
    block (``--help`` shows that); its subcommand parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def parser() -> argparse.ArgumentParser:
    top = _Parser(
        prog="wsishard",
        description="Whole-slide images to mixed tissue-patch WebDataset shards, "
        "streamed into PyTorch with two-level DDP sharding.",
    )
    top.add_argument("--version", action="version", version=f"wsishard {__version__}")
    top.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_build_parser(sub)
    _add_inspect_parser(sub)
    add_embed_parser(sub)
    p = sub.add_parser(
        "verify",
        help="re-read every shard and check sizes, sha256 and sample counts",
        description="Re-read every shard of a build and check it against the manifest: size, sha256, sample "
        "count, and each sample's members (image size and format, .json, .cls). Exit 0 when all match, 1 when not.",
    )
    p.add_argument("output", help="build output folder, manifest.json path, or URL prefix")
    p.add_argument("--jobs", type=cliargs.positive(int), default=4, metavar="N", help="shards read at once")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    add_storage_option(p)
    p.set_defaults(func=_cmd_verify)
    p = sub.add_parser(
        "merge",
        help="join the part manifests of a cluster build (build --part I/N) into one",
        description="Join the part manifests of a cluster build (build --part I/N, every part finished) into one "
        "manifest, slide records file and index summary, as a one-machine build of the same slides writes.",
    )
    p.add_argument("output", help="the build output all parts wrote to (folder or URL prefix)")
    add_storage_option(p)
    p.set_defaults(func=_cmd_merge)
    p = sub.add_parser(
        "demo",
        help="generate demo slides offline, build them into shards, stream a few batches",
        description="Generate synthetic slides (offline, no download), build them into shards with QC pictures, "
        "then stream a few batches through the loader and GPU-side collate (on the CPU without a GPU).",
    )
    p.add_argument("-o", "--output", default="wsishard-demo", help="folder for the demo slides and shards")
    p.add_argument("--slides", type=cliargs.positive(int), default=8, help="demo slides to generate")
    p.add_argument("--jobs", type=cliargs.positive(int), default=None, help="worker processes (default: all cores)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=_cmd_demo)
    return top


def _add_inspect_parser(sub: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="print a readable summary of a build output's manifest",
        description="Print a build's options, labels (with patches per label), a table of its slides and one of "
        "its shards, from its manifest; or draw its QC pictures (--qc) and review page (--html).",
    )
    p.add_argument("output", help="build output folder, manifest.json path, or URL prefix")
    p.add_argument("--rows", type=cliargs.positive(int), default=50, help="rows of the slide and shard tables")
    p.add_argument(
        "--html",
        metavar="FILE",
        help="write a page of every slide's QC picture and numbers, failed "
        "slides first (--qc writes one as OUT/qc/index.html)",
    )
    p.add_argument(
        "--qc",
        action="store_true",
        help="draw the QC pictures missing from OUT/qc/ (from what the build "
        "recorded; the slides are read again where they can be) and write OUT/qc/index.html",
    )
    p.add_argument(
        "--jobs",
        type=cliargs.positive(int),
        default=None,
        metavar="N",
        help="with --qc: pictures drawn at once (default: all cores)",
    )
    p.add_argument(
        "--options",
        action="store_true",
        help="print the build's options as a TOML config file (alone): wsishard build SLIDES -o NEW "
        "--config FILE repeats the build",
    )
    add_storage_option(p)
    p.set_defaults(func=_cmd_inspect)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logger.setLevel(logging.DEBUG if args.verbose else logging.WARNING)  # -v: wsishard's own debug lines only
    try:
        code: int = args.func(args)
    except WsiShardError as exc:
        print(f"wsishard {args.command}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # storage, credentials, disk, a bug: one line (credentials redacted), traceback with -v
        options = dict(getattr(args, "storage_option", []) or [])
        if args.verbose:
            logger.error("wsishard %s failed:\n%s", args.command, redact(traceback.format_exc(), options).rstrip())
        hint = "" if args.verbose else " (run with -v for the traceback)"
        text = redact(f"{type(exc).__name__}: {exc}", options)
        print(f"wsishard {args.command}: error: {text}{hint}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("wsishard: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
