"""Noise and bare errors (issue 12, item 8): a clean S3 stream with DataLoader workers prints nothing; an aborted
shard write (an error or Ctrl-C mid-write) leaves nothing behind and nothing on stderr; a full disk is an
``OSError`` that names the file. Each case runs in a subprocess, so that stderr is whole, interpreter shutdown
included."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import shardmaker as sm

if TYPE_CHECKING:  # imported by pytest_plugins below, with assertion rewriting
    from servers import S3Server

pytest_plugins = ("servers",)
pytestmark = pytest.mark.timeout(180)


def _python(code: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (cwd ``tmp_path``), stdout and stderr captured."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=tmp_path, env=dict(os.environ), timeout=150)  # fmt: skip


def test_an_s3_stream_with_two_workers_prints_nothing(s3: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    out = sm.make_output(str(tmp_path / "out"), (10, 7, 12, 5))
    url = f"s3://{s3_bucket}/out"
    s3.upload(out.root, url)
    run = _python(f"""
        from wsishard.streaming.sources import stream
        from wsishard.streaming.loader import loader
        ds = stream({url!r}, batch_size=4, resampled=False, drop_last=False, shuffle=8, seed=0,
                    storage_options={s3.storage_options!r})
        for epoch in range(2):
            print(sum(len(b["key"]) for b in loader(ds, num_workers=2)))
        """, tmp_path)  # fmt: skip
    assert (run.returncode, run.stdout.split(), run.stderr) == (0, ["34", "34"], "")


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


@pytest.mark.parametrize("exc", ["OSError(errno.ENOSPC, 'No space left on device')", "KeyboardInterrupt()"])
def test_an_aborted_shard_write_leaves_no_file_and_prints_nothing(tmp_path: Path, exc: str) -> None:
    run = _python(_WRITER + f"""
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
    """, tmp_path)  # fmt: skip
    want = "OSError" if exc.startswith("OSError") else "KeyboardInterrupt"
    assert (run.returncode, run.stdout.splitlines(), run.stderr) == (0, [want, "[] 0"], "")


def test_a_full_disk_names_the_shard_file(tmp_path: Path) -> None:
    run = _python(_WRITER + """
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
    """, tmp_path)  # fmt: skip
    assert run.returncode == 0 and run.stderr == "", run.stderr
    kind, code, message = run.stdout.splitlines()[0].split("|")
    assert (kind, int(code)) == ("OSError", 27) and "File too large" in message
    assert os.path.join("out", "shard-000000.tar") in message  # the file, not just the errno
    assert run.stdout.splitlines()[1] == "[] 0"  # the temporary file is gone
