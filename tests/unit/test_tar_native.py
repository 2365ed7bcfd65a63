"""The C scan of plain tar members (``scan`` of ``wsishard/_native.c``) against the Python header reader.

:class:`~wsishard.shards.reader.TarSamples` reads the headers lying whole in its buffer in C and every other header
(extension headers, damage, the end of a read) in Python. Both paths must give the same samples, the same count and
the same error at the same point: each case below is read with the C scan and again with it switched off.
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import shardmaker as sm
from streamtools import Trickle

from wsishard.format import SAMPLE_EXTS
from wsishard.shards.reader import TarSamples
from wsishard.shards.writer import sample_records


def _read(blob: bytes, native: bool, phase: int = 0, step: int = 1, trickle: int = 0) -> tuple[Any, ...]:
    """What TarSamples gives: the samples, then ``seen`` and the error (type and text) if one was raised."""
    keep = TarSamples(Trickle(blob, trickle) if trickle else io.BytesIO(blob), SAMPLE_EXTS, phase, step, native)
    got: list[tuple[str, dict[str, bytes]]] = []
    try:
        for sample in keep:
            got.append(sample)
    except (ValueError, EOFError) as exc:
        return got, keep.seen, type(exc).__name__, str(exc)
    return got, keep.seen, None, None


def _same(blob: bytes, **kw: int) -> tuple[Any, ...]:
    native, plain = _read(blob, True, **kw), _read(blob, False, **kw)
    assert native == plain
    return native


@pytest.mark.parametrize(("phase", "step"), [(0, 1), (0, 3), (2, 3), (4, 5)])
@pytest.mark.parametrize("trickle", [0, 700, 1500])
def test_shards_read_the_same_in_c_and_in_python(stream_out: sm.Output, phase: int, step: int, trickle: int) -> None:
    for index in range(3):
        blob = Path(stream_out.path(index)).read_bytes()
        got, seen, error, _ = _same(blob, phase=phase, step=step, trickle=trickle)
        with tarfile.open(stream_out.path(index)) as tar:
            names = tar.getnames()
        assert error is None and seen == len({n.split(".")[0] for n in names}) > 0
        assert len(got) == len(range(phase, seen, step))
        assert all(set(group) >= {"jpg", "json"} for _, group in got)


def _tar(members: list[tarfile.TarInfo | tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for member in members:
            if isinstance(member, tarfile.TarInfo):
                tar.addfile(member)
                continue
            info = tarfile.TarInfo(member[0])
            info.size = len(member[1])
            tar.addfile(info, io.BytesIO(member[1]))
    return out.getvalue()


def _odd_members() -> list[tarfile.TarInfo | tuple[str, bytes]]:
    folder, link = tarfile.TarInfo("a_dir"), tarfile.TarInfo("b.jpg")
    folder.type, link.type, link.linkname = tarfile.DIRTYPE, tarfile.SYMTYPE, "a.jpg"
    return [
        ("a.jpg", b"1" * 600),
        ("a.json", b"{}"),
        ("a.txt", b"not read"),
        folder,
        link,
        ("noext", b"x"),
        ("dir.d/c.jpg", b"c"),
        ("dir.d/c.cls", b"3"),
        (".hidden.jpg", b"h"),
        (".jpg", b"j"),
        ("d/.json", b"{}"),
        ("d/e.tar.jpg", b"e"),
        ("d/e.json", b"{}"),
        ("f" * 96 + ".jpg", b"f"),
        ("p" * 90 + "/" + "q" * 90 + ".jpg", b"prefix"),
        ("big.jpg", bytes(3 << 20)),
        ("big.json", b"{}"),
        ("z.jpg", b"z"),
    ]


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
@pytest.mark.parametrize("trickle", [0, 333])
def test_odd_tars_read_the_same(fmt: int, trickle: int) -> None:
    """Directories, links, names without an extension or with dots in folders, USTAR prefixes, a member larger than
    the reader's buffer, long names (GNU ``L``, pax ``x``) and non-UTF-8 names."""
    members = _odd_members()
    if fmt != tarfile.USTAR_FORMAT:
        members += [("é" * 80 + "k" * 90 + ".jpg", b"long"), ("é" * 80 + "k" * 90 + ".json", b"{}")]
    blob = _tar(members, fmt)
    got, seen, error, _ = _same(blob, trickle=trickle)
    keys = ["a", "dir.d/c", "d/e", "f" * 96, "p" * 90 + "/" + "q" * 90, "big", "z"]  # no key (.jpg) or ext (tar.jpg)
    assert error is None and [k for k, _ in got] == keys + ["é" * 80 + "k" * 90] * (fmt != tarfile.USTAR_FORMAT)
    assert seen == len(got)
    assert dict(got)["a"] == {"jpg": b"1" * 600, "json": b"{}"} and dict(got)["dir.d/c"] == {"jpg": b"c", "cls": b"3"}
    assert dict(got)["big"]["jpg"] == bytes(3 << 20)
    raw = bytearray(_tar([("ok.jpg", b"1"), ("xy.jpg", b"2")]))  # a name byte that is not UTF-8
    raw[512 * 2 + 1] = 0xFF
    raw[512 * 2 + 148 : 512 * 2 + 156] = b" " * 8
    raw[512 * 2 + 148 : 512 * 2 + 156] = b"%06o\0 " % sum(raw[1024:1536])
    assert [k for k, _ in _same(bytes(raw))[0]] == ["ok", "x\udcff"]


def test_a_duplicate_member_and_signed_checksums_read_the_same() -> None:
    blob = _tar([("a.jpg", b"1"), ("a.json", b"{}"), ("a.jpg", b"2")])
    assert _same(blob)[2:] == ("ValueError", "duplicate member a.jpg")
    assert _same(blob, phase=1, step=2)[2] is None  # not kept: never taken, so no duplicate
    signed = bytearray(_tar([("a.jpg", b"1")]))
    signed[345:350] = b"\xe9\xe9\xe9/x"  # a prefix with high bytes, its checksum summed as signed chars
    signed[148:156] = b" " * 8
    signed[148:156] = b"%06o\0 " % (sum(signed[:512]) - 256 * 3)
    got, seen, error, _ = _same(bytes(signed))
    assert error is None and seen == 1 and got[0][0].endswith("x/a")


def _ustar_shard(samples: int) -> bytes:
    """A shard as ``wsishard build`` writes it (USTAR headers only)."""
    rng = np.random.default_rng(5)
    records = [
        sample_records(f"s_x{i}_y0", {"jpg": rng.bytes(int(rng.integers(200, 3000))), "json": b'{"x": 0}', "cls": b"1"})
        for i in range(samples)
    ]
    return b"".join(records) + bytes(1024)


@pytest.mark.parametrize("source", ["webdataset", "wsishard"])
def test_damaged_shards_read_the_same(stream_out: sm.Output, source: str) -> None:
    """Random damage to a shard (header fields, pax records and data changed, cuts anywhere): the same samples and
    the same error text at the same point, with and without the C scan. webdataset's TarWriter writes a pax header
    before every member (its mtime), wsishard plain USTAR headers."""
    blob = Path(stream_out.path(1)).read_bytes() if source == "webdataset" else _ustar_shard(30)
    with tarfile.open(fileobj=io.BytesIO(blob)) as tar:
        headers = [m.offset for m in tar]
        if source == "webdataset":  # the pax headers before the members too
            headers += [m.offset - 1024 for m in tar]
    rng = np.random.default_rng(13)
    fields = [(0, 100), (100, 124), (124, 136), (148, 156), (156, 157), (257, 265), (345, 500), (500, 512), (512, 600)]
    outcomes = set()
    for case in range(500):
        damaged = bytearray(blob)
        at = headers[int(rng.integers(len(headers)))]
        start, stop = fields[int(rng.integers(len(fields)))]
        for _ in range(int(rng.integers(1, 4))):
            values = [0, 0x20, 0x30, 0x37, 0x38, 0x2D, 0x80, 0xFF, 0x3D, int(rng.integers(256))]  # "0", "8", "-", "="
            damaged[at + int(rng.integers(start, stop))] = values[int(rng.integers(len(values)))]
        if case % 3 == 0:  # fix the checksum so the change itself is read
            damaged[at + 148 : at + 156] = b" " * 8
            damaged[at + 148 : at + 156] = b"%06o\0 " % sum(damaged[at : at + 512])
        if case % 5 == 0:
            del damaged[int(rng.integers(len(damaged))) :]
        outcome = _same(bytes(damaged), phase=case % 2, step=1 + case % 2, trickle=0 if case % 4 else 900)
        outcomes.add(outcome[2])
    assert {None, "ValueError", "EOFError"} <= outcomes  # the cases reached all three ends


def _header(name: str, size: int, kind: bytes = b"0") -> bytes:
    header = bytearray(tarfile.TarInfo(name).tobuf(tarfile.USTAR_FORMAT))
    header[124:136], header[156:157], header[148:156] = b"%011o\0" % size, kind, b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


_PAX_RECORDS = [
    b"0 mtime=1\n",
    b"-3 mtime=1\n",
    b"99 mtime=1\n",
    b"5 mtime=1\n",
    b"9 mtime=1",
    b"10 mtime=1\n",
    b"6  =x\n10 size=1\n",
    b"8 pathx\n",
    b"",
    b"3 \n",
]


def _pax_case(records: bytes) -> bytes:
    pax = _header("PaxHeader", len(records), b"x") + records.ljust(-len(records) % 512 + len(records), b"\0")
    member = _header("k_x1_y1.jpg", 1) + b"1".ljust(512, b"\0")
    return member + pax + member.replace(b"k_x1", b"k_x2") + bytes(1024)


_CHILD = """
import io, sys
from wsishard.format import SAMPLE_EXTS
from wsishard.shards.reader import TarSamples
for blob in eval(sys.stdin.read()):
    keep = TarSamples(io.BytesIO(blob), SAMPLE_EXTS)
    try:
        print(repr((list(keep), keep.seen, None, None)))
    except (ValueError, EOFError) as exc:
        print(repr(([], keep.seen, type(exc).__name__, str(exc))))
"""


def test_pax_records_read_the_same() -> None:
    """Pax headers the C scan reads past (records other than path and size) or leaves to Python: the same samples or
    the same error. Read with the C scan in a child process: a record whose length cannot advance must not loop (a
    loop in C holding the GIL would never reach pytest's timeout)."""
    blobs = [_pax_case(records) for records in _PAX_RECORDS]
    child = subprocess.run(
        [sys.executable, "-c", _CHILD], input=repr(blobs), capture_output=True, text=True, timeout=60, check=True
    )
    for blob, line in zip(blobs, child.stdout.splitlines(), strict=True):
        got, seen, error, text = plain = _read(blob, False)
        assert ast.literal_eval(line) == (got if error is None else [], seen, error, text)
        assert (seen, error) == (2, None) or (seen, error) == (1, "ValueError"), plain


@pytest.mark.parametrize("trickle", [0, 700])
@pytest.mark.parametrize("damage", ["cut", "oversized"])
def test_a_sample_before_a_broken_member_is_kept(damage: str, trickle: int) -> None:
    """A shard cut inside (or claiming 256 MiB for) the next sample's first member still yields the sample before
    it, and counts the broken one, as the reader did before the C scan (found in review: for a while it did not)."""
    blob = _tar(
        [("s_x0_y0.jpg", b"1" * 100), ("s_x0_y0.json", b"{}"), ("s_x1_y0.jpg", b"2" * 3000), ("s_x1_y0.json", b"{}")]
    )
    if damage == "cut":
        blob = blob[: 512 * 4 + 1000]  # the file ends inside s_x1_y0.jpg
    else:
        blob = blob[:2048] + _header("s_x1_y0.jpg", (1 << 28) + 1) + blob[2560:]
    got, seen, error, text = _same(blob, trickle=trickle)
    assert [key for key, _ in got] == ["s_x0_y0"] and seen == 2
    expected = ("EOFError", "cut short") if damage == "cut" else ("ValueError", "claims")
    assert error == expected[0] and expected[1] in str(text)


def test_the_reader_takes_any_extension_collection_and_refuses_a_share_that_keeps_nothing() -> None:
    blob = _tar([("a.jpg", b"1"), ("a.json", b"{}"), ("b.jpg", b"2")])
    for exts in ({"jpg", "json"}, ("jpg", "json"), ["jpg", "json"]):
        keep = TarSamples(io.BytesIO(blob), exts)  # type: ignore[arg-type]
        assert [k for k, _ in keep] == ["a", "b"] and keep.seen == 2
    for phase, step in ((0, 0), (0, -2), (2, 2), (-1, 3), (2**70, 3)):
        with pytest.raises(ValueError, match="phase < step"):
            TarSamples(io.BytesIO(blob), SAMPLE_EXTS, phase, step)
