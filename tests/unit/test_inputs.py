"""The build's inputs (:mod:`wsishard.builder.inputs`): slides from folders and list files, per-slide tables.

Slide files here are empty: finding slides never opens them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from wsishard.builder.inputs import find_slides, label_table, lookup, mpp_table, read_table
from wsishard.errors import OptionError


def _touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """root/{b.svs, A.TIF, notes.txt, .c.svs, sub/{d.ndpi, deeper/e.tiff}, .hidden/f.svs, z-empty/}"""
    root = tmp_path / "root"
    _touch(root / "b.svs", root / "A.TIF", root / "notes.txt", root / ".c.svs", root / "sub" / "d.ndpi",
           root / "sub" / "deeper" / "e.tiff", root / ".hidden" / "f.svs")  # fmt: skip
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
    assert find_slides([str(listing)]) == sorted([str(tree / "sub" / "deeper" / "e.tiff"), str(tree / "b.svs"),
                                                  str(tree / "A.TIF")])  # fmt: skip
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
    path.write_text("slide,value\n# a comment\n\n a.svs , 1 \nb,two,extra\n")
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
    path.write_text("slide,label\na.svs,3\nb,0\nc.tif,-1\n")
    assert label_table(str(path)) == ({"a.svs": 3, "b": 0, "c.tif": -1}, [])
    path.write_text("a.svs,7\nb,12\n")  # no header
    assert label_table(str(path)) == ({"a.svs": 7, "b": 12}, [])


def test_class_names_are_numbered_in_sorted_order(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("slide,class\na.svs,tumour\nb,normal\nc,stroma\nd,tumour\n")
    labels, names = label_table(str(path))
    assert names == ["normal", "stroma", "tumour"]
    assert labels == {"a.svs": 2, "b": 0, "c": 1, "d": 2}
    path.write_text("a.svs,2\nb.svs,benign\n")  # one name: every label is a name, digits too
    assert label_table(str(path)) == ({"a.svs": 0, "b.svs": 1}, ["2", "benign"])
