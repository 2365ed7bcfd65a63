"""The per-sample index: rows match the shard's bytes, it loads without unpickling, the summary adds up."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from wsishard.errors import IndexFileError
from wsishard.shards.index import IndexWriter, index_name, index_shard, load_index
from wsishard.shards.reader import group_members, tar_members
from wsishard.shards.summary import Summary, combine, is_summary_name, per_shard, summary_name
from wsishard.shards.writer import sample_records


def _sample(i: int, slide: str, label: int | None) -> tuple[str, dict[str, bytes]]:
    meta = {
        "slide_id": slide,
        "x": 10 * i,
        "y": 20 * i,
        "patch_mpp": 0.5,
        "tissue": i / 10,
        "background": 0.1,
        "dark": 0.0,
        "sharpness": 50.0 + i,
        "pigment": i / 20,
    }
    members = {"jpg": bytes(100 + 37 * i), "json": json.dumps(meta).encode()}
    if label is not None:
        members["cls"] = str(label).encode()
    return f"{slide}_x{10 * i}_y{20 * i}", members


def test_rows_point_at_each_samples_records_and_carry_its_fields() -> None:
    samples = [_sample(i, f"s{i % 2}", i % 3) for i in range(7)]
    head = b"\0" * 1024  # records written after some bytes: offsets count from the shard's start
    writer = IndexWriter()
    writer.add(b"".join(sample_records(k, m) for k, m in samples[:3]), len(head))
    rest = b"".join(sample_records(k, m) for k, m in samples[3:])
    writer.add(rest, len(head) + sum(len(sample_records(k, m)) for k, m in samples[:3]))
    shard = head + b"".join(sample_records(k, m) for k, m in samples)
    index = load_index(writer.to_bytes())
    assert len(index) == 7
    for row, (key, members) in enumerate(samples):
        lo, size = int(index.columns["offset"][row]), int(index.columns["size"][row])
        [(got_key, got)] = list(group_members(tar_members(io.BytesIO(shard[lo : lo + size]), lambda n: True)))
        assert got_key == key == index.key[row].decode() and got == members
        assert index.slide_names[index.columns["slide"][row]].decode() == f"s{row % 2}"
        assert index.columns["label"][row] == row % 3
        assert index.columns["x"][row] == 10 * row and index.columns["sharpness"][row] == pytest.approx(50 + row)
    table = index.table("shard-000000-0000.tar")
    assert table["slide_id"].tolist() == [f"s{i % 2}" for i in range(7)] and table["position"].tolist() == list(
        range(7)
    )


def test_a_sample_without_cls_takes_its_json_label_or_minus_one() -> None:
    key, members = _sample(1, "a", None)
    writer = IndexWriter()
    writer.add(sample_records(key, members), 0)
    assert load_index(writer.to_bytes()).columns["label"].tolist() == [-1]


def test_an_index_holding_objects_is_refused_never_unpickled() -> None:
    out = io.BytesIO()
    np.savez(out, version=np.int64(1), key=np.array([object()], dtype=object))
    with pytest.raises(IndexFileError, match=r"^index evil\.idx\.npz: not a shard index"):
        load_index(out.getvalue(), "evil.idx.npz")
    with pytest.raises(IndexFileError, match=r"^index junk\.idx\.npz: not a shard index"):
        load_index(b"not a zip", "junk.idx.npz")


def _rewritten(data: bytes, drop: tuple[str, ...] = (), **columns: np.ndarray) -> bytes:
    """The index ``data`` with ``columns`` replaced or added and the arrays named in ``drop`` left out."""
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {name: npz[name] for name in npz.files if name not in drop}
    out = io.BytesIO()
    np.savez(out, **{**arrays, **columns})
    return out.getvalue()


def test_an_index_with_narrower_columns_is_read_widened_and_a_wider_or_other_kind_refused() -> None:
    """0.2.0's first builds wrote int32 labels: their indexes still stream (the stream read them as unreadable)."""
    writer = IndexWriter()
    for i in range(3):
        writer.add(sample_records(*_sample(i, "s", i)), 0)
    data = writer.to_bytes()
    index = load_index(_rewritten(data, label=np.array([0, 1, 2], np.int32)))
    assert index.columns["label"].dtype == np.int64 and index.columns["label"].tolist() == [0, 1, 2]
    for bad in (np.array([0, 1, 2], np.float64), np.array([0, 1, 2], np.uint64), np.array([0, 1], np.int64)):
        with pytest.raises(IndexFileError, match="index column 'label'"):
            load_index(_rewritten(data, label=bad), "old.idx.npz")


def test_the_pigment_score_is_a_column_and_an_index_written_before_it_reads_as_unknown() -> None:
    writer = IndexWriter()
    for i in range(3):
        writer.add(sample_records(*_sample(i, "s", i)), 0)
    data = writer.to_bytes()
    assert load_index(data).columns["pigment"].tolist() == pytest.approx([0.0, 0.05, 0.1])
    assert np.isnan(load_index(_rewritten(data, drop=("pigment",))).columns["pigment"]).all()


def test_summaries_combine_and_split_back_per_shard() -> None:
    items = [
        (np.array([0, 1]), np.array([8, 2]), np.array([b"a", b"b"]), np.array([6, 4])),
        (np.array([1]), np.array([5]), np.array([b"c", b"a"]), np.array([1, 4])),
    ]
    summary = combine(["shard-000000-0000.tar", "shard-000000-0001.tar"], items)
    assert summary.label_counts.tolist() == [[8, 2], [0, 5]] and summary.samples.tolist() == [10, 5]
    assert summary.slides.tolist() == [b"a", b"b", b"c"]
    again = Summary.from_bytes(summary.to_bytes())
    back = per_shard(again)["shard-000000-0001.tar"]
    assert back[0].tolist() == [1] and back[2].tolist() == [b"c", b"a"] and back[3].tolist() == [1, 4]


def test_index_names_belong_to_their_shard() -> None:
    assert index_name("shard-000012-0003.tar") == "shard-000012-0003.idx.npz"
    assert index_shard("shard-000012-0003.idx.npz") == "shard-000012-0003.tar"
    assert index_shard("../x.idx.npz") is None and index_shard("shard-000012-0003.tar") is None
    assert summary_name() == "index.npz" and is_summary_name(summary_name((2, 8)))
    assert index_shard("../evil.idx.npz") is None


def test_any_int64_label_is_indexed_and_one_outside_int64_never_stops_the_writer() -> None:
    """A build accepts labels across int64 (a 40-bit id); a hand-made shard may hold one beyond it, which the stream
    refuses when it reads the sample: writing its index must not crash (it did, with an int32 column)."""
    samples = [_sample(0, "a", 2**40), _sample(1, "a", -(2**63)), _sample(2, "a", 2**64), _sample(3, "a", -(10**30))]
    writer = IndexWriter()
    writer.add(b"".join(sample_records(k, m) for k, m in samples), 0)
    index = load_index(writer.to_bytes())
    assert index.columns["label"].tolist() == [2**40, -(2**63), -1, -1]


def test_members_that_do_not_parse_give_unknowns_and_never_stop_the_writer() -> None:
    """A hand-made or damaged shard (the hostile-input cases write one): JSON nested too deep, JSON that is no object
    or does not parse, a .cls that is no number; the stream and verify refuse such samples when they read them."""
    bad = [
        ("a_x0_y0", {"jpg": b"x", "json": b"[" * 100_000 + b"]" * 100_000}),
        ("a_x1_y1", {"jpg": b"x", "json": b"[1, 2]", "cls": b"seven"}),
        ("a_x2_y2", {"jpg": b"x", "json": b'{"x": "left", "tissue": "much", "label": 1e400}'}),
        ("a_x3_y3", {"jpg": b"x", "json": b"{not json"}),
    ]
    writer = IndexWriter()
    writer.add(b"".join(sample_records(k, m) for k, m in bad), 0)
    index = load_index(writer.to_bytes())
    assert index.columns["label"].tolist() == [-1, -1, -1, -1] and index.columns["x"].tolist() == [-1, -1, -1, -1]
    assert np.isnan(index.columns["tissue"]).all() and [k.decode() for k in index.key] == [k for k, _ in bad]
