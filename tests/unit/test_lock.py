"""The output's lock (:class:`wsishard.builder.run.lock.OutputLock`) and the create-if-absent primitive under it, in a
local output folder."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from buildtools import files_under, put_files

from wsishard.builder.run.lock import OutputLock
from wsishard.builder.run.state import BuildState
from wsishard.errors import OptionError
from wsishard.storage.output import Destination

DIGEST = "this build"


def _lock(out: Path, digest: str = DIGEST, part: tuple[int, int] | None = None) -> OutputLock:
    return OutputLock(Destination(str(out)), digest, part)


def _lock_file(out: Path, name: str = "lock.json", **fields: object) -> None:
    lock = {
        "fingerprint": "another",
        "part": None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "token": "t",
        "started": "2020-01-01T00:00:00+00:00",
        "refreshed_s": time.time(),
        **fields,
    }
    (out / ".wsishard").mkdir(parents=True, exist_ok=True)
    (out / ".wsishard" / name).write_text(json.dumps(lock))


def _dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)


# ---- the create-if-absent primitive ----------------------------------------------------------------------------


def test_create_exclusive_creates_once_and_keeps_the_first_content(tmp_path: Path) -> None:
    dest = Destination(str(tmp_path / "out"))
    assert dest.create_exclusive("sub/lock.json", b"first") is True
    assert dest.create_exclusive("sub/lock.json", b"second") is False
    assert (tmp_path / "out" / "sub" / "lock.json").read_bytes() == b"first"
    assert files_under(tmp_path / "out") == ["sub/lock.json"]  # no temporary file left


# ---- the lock ------------------------------------------------------------------------------------------------


def test_the_lock_names_its_holder_refuses_others_and_goes_away(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _lock(out):
        lock = json.loads((out / ".wsishard" / "lock.json").read_text())
        assert (lock["host"], lock["pid"], lock["fingerprint"], lock["part"]) == (
            socket.gethostname(),
            os.getpid(),
            DIGEST,
            None,
        )
        assert lock["token"] and lock["started"].startswith(time.strftime("%Y-"))
        with pytest.raises(OptionError) as info, _lock(out, "another"):
            pass
        message = str(info.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and f"started {lock['started']}" in message
        assert "another build (other slides or options)" in message and "lock.json" in message and "\n" not in message
        with pytest.raises(OptionError, match="another run of this build"), _lock(out):
            pass
        assert files_under(out) == [".wsishard/lock.json"]  # the refused one left nothing
    assert not out.joinpath(".wsishard").exists()  # nothing else was there: the state folder goes too


def test_the_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), _lock(out):
        put_files(out, ".wsishard/build.json")
        raise KeyboardInterrupt
    assert files_under(out) == [".wsishard/build.json"]


def test_parts_of_one_build_share_the_output_and_nothing_else_does(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _lock(out, part=(1, 3)), _lock(out, part=(3, 3)):
        for digest, part, holder in [
            (DIGEST, None, "part 1/3 of this build"),
            (DIGEST, (2, 4), "part 1/3 of this"),
            ("another", (2, 3), "part 1/3 of another build"),
            (DIGEST, (3, 3), "part 3/3 of this build"),
        ]:
            with pytest.raises(OptionError, match=holder), _lock(out, digest, part):
                pass
        with _lock(out, part=(2, 3)):
            assert sorted(p.name for p in (out / ".wsishard").iterdir()) == [
                f"lock.part-000{i}-of-0003.json" for i in (1, 2, 3)
            ]
    part_one, whole = _lock(out, part=(1, 3)), _lock(out, "another")
    with part_one, pytest.raises(OptionError, match="part 1/3 of another build"), whole:
        pass


def test_stale_locks_are_taken_over_and_live_ones_are_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    caplog.set_level(logging.WARNING, logger="wsishard")
    dead = _dead_pid()
    _lock_file(out, pid=dead)  # a crashed build on this host
    _lock_file(out, "lock.part-0001-of-0002.json", host="elsewhere", refreshed_s=time.time() - 2 * 3600)
    (out / ".wsishard" / "lock.part-0002-of-0002.json").write_text("not json")  # a torn write
    with _lock(out):
        assert sorted(p.name for p in (out / ".wsishard").iterdir()) == ["lock.json"]
    assert any(f"pid {dead}" in r.getMessage() and "not running any more" in r.getMessage() for r in caplog.records)
    _lock_file(out, host="elsewhere", pid=1, refreshed_s=time.time() - 600)  # another host, re-written lately
    with pytest.raises(OptionError, match="pid 1 on elsewhere"), _lock(out):
        pass


def test_refresh_rewrites_the_lock_and_stops_a_build_whose_lock_was_taken(tmp_path: Path) -> None:
    out = tmp_path / "out"
    state = BuildState(Destination(str(out)), DIGEST)
    state.lock = OutputLock(state.dest, DIGEST, refresh_s=0.0)  # re-written at every record
    with state.lock:
        before = json.loads((out / ".wsishard" / "lock.json").read_text())
        (out / ".wsishard" / "lock.json").write_text(json.dumps({**before, "refreshed_s": 0.0}))
        state.save_failed({})  # recording progress re-writes the lock
        after = json.loads((out / ".wsishard" / "lock.json").read_text())
        assert after["refreshed_s"] >= before["refreshed_s"] > 0.0 and after["token"] == before["token"]
        _lock_file(out, host="elsewhere", pid=77)  # taken over by a build that thought this one dead
        with pytest.raises(OptionError, match=r"pid 77 on elsewhere.*took over"):
            state.lock.refresh()
    assert json.loads((out / ".wsishard" / "lock.json").read_text())["pid"] == 77  # theirs is left alone


def test_reading_an_output_whose_build_still_runs_names_the_build(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from wsishard.cli import main
    from wsishard.errors import ManifestError
    from wsishard.storage.opener import load_manifest

    out = tmp_path / "out"
    with _lock(out):
        with pytest.raises(ManifestError) as info:
            load_manifest(str(out))
        message = str(info.value)
        assert f"a build, pid {os.getpid()} on {socket.gethostname()}" in message and "still writing" in message
        assert "is this a wsishard build output" not in message
        assert main(["inspect", str(out)]) != 0
        assert f"pid {os.getpid()}" in capsys.readouterr().err
        from wsishard.streaming.sources import stream

        with pytest.raises(ManifestError, match=f"pid {os.getpid()} on"):
            stream(str(out), batch_size=4)
    _lock_file(out, pid=_dead_pid())  # a build that died: no manifest, and nothing runs
    with pytest.raises(ManifestError, match=r"not found \(is this a wsishard build output\?\)"):
        load_manifest(str(out))
