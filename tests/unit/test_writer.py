"""Shard writing: byte for byte tarfile's stream layout, and segments made apart concatenate into the same shard; an
aborted write (an error or Ctrl-C mid-write) leaves nothing behind and nothing on stderr, and a full disk is an
``OSError`` that names the file (issue 12, item 8: those run in a fresh interpreter, so that stderr is whole,
interpreter shutdown included)."""

from __future__ import annotations

import hashlib
import io
import os
import random
import subprocess
import sys
import tarfile
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from wsishard.shards import writer
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


_NAMES = ["a", "x" * 96, "x" * 97, "dir/" + "y" * 120, "é" * 48, "é" * 49, "\udcff\udcfe-s", "s_x0_y0"]


def _outcome(make: Callable[..., bytes], *args: Any) -> bytes | None:
    """``make(*args)``, or None where it raises ``ValueError``."""
    try:
        return make(*args)
    except ValueError:  # tarfile's refusal of a name or size USTAR cannot hold
        return None


@pytest.mark.parametrize("key", _NAMES)
def test_headers_are_tarfiles_for_every_name_and_size(key: str) -> None:
    """The header is written without ``TarInfo`` (a tenth of its time): the same bytes for names up to USTAR's 100
    bytes (non-ASCII and undecodable file-name bytes included), longer ones (a prefix field, or tarfile's refusal)
    and sizes at the size field's edges."""
    for size in (0, 1, 511, 512, 513, 70_000):
        samples = [(key, {"jpg": bytes(range(256)) * (size // 256) + bytes(size % 256), "json": b"{}"})]
        mine, reference = _outcome(sample_records, *samples[0]), _outcome(_tarfile_stream, samples)
        if mine is not None and reference is not None:
            # the stream is the records, then two zero blocks, padded with zeros to a multiple of 10240
            assert len(mine) % 512 == 0 and len(reference) == -(-(len(mine) + 1024) // 10240) * 10240
            assert reference[: len(mine)] == mine and not any(reference[len(mine) :])
        else:
            assert mine is None and reference is None, (size, mine, reference)  # both refuse
    for size in (8**11 - 1, 8**11):  # the largest a USTAR size field holds, and one past it (not written out)
        info = tarfile.TarInfo(f"{key}.jpg")
        info.size, info.mtime, info.mode = size, 0, 0o444
        info.uname = info.gname = "wsishard"
        header = _outcome(info.tobuf, tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")
        assert _outcome(writer._header, f"{key}.jpg", size) == header


def test_an_aborted_shard_leaves_nothing(tmp_path: Path) -> None:
    dest = Destination(str(tmp_path))
    with pytest.raises(RuntimeError), ShardWriter(dest, "x.tar") as writer:
        writer.write("k", {"jpg": b"1", "json": b"{}"}, "s")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


# ---- an aborted write, a full disk: in a fresh interpreter --------------------------------------------------


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (cwd ``tmp_path``), stdout and stderr captured."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ),
        timeout=150,
    )


_WRITER = """
    import errno, gc, os, sys
    from wsishard.shards.writer import ShardWriter
    from wsishard.storage.output import Destination

    unraisable = []
    sys.unraisablehook = unraisable.append

    class Failing:
        '''A destination file that raises ``exc`` once ``limit`` bytes were written to it.'''

        def __init__(self, fh, limit, exc):
            self.fh, self.limit, self.exc, self.written = fh, limit, exc, 0

        def write(self, data):
            if self.written + len(data) > self.limit:
                raise self.exc
            self.written += len(data)
            return self.fh.write(data)

        def __getattr__(self, name):
            return getattr(self.fh, name)

    def write_shard(dest, samples=200):
        with ShardWriter(dest, "shard-000000.tar") as writer:
            for i in range(samples):
                writer.write(f"s_x{i}_y0", {"jpg": os.urandom(3000), "json": b"{}"}, "s")
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("exc", ["OSError(errno.ENOSPC, 'No space left on device')", "KeyboardInterrupt()"])
def test_an_aborted_shard_write_leaves_no_file_and_prints_nothing(tmp_path: Path, exc: str) -> None:
    run = _python(
        _WRITER
        + f"""
    dest = Destination("out")
    real = dest.open_atomic
    def failing(name):
        out = real(name)
        out.fh = Failing(out.fh, 50_000, {exc})
        return out
    dest.open_atomic = failing
    try:
        write_shard(dest)
    except BaseException as e:
        print(type(e).__name__)
    gc.collect()
    print(sorted(os.listdir("out")), len(unraisable))
    """,
        tmp_path,
    )
    want = "OSError" if exc.startswith("OSError") else "KeyboardInterrupt"
    assert (run.returncode, run.stdout.splitlines(), run.stderr) == (0, [want, "[] 0"], "")


@pytest.mark.timeout(180)
def test_a_full_disk_names_the_shard_file(tmp_path: Path) -> None:
    run = _python(
        _WRITER
        + """
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG from write() instead of a signal (as `ulimit -f` does)
    os.makedirs("out")
    resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    try:
        write_shard(Destination("out"))
    except OSError as e:
        print(type(e).__name__, e.errno, e, sep="|")
    gc.collect()
    print(sorted(os.listdir("out")), len(unraisable))
    """,
        tmp_path,
    )
    assert run.returncode == 0 and run.stderr == "", run.stderr
    kind, code, message = run.stdout.splitlines()[0].split("|")
    assert (kind, int(code)) == ("OSError", 27) and "File too large" in message
    assert os.path.join("out", "shard-000000.tar") in message  # the file, not just the errno
    assert run.stdout.splitlines()[1] == "[] 0"  # the temporary file is gone
