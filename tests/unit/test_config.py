"""Config files of build options: every option's key round-trips through the TOML ``inspect --options`` writes,
flags and keywords override the file, and a bad file is one line naming what is wrong."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from buildtools import usage_error
from test_cli_options import FLAGGED, _non_default

from wsishard.builder.options.buildopts import BuildOptions
from wsishard.builder.options.config import (
    build_arguments,
    config_keys,
    options_toml,
    read_config,
    tomllib,
    with_config,
)
from wsishard.builder.options.keywords import OPTION_GROUPS, option_flag, option_keyword
from wsishard.builder.run.records import options_dict
from wsishard.buildflags import build_options
from wsishard.cli import parser
from wsishard.errors import OptionError


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "build.toml"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(("dest", "f"), [(dest, f) for dest, _, f in FLAGGED], ids=[dest for dest, _, _ in FLAGGED])
def test_each_option_round_trips_through_the_toml_of_its_record(
    dest: str, f: dataclasses.Field[Any], tmp_path: Path
) -> None:
    words, _ = _non_default(f, tmp_path)
    options = build_options(parser().parse_args(["build", "S", "-o", "O", option_flag(f), *words]))
    assert options != BuildOptions()
    record = {"inputs": ["S"], **options_dict(options)}  # as the manifest records it
    text = options_toml(record)
    table = tomllib.loads(text)[dict(config_keys_by_dest())[dest]]
    assert option_keyword(f) in table  # under its keyword, in its --help group's table
    again = with_config(None, _write(tmp_path, text))
    assert options_dict(again) == options_dict(options)


def config_keys_by_dest() -> list[tuple[str, str]]:
    return [(dest, table) for table, keys in config_keys().items() for dest, _ in keys.values()]


def test_the_default_options_write_every_key_and_read_back_as_the_defaults(tmp_path: Path) -> None:
    text = options_toml(options_dict(BuildOptions()), header=["a build", "second line"])
    assert text.startswith("# a build\n# second line\n\n[patches]\nmpp = 0.5\n")
    data = tomllib.loads(text)
    assert list(data) == list(OPTION_GROUPS)  # tables in --help order
    assert sum(len(t) for t in data.values()) == len(FLAGGED)
    assert data["output"]["shard_size"] == "256MB" and data["patches"]["stride"] == "none"
    assert with_config(None, _write(tmp_path, text)) == BuildOptions()


def test_tables_of_slides_round_trip_whatever_their_names(tmp_path: Path) -> None:
    odd = ['a "quoted" slide.svs', "tab\there.svs", "ünï.svs", "del\x7f.svs", "back\\slash.svs", "[x].svs"]
    options = BuildOptions.from_keywords(
        labels={name: ("tumour" if i % 2 else "normal") for i, name in enumerate(odd)},
        mpp_csv={name: 0.25 + i / 100 for i, name in enumerate(odd)},
    )
    text = options_toml(options_dict(options))
    assert '[output.labels]\n"a \\"quoted\\" slide.svs" = "normal"' in text
    again = with_config(None, _write(tmp_path, text))
    assert again == options and again.label_names == ("normal", "tumour")


def test_a_choice_the_file_cannot_set_is_named_in_a_closing_comment(tmp_path: Path) -> None:
    options = BuildOptions().with_block_side(3)  # the build chose its blocks
    record = options_dict(dataclasses.replace(options, tissue=dataclasses.replace(options.tissue, min_threshold=0.1)))
    text = options_toml(record)
    assert "#   patch.block_patches = 8\n#   tissue.min_threshold = 0.1\n" in text
    assert "max_thumb_px" not in text  # the default: nothing to say
    assert options_toml({"seed": 4}).count("not recorded by this build") == len(FLAGGED) - 1


def test_on_off_keywords_mean_what_their_flags_say() -> None:
    # before: keep_dark_artefacts=True set dark_filter=True, removing the dark artefacts it says to keep
    options = BuildOptions.from_keywords(keep_dark_artefacts=True, tissue_saturation_only=True)
    tissue = options.tissue
    assert (tissue.dark_filter, tissue.use_darkness, tissue.keep_pigment) == (False, False, True)
    options = BuildOptions.from_keywords(dark_pigment_as_artefact=True, fast_path=False, ink_filter=False)
    assert (options.tissue.keep_pigment, options.fast_path, options.tissue.ink_filter) == (False, False, False)
    assert BuildOptions.from_keywords(keep_dark_artefacts=False) == BuildOptions()


def test_flags_override_the_file_and_keep_its_other_options(tmp_path: Path) -> None:
    text = '[patches]\nmpp = 1\npatch_size = 128\n\n[run]\nseed = 5\n\n[output]\nshard_size = "1GiB"\n'
    config = _write(tmp_path, text)
    args = parser().parse_args(["build", "S", "-o", "O", "--config", str(config), "--seed", "7", "--mpp", "0.5"])
    options = build_options(args)
    assert (options.patch.target_mpp, options.patch.patch_size_px) == (0.5, 128)
    assert (options.seed, options.shard_size_bytes) == (7, 2**30)
    assert build_options(parser().parse_args(["build", "S", "-o", "O", "--config", str(config)])).seed == 5
    assert isinstance(read_config(config)["mpp"], float)  # an integer where a number is wanted: that number


def test_keywords_override_the_file_which_overrides_the_options_object(tmp_path: Path) -> None:
    config = _write(tmp_path, "[run]\nseed = 5\njobs = 2\n\n[patches]\nstride = 64\n")
    base = BuildOptions.from_keywords(seed=1, quality=70, stride=32)
    sources, out, options = build_arguments(tmp_path / "s.svs", tmp_path / "o", base, {"jobs": 3}, config)
    assert (sources, out) == ([str(tmp_path / "s.svs")], str(tmp_path / "o"))
    assert (options.seed, options.jobs, options.quality, options.patch.stride_px) == (5, 3, 70, 64)
    unset = _write(tmp_path, '[patches]\nstride = "none"\n')
    assert build_arguments("s", "o", base, {}, unset)[2].patch.stride_px is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[patches]\npatch_sise = 192\n", "unknown key 'patch_sise' in [patches]; did you mean 'patch_size'?"),
        ("[patches]\ntarget_mpp = 1.0\n", "unknown key 'target_mpp' in [patches]; did you mean 'mpp'?"),
        ("[patches]\nsed = 1\n", "unknown key 'sed' in [patches]; did you mean 'seed' in [run]?"),
        ("[patches]\nzzz = 1\n", "unknown key 'zzz' in [patches] (wsishard build --help lists the options)"),
        ("[output]\nmpp = 1.0\n", "key 'mpp' belongs in table [patches], not [output]"),
        ("mpp = 1.0\n", "key 'mpp' belongs in table [patches]"),
        ("[patchs]\nmpp = 1.0\n", "unknown table 'patchs'; did you mean [patches]?"),
        ('["a\\nb"]\nmpp = 1.0\n', "unknown table 'a\\nb' (tables: patches, resolution, tissue, artefacts, roi, "),
        (
            f"[run]\nseed = [{', '.join(['1'] * 100)}]\n",
            "[run] seed = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,...: need an integer",
        ),
        ('[patches]\nmpp = "fine"\n', "[patches] mpp = 'fine': need a number"),
        ("[patches]\nstride = 1.5\n", '[patches] stride = 1.5: need an integer or "none"'),
        ('[patches]\nmin_tissue = "none"\n', "[patches] min_tissue = 'none': need a number"),
        ("[run]\nfast_path = 1\n", "[run] fast_path = 1: need true or false"),
        (
            '[resolution.mpp_csv]\n"a.svs" = true\n',
            "[resolution] mpp_csv = {'a.svs': True}: need a CSV path or a table",
        ),
        ('[output.labels]\n"a.svs" = 1.5\n', "[output] labels = {'a.svs': 1.5}: need a CSV path or a table of slide"),
        ("[patches]\nmpp = -1\n", "invalid target_mpp: -1.0 (need a finite UM > 0) (key 'mpp' in [patches])"),
        ('[output]\nformat = "gif"\n', "invalid image_format: 'gif' (need jpg/png/webp) (key 'format' in [output])"),
        ("[output]\nquality = 0\n", "invalid quality: 0 (need 1..100)"),
        ("[patches\nmpp = 1\n", "not a TOML file: Expected ']' at the end of a table declaration (at line 1"),
    ],
)
def test_a_bad_file_is_one_line_naming_the_file_and_what_is_wrong(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = _write(tmp_path, text)
    with pytest.raises(OptionError) as info:
        with_config(None, config)
    assert str(info.value).startswith(f"config {config}: ") and message in str(info.value)
    err = usage_error(capsys, "S", "-o", str(tmp_path / "out"), "--config", str(config))
    assert err == f"wsishard build: error: {info.value}"
    assert not (tmp_path / "out").exists()  # refused before anything is written


def test_a_file_that_is_not_utf8_text_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "build.toml"
    config.write_bytes(b"[run]\nseed = 1 # \xff\n")
    err = usage_error(capsys, "S", "-o", str(tmp_path / "out"), "--config", str(config))
    assert err == f"wsishard build: error: config {config}: not a TOML file: not UTF-8 text"


def test_inspect_options_is_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from wsishard.cli import main

    for extra in (["--qc"], ["--html", str(tmp_path / "qc.html")]):
        assert main(["inspect", str(tmp_path), "--options", *extra]) == 2
        err = capsys.readouterr().err
        assert (
            err
            == "wsishard inspect: error: inspect --options prints the build's options alone: not with --qc or --html\n"
        )


def test_a_missing_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, "S", "-o", str(tmp_path / "out"), "--config", str(tmp_path / "none.toml"))
    assert err == f"wsishard build: error: config {tmp_path / 'none.toml'}: cannot read it: No such file or directory"
