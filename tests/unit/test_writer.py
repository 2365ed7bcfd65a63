"""Shard writing: byte for byte tarfile's stream layout, and segments made apart concatenate into the same shard."""

from __future__ import annotations

import hashlib
import io
import random
import tarfile
from pathlib import Path

import pytest

from wsishard.shards.writer import ShardWriter, sample_records
from wsishard.storage.output import Destination


def _samples(seed: int) -> list[tuple[str, dict[str, bytes]]]:
    rng = random.Random(seed)
    out = []
    for i in range(rng.randrange(1, 30)):
        members = {"jpg": rng.randbytes(rng.randrange(1, 20_000)), "json": b'{"x": %d}' % i}
        if seed % 2:
            members["cls"] = b"3"
        out.append((f"slide-{rng.randrange(4)}_x{rng.randrange(10**6)}_y{i}", members))
    return out


def _tarfile_stream(samples: list[tuple[str, dict[str, bytes]]]) -> bytes:
    """The reference: the standard library's tarfile in stream mode, as the 0.1 writer (and webdataset) wrote."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        for key, members in samples:
            for ext in sorted(members):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size, info.mtime, info.mode = len(members[ext]), 0, 0o444
                info.uname = info.gname = "wsishard"
                tar.addfile(info, io.BytesIO(members[ext]))
    return buf.getvalue()


@pytest.mark.parametrize("seed", range(6))
def test_shards_are_byte_identical_to_tarfile_and_segments_concatenate(tmp_path: Path, seed: int) -> None:
    samples = _samples(seed)
    dest = Destination(str(tmp_path))
    with ShardWriter(dest, "one.tar") as one:
        for key, members in samples:
            one.write(key, members, key.split("_")[0])
    cut = len(samples) // 3
    parts = ShardWriter(dest, "parts.tar")  # a first segment's records made elsewhere, then the rest one by one
    parts.append(b"".join(sample_records(k, m) for k, m in samples[:cut]), cut, {k.split("_")[0] for k, _ in samples})
    for key, members in samples[cut:]:
        parts.write(key, members, key.split("_")[0])
    parts.commit()
    reference = _tarfile_stream(samples)
    assert (tmp_path / "one.tar").read_bytes() == reference == (tmp_path / "parts.tar").read_bytes()
    assert one.record is not None and parts.record is not None
    assert one.record.sha256 == hashlib.sha256(reference).hexdigest() == parts.record.sha256
    assert one.record.bytes == len(reference) and one.record.samples == parts.record.samples == len(samples)
    with tarfile.open(tmp_path / "parts.tar") as tar:  # and it reads back as a tar
        assert len(tar.getnames()) == sum(len(m) for _, m in samples)


def test_an_aborted_shard_leaves_nothing(tmp_path: Path) -> None:
    dest = Destination(str(tmp_path))
    with pytest.raises(RuntimeError), ShardWriter(dest, "x.tar") as writer:
        writer.write("k", {"jpg": b"1", "json": b"{}"}, "s")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
