"""Reading shards: ``tar_members`` against ``tarfile``, and ``read_shard``'s errors on missing and damaged tars."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import shardmaker as sm
from streamtools import COUNTS, Trickle

from wsishard.errors import ShardError
from wsishard.shards.reader import tar_members
from wsishard.storage.opener import StreamOpener
from wsishard.streaming.stages import ShardRef, read_shard


def _tar(
    tmp_path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT, extra: list[tarfile.TarInfo] = ()
) -> Path:
    path = tmp_path / f"t{fmt}.tar"
    with tarfile.open(path, "w", format=fmt) as tar:
        for info in extra:
            tar.addfile(info)
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_tar_members_match_tarfile_on_a_shard(stream_out: sm.Output) -> None:
    data = Path(stream_out.path(2)).read_bytes()
    with tarfile.open(stream_out.path(2)) as tar:
        expected = [(m.name, tar.extractfile(m).read()) for m in tar]  # type: ignore[union-attr]
    assert list(tar_members(io.BytesIO(data), lambda _: True)) == expected
    assert list(tar_members(Trickle(data, 700), lambda _: True)) == expected  # short reads
    jsons = list(tar_members(io.BytesIO(data), lambda name: name.endswith(".json")))
    assert jsons == [(n, d) for n, d in expected if n.endswith(".json")]


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT])
def test_tar_members_read_long_names_and_skip_what_is_not_a_file(tmp_path: Path, fmt: int) -> None:
    long_key = "d" * 60 + "/" + "k" * 90 if fmt == tarfile.USTAR_FORMAT else "é" * 70 + "k" * 90  # prefix / long
    members = [(f"{long_key}.jpg", b"x" * 1000), (f"{long_key}.json", b"{}"), ("short.cls", b"1")]
    folder, link = tarfile.TarInfo("a_dir"), tarfile.TarInfo("a_link.jpg")
    folder.type, link.type, link.linkname = tarfile.DIRTYPE, tarfile.SYMTYPE, "short.cls"
    path = _tar(tmp_path, members, fmt, extra=[folder, link])
    assert list(tar_members(path.open("rb"), lambda _: True)) == members


def _shard_of(tmp_path: Path, blob: bytes, samples: int) -> ShardRef:
    path = tmp_path / "s.tar"
    path.write_bytes(blob)
    return ShardRef(url=str(path), samples=samples)


def test_tar_damage_is_a_shard_error(stream_out: sm.Output, tmp_path: Path) -> None:
    data = bytearray(Path(stream_out.path(0)).read_bytes())
    n = COUNTS[0]
    assert len(list(read_shard(_shard_of(tmp_path, bytes(data), n), StreamOpener()))) == n
    with tarfile.open(stream_out.path(0)) as tar:
        offsets = [m.offset for m in tar]
    flipped = bytearray(data)
    flipped[offsets[4] + 10] ^= 0x01  # a name byte of the fifth header: its checksum no longer holds
    cases = {
        "checksum": bytes(flipped),
        "cut short": bytes(data[: offsets[4] + 300]),
        "cut short ": bytes(data[: offsets[4] + 512 + 7]),
    }
    for reason, blob in cases.items():
        with pytest.raises(ShardError, match=reason.strip()) as info:
            list(read_shard(_shard_of(tmp_path, blob, n), StreamOpener()))
        assert info.value.shard.endswith("s.tar")
    with pytest.raises(ShardError, match="the manifest says"):  # cut at a header: reads as a shorter shard
        list(read_shard(_shard_of(tmp_path, bytes(data[: offsets[6]]), n), StreamOpener()))
    with pytest.raises(ShardError, match="checksum"):  # not a tar at all
        list(read_shard(_shard_of(tmp_path, b"\x1f\x8b" + bytes(data[2:]), n), StreamOpener()))


def test_read_shard_names_a_missing_shard(tmp_path: Path) -> None:
    task = ShardRef(url=str(tmp_path / "nope.tar"), samples=1)
    with pytest.raises(ShardError, match=r"nope\.tar"):
        list(read_shard(task, StreamOpener()))


def test_a_checksum_off_by_a_multiple_of_a_modulus_is_refused() -> None:
    """The checksum is the exact byte sum: a header of mostly 0xff bytes whose stored checksum is its sum minus 65521
    (what a check of the sum mod adler32's modulus would accept) fails, one with its sum passes."""
    info = tarfile.TarInfo("k" * 60 + ".jpg")
    info.size = 3
    blob = bytearray(info.tobuf(tarfile.USTAR_FORMAT) + b"abc".ljust(512, b"\0") + bytes(1024))
    for start, stop in ((100, 124), (136, 148), (157, 257), (263, 345), (500, 512)):  # fields a reader ignores
        blob[start:stop] = b"\xff" * (stop - start)
    header = blob[:512]
    header[148:156] = b" " * 8
    total = sum(header)
    assert total > 65521 and header.count(0) < 256
    for stored, ok in ((total - 65521, False), (total, True)):
        blob[148:156] = b"%06o\0 " % stored
        if ok:
            assert list(tar_members(io.BytesIO(bytes(blob)), lambda _: True)) == [(info.name, b"abc")]
        else:
            with pytest.raises(ValueError, match="checksum"):
                list(tar_members(io.BytesIO(bytes(blob)), lambda _: True))


def test_a_header_without_name_or_checksum_that_is_not_all_zero_fails_its_checksum() -> None:
    blob = bytearray(1536)
    blob[156:157] = b"0"  # a type flag, nothing else: not the end of the archive, not a valid header either
    with pytest.raises(ValueError, match="checksum"):
        list(tar_members(io.BytesIO(bytes(blob)), lambda _: True))
    assert list(tar_members(io.BytesIO(bytes(1536)), lambda _: True)) == []  # zero blocks: an empty archive


def _header_with(name: str, size_field: bytes, kind: bytes = b"0") -> bytes:
    header = bytearray(tarfile.TarInfo(name).tobuf(tarfile.USTAR_FORMAT))
    header[124:136], header[156:157], header[148:156] = size_field.ljust(12, b"\0"), kind, b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)
    return bytes(header)


@pytest.mark.timeout(20)
@pytest.mark.parametrize("size", [b"-1000", b"-3000", b"+17", b"1_0", b"0o17"])
def test_a_size_that_is_not_octal_digits_is_refused_not_read_backwards(size: bytes) -> None:
    """int(b"-1000", 8) is -512: taking it moved the reader back onto the same header, for ever (found in review)."""
    blob = _header_with("k_x1_y1.jpg", size) + bytes(2048)
    with pytest.raises(ValueError, match="not octal"):
        list(tar_members(io.BytesIO(blob), lambda _: True))


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    ("record", "bad"),
    [
        (b"0 path=x\n", "bad length"),
        (b"-3 path=x\n", "bad length"),
        (b"99 path=x\n", "bad length"),
        (b"14 size=-1536\n", "not a size"),
    ],
)
def test_a_pax_record_that_cannot_advance_or_a_negative_pax_size_is_refused(record: bytes, bad: str) -> None:
    pax = _header_with("PaxHeader", b"%o" % len(record), b"x") + record.ljust(512, b"\0")
    blob = pax + _header_with("k_x1_y1.jpg", b"1") + b"1".ljust(512, b"\0") + bytes(1024)
    with pytest.raises(ValueError, match=bad):
        list(tar_members(io.BytesIO(blob), lambda _: True))
