"""``wsishard build`` flags derived from the option dataclasses' fields: round trips, defaults, help text."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import re
from pathlib import Path
from typing import Any, cast

import pytest

import wsishard.builder
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.keywords import option_fields, option_flag
from wsishard.builder.scan.grid import PatchOptions
from wsishard.builder.scan.tissue import TissueOptions
from wsishard.buildflags import add_option, build_options
from wsishard.cli import parser
from wsishard.cliargs import format_size, parse_size

FLAGGED = list(option_fields(BuildOptions))


def _non_default(f: dataclasses.Field[Any], tmp_path: Path) -> tuple[list[str], dict[str, Any]]:
    """Command-line words giving ``f`` a value other than its default, and the field values they should give."""
    meta, default = f.metadata, cast(Any, f.default)  # MISSING for the tables, whose defaults come from a factory
    if isinstance(default, bool):
        return [], {f.name: not default}
    if "choices" in meta:
        value = next(c for c in meta["choices"] if c != default)
        return [str(value)], {f.name: value}
    kind = meta["parse"]
    if kind in ("int", "positive_int", "non_negative_int"):
        value = 64 if default is None else default + 1
    elif kind in ("positive_float", "non_negative"):
        value = 0.25 if not default else default * 2
    elif kind == "fraction":
        value = 0.25 if default != 0.25 else 0.75
    elif kind == "degrees":
        value = (default + 90.0) % 360.0
    elif kind == "str":
        (tmp_path / "roi").mkdir(exist_ok=True)
        return [str(tmp_path / "roi")], {f.name: str(tmp_path / "roi")}
    elif kind == "names":
        return ["Tumor, Stroma"], {f.name: ("Tumor", "Stroma")}
    elif kind == "size":
        return ["512MB"], {f.name: 512_000_000}
    elif kind == "mpps":  # given in any order, kept ascending
        return ["8.0,2.0"], {f.name: (2.0, 8.0)}
    elif kind == "mpp_table":
        (tmp_path / "mpp.csv").write_text("slide,mpp\na.svs,0.25\n")
        return [str(tmp_path / "mpp.csv")], {f.name: {"a.svs": 0.25}}
    elif kind == "label_table":
        (tmp_path / "labels.csv").write_text("slide,label\na.svs,tumour\nb.svs,normal\n")
        return [str(tmp_path / "labels.csv")], {"labels": {"a.svs": 1, "b.svs": 0}, "label_names": ("normal", "tumour")}
    else:
        raise AssertionError(f"no non-default value for parse kind {kind!r}: extend this test")
    return [str(value)], {f.name: value}


def _build_help(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> str:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping, so a help text reads in one piece
    with pytest.raises(SystemExit):
        parser().parse_args(["build", "--help"])
    return capsys.readouterr().out


def test_flags_cover_the_option_fields_the_cli_had() -> None:
    flags = {option_flag(f) for _, _, f in FLAGGED}
    assert {
        "--mpp",
        "--patch-size",
        "--stride",
        "--min-tissue",
        "--max-patches-per-slide",
        "--allow-upsample",
        "--mpp-tolerance",
    } <= flags
    assert {
        "--thumb-mpp",
        "--tissue-median-um",
        "--tissue-close-um",
        "--min-object-um2",
        "--min-hole-um2",
        "--tissue-saturation-only",
        "--tissue-threshold",
    } <= flags
    assert {
        "--format",
        "--quality",
        "--shard-size",
        "--shard-samples",
        "--group-slides",
        "--seed",
        "--jobs",
        "--qc",
        "--no-fast-path",
        "--default-mpp",
        "--mpp-csv",
        "--labels",
        "--require-labels",
    } <= flags
    assert len(flags) == len(FLAGGED)  # no two fields share a flag
    unflagged = {"block_patches", "max_thumb_px", "min_threshold", "label_names"}
    assert unflagged.isdisjoint(f.name for _, _, f in FLAGGED)


@pytest.mark.parametrize(("dest", "f"), [(dest, f) for dest, _, f in FLAGGED], ids=[dest for dest, _, _ in FLAGGED])
def test_each_flag_round_trips_to_its_field(dest: str, f: dataclasses.Field[Any], tmp_path: Path) -> None:
    words, expected = _non_default(f, tmp_path)
    options = build_options(parser().parse_args(["build", "SLIDES", "-o", "OUT", option_flag(f), *words]))
    owner = functools.reduce(getattr, dest.split(".")[:-1], options)  # BuildOptions, .patch or .tissue
    for name, value in expected.items():
        assert getattr(owner, name) == value != getattr(type(owner)(), name)
    want: Any = dataclasses.replace(type(owner)(), **expected)  # and every other field keeps its default
    if "." in dest:
        want = dataclasses.replace(BuildOptions(), **{dest.split(".")[0]: want})
    assert options == want


def test_no_flags_gives_the_dataclass_defaults() -> None:
    options = build_options(parser().parse_args(["build", "SLIDES", "-o", "OUT"]))
    assert options == BuildOptions()
    assert options.patch == PatchOptions() and options.tissue == TissueOptions()
    assert (options.jobs, options.labels, options.label_names, options.mpp_overrides) == (None, {}, (), {})


def test_flags_change_only_their_own_field() -> None:
    args = parser().parse_args(
        ["build", "S", "-o", "O", "--mpp", "1", "--tissue-saturation-only", "--no-qc", "--seed", "7"]
    )
    expected = dataclasses.replace(
        BuildOptions(), patch=PatchOptions(target_mpp=1.0), tissue=TissueOptions(use_darkness=False), qc=False, seed=7
    )
    assert build_options(args) == expected


def test_qc_draws_pictures_while_building_and_no_qc_is_still_accepted() -> None:
    build = ["build", "S", "-o", "O"]
    assert build_options(parser().parse_args([*build, "--qc"])) == dataclasses.replace(BuildOptions(), qc=True)
    assert build_options(parser().parse_args([*build, "--no-qc"])) == BuildOptions()  # the default since issue 33
    assert BuildOptions().qc is False


@pytest.mark.parametrize(("dest", "f"), [(dest, f) for dest, _, f in FLAGGED], ids=[dest for dest, _, _ in FLAGGED])
def test_help_text_comes_from_the_field_metadata(
    dest: str, f: dataclasses.Field[Any], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _build_help(monkeypatch, capsys)
    # an entry: the line starting with the flag, plus the next line when a long invocation pushes the help there
    entries = re.findall(rf"^  {re.escape(option_flag(f))}(?![-\w]).*(?:\n {{20,}}\S.*)?$", text, re.M)
    assert len(entries) == 1, entries
    entry, help_text, default = " ".join(entries[0].split()), f.metadata["help"], f.default
    if default in (None, dataclasses.MISSING, ()) or isinstance(default, bool) or "(default" in help_text:
        assert entry.endswith(f" {help_text}")  # an empty list of names is no default worth showing
        assert "(default: ())" not in entry
    else:
        shown = format_size(default) if f.metadata.get("parse") == "size" else str(default)
        assert entry.endswith(f" {help_text} (default: {shown})")


def test_help_groups_and_shown_defaults(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    text = _build_help(monkeypatch, capsys)
    titles = [
        "patches:",
        "resolution:",
        "tissue detection (Otsu on a low-resolution view; lengths in microns):",
        "output:",
        "run:",
    ]
    assert [text.index(f"\n{t}\n") for t in titles] == sorted(text.index(f"\n{t}\n") for t in titles)
    assert re.search(r"--mpp UM \[UM \.\.\.\] +target microns per pixel; several .* \(default: 0\.5\)\n", text)
    assert re.search(r"--shard-size BYTES +about this many bytes per shard: .* \(default: 256MB\)\n", text)
    assert re.search(r"--format \{jpg,png,webp\}\s+jpg \(lossy\)", text)
    assert re.search(r"--quality 1\.\.100 +JPEG quality \(default: 90\)\n", text)
    assert "--seed SEED" in text and re.search(r"--tissue-saturation-only\s", text) and "(default: True)" not in text
    assert parse_size(format_size(BuildOptions().shard_size_bytes or 0)) == BuildOptions().shard_size_bytes


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--patch-size", "4", "invalid patch_size_px: 4 (need 8..8192)"),  # the CLI took 4, PatchOptions did not
        ("--tissue-threshold", "1", "invalid fixed_threshold: 1.0 (need 0 <= T < 1)"),  # 0..1 vs [0, 1)
        ("--quality", "0", "invalid quality: 0 (need 1..100)"),  # was 'invalid choice: 0 (choose from 1, 2, ... 100)'
        ("--seed", "-1", "must be >= 0: '-1'"),  # every slide then failed
        ("--seed", "x", "not an integer: 'x'"),  # was 'invalid int value'
        ("--shard-samples", "0", "must be > 0: '0'"),  # smaller blocks then (BuildOptions.with_block_side)
    ],
)
def test_a_flag_refuses_what_its_option_class_refuses(
    flag: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["build", "SLIDES", "-o", "OUT", flag, value])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"wsishard build: error: argument {flag}: {message}\n"  # one line, no usage


def test_a_new_field_gets_its_flag_from_its_declaration() -> None:
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Extra:
        blur_sigma_um: float = dataclasses.field(
            default=1.5, metadata={"metavar": "UM", "parse": "non_negative", "help": "blur before detection"}
        )
        keep_edges: bool = dataclasses.field(default=True, metadata={"help": "drop patches at the slide edge"})

    p = argparse.ArgumentParser(prog="x")
    for f in dataclasses.fields(Extra):
        add_option(p, f.name, f)
    text = " ".join(p.format_help().split())
    assert "--blur-sigma-um UM blur before detection (default: 1.5)" in text
    assert "--no-keep-edges drop patches at the slide edge" in text
    given = vars(p.parse_args(["--blur-sigma-um", "3", "--no-keep-edges"]))
    assert given == {"blur_sigma_um": 3.0, "keep_edges": False}
    assert vars(p.parse_args([])) == {}  # absent flags leave the dataclass default in charge
    with pytest.raises(SystemExit):
        p.parse_args(["--blur-sigma-um", "-1"])


def test_the_library_side_does_not_know_argparse() -> None:
    builder = Path(wsishard.builder.__file__).parent
    forbidden = re.compile(r"^\s*(import argparse|from argparse|from wsishard\.cli|import wsishard\.cli)", re.M)
    paths = sorted(builder.rglob("*.py"))  # every stage's modules (builder/ has subpackages)
    assert len(paths) > 30
    for path in paths:
        assert not forbidden.search(path.read_text()), path


def test_parts_is_part_count_and_the_old_spelling_still_works_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from wsishard import cli

    seen: list[Any] = []
    monkeypatch.setattr(cli, "build", lambda *a, **kw: seen.append(kw["part"]) or (_ for _ in ()).throw(SystemExit))
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    for flag in ("--part-count", "--parts"):
        with pytest.raises(SystemExit):
            cli.main(["build", "in", "-o", "out", flag, "3", "-q"])
    assert seen == [(2, 3), (2, 3)]
    assert capsys.readouterr().err.count("--parts is deprecated, use --part-count") == 1
    assert "--part-count N" in _build_help(monkeypatch, capsys) and "--parts " not in _build_help(monkeypatch, capsys)


@pytest.mark.parametrize(("dest", "f"), [(dest, f) for dest, _, f in FLAGGED], ids=[dest for dest, _, _ in FLAGGED])
def test_each_flag_is_a_keyword_of_the_python_api_giving_the_same_options(
    dest: str, f: dataclasses.Field[Any], tmp_path: Path
) -> None:
    from wsishard.builder.options.keywords import option_keyword

    words, expected = _non_default(f, tmp_path)
    from_cli = build_options(parser().parse_args(["build", "SLIDES", "-o", "OUT", option_flag(f), *words]))
    flag = option_flag(f)
    keyword = option_keyword(f)
    assert keyword == flag[2:].removeprefix("no-" if f.default is True else "").replace("-", "_")
    if isinstance(f.default, bool):  # True: the flag given (--keep-dark-artefacts); --no-fast-path: fast_path=False
        value: Any = not f.default if flag.startswith("--no-") else True
    elif f.metadata.get("fills") or f.metadata.get("parse") in ("mpp_table", "size", "names", "str"):
        value = words[0]  # a path or a text, read as the flag reads it
    else:
        value = next(iter(expected.values()))
    assert BuildOptions.from_keywords(**{keyword: value}) == from_cli


def test_keywords_take_python_values_for_tables_sizes_and_names() -> None:
    options = BuildOptions.from_keywords(
        mpp=1.0,
        patch_size=224,
        shard_size="1GiB",
        roi_exclude=["Tumor", "Stroma"],
        labels={"a.svs": "tumour", "b.svs": "normal"},
        mpp_csv={"a.svs": 0.25},
        qc=False,
        jobs=3,
    )
    assert (options.patch.target_mpp, options.patch.patch_size_px, options.shard_size_bytes) == (1.0, 224, 2**30)
    assert options.roi.exclude == ("Tumor", "Stroma") and options.mpp_overrides == {"a.svs": 0.25}
    assert options.labels == {"a.svs": 1, "b.svs": 0} and options.label_names == ("normal", "tumour")
    assert (options.qc, options.jobs) == (False, 3)
    base = BuildOptions.from_keywords(seed=5)
    from wsishard.builder.options.keywords import with_keywords

    assert with_keywords(base, {"mpp": 1.0}) == BuildOptions.from_keywords(seed=5, mpp=1.0)  # on top of options


def test_an_unknown_keyword_is_a_type_error_naming_it_and_the_close_matches() -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'patchsize'; did you mean 'patch_size'"):
        BuildOptions.from_keywords(patchsize=224)
    with pytest.raises(TypeError, match=r"'target_mpp'; did you mean 'mpp'\?"):  # a field name: its keyword
        BuildOptions.from_keywords(target_mpp=1.0)
    with pytest.raises(TypeError, match=r"'zzz' \(see wsishard.build's keywords\)"):
        BuildOptions.from_keywords(zzz=1)


def test_a_keyword_value_the_option_refuses_is_an_option_error() -> None:
    from wsishard.errors import OptionError

    with pytest.raises(OptionError, match="quality"):
        BuildOptions.from_keywords(quality=0)
    with pytest.raises(OptionError, match="not a size"):
        BuildOptions.from_keywords(shard_size="lots")


# the five "dark" flags a new user found overlapping (issue 29), each renamed to say what it does; the old
# spellings still work with a one-line warning
RENAMED = [
    ("--no-darkness", "--tissue-saturation-only", [], ("tissue", "use_darkness", False)),
    ("--no-dark-filter", "--keep-dark-artefacts", [], ("tissue", "dark_filter", False)),
    ("--dark-max-value", "--dark-threshold", ["0.2"], ("tissue", "dark_max_value", 0.2)),
    ("--max-dark", "--max-dark-pixels", ["0.3"], ("patch_quality", "max_dark", 0.3)),
    ("--max-artefact", "--max-artefact-fraction", ["1"], ("patch", "max_artefact", 1.0)),
]


@pytest.mark.parametrize(("old", "new", "words", "want"), RENAMED, ids=[r[0] for r in RENAMED])
def test_old_dark_flags_still_work_with_a_one_line_warning(
    old: str, new: str, words: list[str], want: tuple[str, str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    group, name, value = want
    via_new = build_options(parser().parse_args(["build", "S", "-o", "O", new, *words]))
    assert capsys.readouterr().err == ""
    via_old = build_options(parser().parse_args(["build", "S", "-o", "O", old, *words]))
    assert getattr(getattr(via_old, group), name) == value != getattr(getattr(BuildOptions(), group), name)
    assert via_old == via_new
    assert capsys.readouterr().err == f"wsishard build: warning: {old} is deprecated, use {new}\n"


def test_old_dark_flags_refuse_bad_values_as_the_new_ones_do(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        parser().parse_args(["build", "S", "-o", "O", "--dark-max-value", "7"])
    assert info.value.code == 2 and "must be between 0 and 1" in capsys.readouterr().err


def test_dark_flags_are_grouped_with_help_and_old_spellings_hidden(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    text = _build_help(monkeypatch, capsys)
    section = text[text.index("\nink, dark artefacts and pigment") :]
    section = section[: section.index("\n\n")]
    for flag in ("--keep-dark-artefacts", "--dark-pigment-as-artefact", "--dark-threshold", "--max-artefact-fraction"):
        entry = re.search(rf"^  {flag}(?![-\w]).*(?:\n {{20,}}\S.*)?$", section, re.M)  # the flag and its help
        assert entry is not None and len(entry.group(0).split()) > 4, flag
    for old, *_ in RENAMED:
        assert not re.search(rf"{old}(?![-\w])", text), old
