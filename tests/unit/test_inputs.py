"""The build's inputs (:mod:`wsishard.builder.inputs.sources`): slides from folders and list files, per-slide tables.

Slide files here are empty: finding slides never opens them.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pytest

from wsishard.builder.inputs.sources import (
    check_output,
    check_tables,
    find_slides,
    label_table,
    lookup,
    mpp_table,
    read_table,
)
from wsishard.builder.options.buildopts import BuildOptions
from wsishard.errors import OptionError


def _touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/{b.svs, A.TIF, notes.txt, .c.svs, sub/{d.ndpi, deeper/e.tiff}, .hidden/f.svs, z-empty/}"""
    root = tmp_path / "root"
    _touch(
        root / "b.svs",
        root / "A.TIF",
        root / "notes.txt",
        root / ".c.svs",
        root / "sub" / "d.ndpi",
        root / "sub" / "deeper" / "e.tiff",
        root / ".hidden" / "f.svs",
    )
    (root / "z-empty").mkdir()
    return root


def test_folders_are_searched_recursively_sorted_without_hidden_files_or_folders(tree: Path) -> None:
    found = find_slides([str(tree)])
    expected = [tree / "A.TIF", tree / "b.svs", tree / "sub" / "d.ndpi", tree / "sub" / "deeper" / "e.tiff"]
    assert found == sorted(str(p) for p in expected)  # upper-case suffixes count; .txt, .c.svs, .hidden/ do not


def test_the_same_slide_given_several_ways_is_listed_once(tree: Path) -> None:
    found = find_slides([str(tree / "sub"), str(tree), f"{tree}/./b.svs", str(tree / "sub" / ".." / "b.svs")])
    assert found == find_slides([str(tree)])
    assert len(found) == len(set(found)) == 4


def test_a_slide_file_is_taken_as_given_even_with_another_suffix(tree: Path) -> None:
    assert find_slides([str(tree / "b.svs")]) == [str(tree / "b.svs")]
    assert find_slides([str(tree / ".c.svs")]) == [str(tree / ".c.svs")]  # named explicitly: not skipped


def test_list_files_skip_comments_and_blank_lines_and_resolve_relative_paths(tree: Path, tmp_path: Path) -> None:
    listing = tree / "sub" / "slides.txt"
    listing.write_text(
        "# training slides\n"
        "\n"
        "deeper/e.tiff\n"  # relative to the list file's folder, not to the working directory
        f"  {tree / 'b.svs'}  \n"  # absolute, with spaces around
        "../A.TIF,3\n"  # a CSV-like line: only the first column is the path
        "#../not-this.svs\n"
    )
    assert find_slides([str(listing)]) == sorted(
        [str(tree / "sub" / "deeper" / "e.tiff"), str(tree / "b.svs"), str(tree / "A.TIF")]
    )
    csv_listing = tmp_path / "slides.csv"
    csv_listing.write_text("root/b.svs,tumour\n")
    assert find_slides([str(csv_listing), str(listing)]) == find_slides([str(listing)])  # merged, deduplicated


def test_a_missing_input_is_an_option_error_naming_it(tree: Path) -> None:
    with pytest.raises(OptionError, match=r"no such file or folder: .*/nope$"):
        find_slides([str(tree), str(tree / "nope")])


def test_nothing_found_is_an_option_error(tree: Path, tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"no slide files .*z-empty"):
        find_slides([str(tree / "z-empty")])
    only_comments = tmp_path / "empty.txt"
    only_comments.write_text("# nothing yet\n\n")
    with pytest.raises(OptionError, match="no slide files"):
        find_slides([str(only_comments)])


def test_lookup_by_path_file_name_or_stem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = {"/data/a/x.svs": 1, "x.svs": 2, "x": 3, "y": 4, "v1.2": 5, os.path.join(str(tmp_path), "r.svs"): 6}
    assert lookup(table, "/data/a/x.svs") == 1  # the exact path first
    assert lookup(table, "/data/b/x.svs") == 2  # then the file name
    assert lookup({"x": 3}, "/data/b/x.svs") == 3  # then the stem
    assert lookup(table, "/anywhere/y.tif") == 4
    assert lookup(table, "/d/v1.2.svs") == 5  # the stem drops only the last suffix
    monkeypatch.chdir(tmp_path)
    assert lookup(table, "r.svs") == 6  # a relative path matches its absolute form
    assert lookup(table, "/data/a/z.svs") is None


def test_read_table_keeps_header_lines_and_strips_cells(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("slide,value\n# a comment\n\n a.svs , 1 \nb,two, \n")  # an empty third cell: no column
    assert read_table(str(path), "--labels") == {"slide": "value", "a.svs": "1", "b": "two"}


def test_read_table_errors_name_the_option_and_file(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"cannot read --labels .*missing\.csv"):
        read_table(str(tmp_path / "missing.csv"), "--labels")
    path = tmp_path / "short.csv"
    path.write_text("a.svs,1\nb.svs\n")
    with pytest.raises(OptionError, match=r"--mpp-csv .*short\.csv: every line needs two columns"):
        read_table(str(path), "--mpp-csv")


def test_mpp_table_skips_a_header_and_reads_numbers(tmp_path: Path) -> None:
    path = tmp_path / "mpp.csv"
    path.write_text("slide,mpp\na.svs,0.25\nb,0.5\n")
    assert mpp_table(str(path)) == {"a.svs": 0.25, "b": 0.5}
    path.write_text("a.svs,0.25\nb,1e-1\n")  # no header
    assert mpp_table(str(path)) == {"a.svs": 0.25, "b": 0.1}


def test_a_bad_mpp_is_an_option_error_naming_the_slide(tmp_path: Path) -> None:
    path = tmp_path / "mpp.csv"
    path.write_text("slide,mpp\na.svs,0.25\nb.svs,fast\n")
    with pytest.raises(OptionError, match=r"mpp of 'b\.svs' is not a number"):
        mpp_table(str(path))
    path.write_text("a.svs,0.25\nslide,mpp\n")  # only the first line may be a header
    with pytest.raises(OptionError, match="mpp of 'slide' is not a number"):
        mpp_table(str(path))


def test_integer_labels_are_kept_as_they_are(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("slide,label\na.svs,3\nb,0\nc.tif,12\n")
    assert label_table(str(path)) == ({"a.svs": 3, "b": 0, "c.tif": 12}, [])
    path.write_text("a.svs,7\nb,12\n")  # no header
    assert label_table(str(path)) == ({"a.svs": 7, "b": 12}, [])


def test_class_names_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("slide,class\na.svs,tumour\nb,normal\nc,stroma\nd,tumour\n")
    labels, names = label_table(str(path))
    assert names == ["normal", "stroma", "tumour"]
    assert labels == {"a.svs": 2, "b": 0, "c": 1, "d": 2}


def test_mixing_integer_labels_and_class_names_is_an_error_naming_the_lines(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("slide-000,1\nslide-001,tumor\nslide-002,2\n")  # was silently renumbered to 0, 2, 1
    with pytest.raises(OptionError, match=r"labels\.csv: integer labels mixed with class names.*2: slide-001,tumor"):
        label_table(str(path))
    path.write_text("slide,label\na,normal\nb,tumour\nc,3\nd,normal\n")  # the minority is what looks wrong
    with pytest.raises(OptionError, match=r"line 4: c,3$"):
        label_table(str(path))


def test_header_lines_of_label_tables(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    for header in ("slide,label", "slide_id,diagnosis", "file,y", "Slide,Class"):
        path.write_text(f"{header}\na.svs,3\nb,0\n")
        assert label_table(str(path)) == ({"a.svs": 3, "b": 0}, []), header
    path.write_text("a.svs,label\nb.svs,other\n")  # a slide file name is never a header
    assert label_table(str(path)) == ({"a.svs": 0, "b.svs": 1}, ["label", "other"])


@pytest.mark.parametrize("what", ["--labels", "--mpp-csv"])
def test_a_slide_listed_twice_is_an_error_naming_it_and_its_lines(tmp_path: Path, what: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text("slide,value\na.svs,1\nb.svs,2\n\na.svs,1\n")
    read = label_table if what == "--labels" else mpp_table
    with pytest.raises(OptionError, match=rf"{what} .*t\.csv: 'a\.svs' is listed twice \(lines 2 and 5\)"):
        read(str(path))


@pytest.mark.parametrize("value", ["99999999999999999999999", "9223372036854775808", "-9223372036854775809", "-1"])
def test_a_label_outside_int64_or_negative_is_an_error_naming_the_value(tmp_path: Path, value: str) -> None:
    path = tmp_path / "labels.csv"
    path.write_text(f"a.svs,1\nb.svs,{value}\n")
    with pytest.raises(OptionError, match=rf"label {value} of 'b\.svs' \(line 2\) is not in 0\.\.2\*\*63-1"):
        label_table(str(path))
    path.write_text("a.svs,9223372036854775807\nb.svs,0\n")  # the limits are fine
    assert label_table(str(path)) == ({"a.svs": 2**63 - 1, "b.svs": 0}, [])


def test_a_line_without_a_label_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("a.svs,1\nb.svs,\n")
    with pytest.raises(OptionError, match=r"'b\.svs' \(line 2\) has no value"):
        label_table(str(path))


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "0", "1e400", "1000"])
def test_an_mpp_that_is_not_finite_and_positive_is_an_error_naming_slide_and_value(tmp_path: Path, value: str) -> None:
    path = tmp_path / "mpp.csv"
    path.write_text(f"slide,mpp\na.svs,0.25\nb.svs,{value}\n")
    with pytest.raises(OptionError, match=rf"--mpp-csv .*mpp\.csv: mpp of 'b\.svs' \(line 3\) is {value}: need"):
        mpp_table(str(path))


SLIDES = ["/d/a.svs", "/d/b.tif", "/d/sub/c.svs"]


def test_check_tables_reports_unknown_names_and_slides_without_a_label(caplog: pytest.LogCaptureFixture) -> None:
    options = BuildOptions(labels={"a.svs": 1, "x": 2, "y.svs": 0}, mpp_overrides={"b": 0.25, "/e/c.svs": 0.5})
    expected = [
        "--labels: 2 slide names match no input slide: x, y.svs",
        "--labels: 2 of 3 slides have no label (no .cls; label -1 when streamed): b.tif, c.svs",
        "--mpp-csv: 1 slide name matches no input slide: /e/c.svs",
    ]
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        assert check_tables(SLIDES, options) == expected
    assert [r.getMessage() for r in caplog.records] == expected  # logged, for the CLI's stderr


def test_check_tables_is_quiet_when_the_tables_match_and_without_tables() -> None:
    assert check_tables(SLIDES, BuildOptions(labels={"a": 0, "b.tif": 1, "/d/sub/c.svs": 0}, require_labels=True)) == []
    assert check_tables(SLIDES, BuildOptions()) == []  # no labels: nothing is missing one


def test_long_lists_of_names_are_cut_short() -> None:
    many = [f"/d/s{i:02d}.svs" for i in range(12)]
    (warning,) = check_tables(many, BuildOptions(labels={"s00": 1}))
    assert warning.endswith(
        "11 of 12 slides have no label (no .cls; label -1 when streamed): "
        "s01.svs, s02.svs, s03.svs, s04.svs, s05.svs and 6 more"
    )


def test_require_labels_makes_a_missing_label_an_error_naming_the_slides() -> None:
    with pytest.raises(OptionError, match=r"^--require-labels: 1 of 3 slides have no label in --labels: b\.tif$"):
        check_tables(SLIDES, BuildOptions(labels={"a": 0, "c": 1}, require_labels=True))
    with pytest.raises(OptionError, match="3 of 3 slides have no label"):
        check_tables(SLIDES, BuildOptions(require_labels=True))


@pytest.mark.parametrize("table", ["labels", "mpp_overrides"])
def test_a_slide_in_a_table_under_two_names_is_an_error(table: str) -> None:
    value = {"labels": 1, "mpp_overrides": 0.25}[table]
    options = BuildOptions(**{table: {"b": value, "/d/b.tif": value}})
    with pytest.raises(OptionError, match=r"b\.tif is listed twice: as '/d/b\.tif' and 'b'"):
        check_tables(SLIDES, options)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("mpp_overrides", {"a.svs": float("nan")}, "invalid mpp_overrides: mpp of 'a.svs' is nan: need a level-0 mpp"),
        ("mpp_overrides", {"a.svs": 0.0}, "mpp of 'a.svs' is 0.0"),
        ("mpp_overrides", {"a.svs": float("inf")}, "mpp of 'a.svs' is inf"),
        ("default_mpp", -1.0, "invalid default_mpp: -1.0 (need 0 < UM < 1000)"),
        ("default_mpp", float("nan"), "invalid default_mpp: nan"),
        ("labels", {"a.svs": 2**63}, "invalid labels: label of 'a.svs' is 9223372036854775808: need an integer in 0"),
        ("seed", -1, "invalid seed: -1 (need >= 0)"),
    ],
)
def test_build_options_refuse_what_the_tables_refuse(field: str, value: object, message: str) -> None:
    with pytest.raises(OptionError, match=re.escape(message)):
        BuildOptions(**{field: value})  # type: ignore[arg-type]


def test_check_output_refuses_a_file_or_a_path_under_one(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OptionError, match=r"^-o .*afile: exists and is not a folder$"):
        check_output(str(tmp_path / "afile"))
    with pytest.raises(OptionError, match=r"^-o .*afile/a/b: .*afile is not a folder$"):
        check_output(str(tmp_path / "afile" / "a" / "b"))
    check_output(str(tmp_path))  # an existing folder
    check_output(str(tmp_path / "new" / "deeper"))  # a folder that can be made
    check_output("s3://bucket/prefix")  # URLs are the destination's business


# ---- issue 28: inputs and tables that meant nothing, or the same slide twice ----------------------------------


def test_the_same_file_by_relative_and_absolute_path_symlink_or_hard_link_is_found_once(
    tree: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    aliases = tmp_path / "aliases"
    aliases.mkdir()
    (aliases / "linked.svs").symlink_to(tree / "b.svs")
    os.link(tree / "A.TIF", aliases / "hard.tif")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        found = find_slides(["root", str(tree), "aliases"])
    assert len(found) == 4 and {os.path.basename(p) for p in found} <= {
        "A.TIF",
        "b.svs",
        "d.ndpi",
        "e.tiff",
        "linked.svs",
        "hard.tif",
    }
    assert len({os.stat(p).st_ino for p in found}) == 4  # each file once, whichever name was kept
    assert caplog.text.count("is the same file as") == 6  # 4 relative, 2 aliases: each said


def test_a_list_file_line_that_is_a_file_is_not_cut_at_its_comma_and_a_bom_is_no_name(tmp_path: Path) -> None:
    _touch(tmp_path / "a,b.svs", tmp_path / "c.svs", tmp_path / "d.svs")
    listing = tmp_path / "slides.txt"
    listing.write_text("\ufeffc.svs\na,b.svs\nd.svs,tumour\n", encoding="utf-8")
    assert find_slides([str(listing)]) == [str(tmp_path / n) for n in ("a,b.svs", "c.svs", "d.svs")]


@pytest.mark.parametrize("text", ["", "slide,label\n", "# to fill in\n\n", "\ufeffslide,label\n"])
def test_a_label_or_mpp_table_without_a_single_entry_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "table.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(OptionError, match=r"--labels .*table\.csv: no slide,label line"):
        label_table(str(path))
    path.write_text(text.replace("label", "mpp"), encoding="utf-8")
    with pytest.raises(OptionError, match=r"--mpp-csv .*table\.csv: no slide,mpp line"):
        mpp_table(str(path))


def test_a_byte_order_mark_before_a_table_header_is_no_slide_name(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("\ufeffslide,label\nslide-000,tumour\nslide-001,normal\n", encoding="utf-8")
    assert label_table(str(path)) == ({"slide-000": 1, "slide-001": 0}, ["normal", "tumour"])


@pytest.mark.parametrize("key", ["a", "a.svs"])
def test_a_table_name_matching_two_slides_is_refused(key: str) -> None:
    paths = ["/data/x/a.svs", "/data/y/a.svs"]
    with pytest.raises(
        OptionError, match=rf"--labels: '{re.escape(key)}' matches two slides, /data/x/a\.svs and /data/y"
    ):
        check_tables(paths, BuildOptions(labels={key: 1}))
    with pytest.raises(OptionError, match=r"--mpp-csv: .* matches two slides"):
        check_tables(paths, BuildOptions(mpp_overrides={key: 0.25}))
    assert check_tables(paths, BuildOptions(labels={"/data/x/a.svs": 1, "/data/y/a.svs": 2})) == []


# ---- issue 42: odd tables ------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_a_labels_file_in_utf16_or_utf32_with_its_byte_order_mark_is_read(tmp_path: Path, encoding: str) -> None:
    path = tmp_path / "labels.csv"
    bom = {"utf-16-le": "\ufeff", "utf-16-be": "\ufeff"}.get(encoding, "")  # the plain codecs write their own
    path.write_text(bom + "slide,label\nslide-000,tumour\nslide-001,normal\n", encoding=encoding)
    assert label_table(str(path)) == ({"slide-000": 1, "slide-001": 0}, ["normal", "tumour"])
    assert mpp_table(str(_write(tmp_path / "mpp.csv", "a.svs,0.25\n", encoding))) == {"a.svs": 0.25}


def _write(path: Path, text: str, encoding: str) -> Path:
    path.write_text(("\ufeff" if encoding.endswith(("-le", "-be")) else "") + text, encoding=encoding)
    return path


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "slide,label\na,1\n".encode("utf-16-le"),
            r"holds NUL bytes: UTF-16 without a byte-order mark.*save it as UTF-8",
        ),
        (
            b"slide,label\na,\xe9t\xe9\n",
            r"not UTF-8 text \(byte 3 of line 2 is 0xe9\): an encoding problem; save it as UTF-8",
        ),
    ],
)
def test_a_table_in_another_encoding_is_refused_as_an_encoding_problem(
    tmp_path: Path, data: bytes, message: str
) -> None:
    path = tmp_path / "labels.csv"
    path.write_bytes(data)
    with pytest.raises(OptionError, match=r"--labels .*labels\.csv: " + message):
        label_table(str(path))
    listing = tmp_path / "slides.txt"
    listing.write_bytes(data)
    with pytest.raises(OptionError, match=r"slides\.txt: " + message):
        find_slides([str(listing)])


@pytest.mark.parametrize("value", ["\u0663", "1\u0660", "\u06f7", "\uff11"])  # Arabic-Indic, Persian, full-width
def test_labels_or_mpps_in_digits_other_than_ascii_are_refused_naming_the_line(tmp_path: Path, value: str) -> None:
    path = tmp_path / "labels.csv"
    path.write_text(f"a.svs,1\nb.svs,{value}\n", encoding="utf-8")
    with pytest.raises(OptionError, match=r"--labels .*labels\.csv: label .* of 'b\.svs' \(line 2\) .*ASCII digits"):
        label_table(str(path))
    path.write_text(f"a.svs,0.25\nb.svs,0.{value}\n", encoding="utf-8")
    with pytest.raises(OptionError, match=r"--mpp-csv .*labels\.csv: mpp .* of 'b\.svs' \(line 2\) .*ASCII digits"):
        mpp_table(str(path))


def test_a_third_column_in_a_table_is_an_error_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("slide,label\na.svs,1,\nb.svs,0,extra\n", encoding="utf-8")  # an empty trailing cell is fine
    with pytest.raises(OptionError, match=r"--labels .*labels\.csv: line 3 has 3 columns \('extra' after the label"):
        label_table(str(path))
    path.write_text("a.svs,1,\nb.svs,0\n", encoding="utf-8")
    assert label_table(str(path)) == ({"a.svs": 1, "b.svs": 0}, [])


def test_a_byte_identical_copy_of_a_slide_under_another_name_is_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import shutil

    root = tmp_path / "in"
    root.mkdir()
    body = os.urandom(3 << 20)  # 3 MB: the middle is hashed by neither the first nor the last MB
    (root / "a.svs").write_bytes(body)
    shutil.copyfile(root / "a.svs", root / "copy-of-a.svs")
    (root / "b.svs").write_bytes(body[:-1] + bytes([body[-1] ^ 1]))  # same size, another last byte
    (root / "c.svs").write_bytes(body[:100])
    with caplog.at_level(logging.WARNING, logger="wsishard"):
        found = find_slides([str(root)])
    assert len(found) == 4  # still built: a warning, not a refusal
    lines = [r.getMessage() for r in caplog.records if "same bytes" in r.getMessage()]
    assert len(lines) == 1 and "copy-of-a.svs" in lines[0] and "a.svs" in lines[0], lines
    assert "b.svs" not in lines[0] and "c.svs" not in lines[0]
