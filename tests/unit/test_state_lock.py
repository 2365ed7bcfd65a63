"""The output's lock, what ``claim`` keeps or removes, and the inputs' stamps (:mod:`wsishard.builder.state`),
in a local output folder."""

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

from wsishard.builder import state as state_module
from wsishard.builder.stamps import input_stamps
from wsishard.builder.state import BuildState
from wsishard.errors import OptionError
from wsishard.manifest import Manifest, ShardRecord, SlideRecord
from wsishard.storage.output import Destination

DIGEST = "this build"


def _state(out: Path, digest: str = DIGEST, part: tuple[int, int] | None = None) -> BuildState:
    return BuildState(Destination(str(out)), digest, part)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def _put(root: Path, *names: str) -> None:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x")


def _lock_file(out: Path, name: str = "lock.json", **fields: object) -> None:
    lock = {"fingerprint": "another", "part": None, "host": socket.gethostname(), "pid": os.getpid(), "token": "t",
            "started": "2020-01-01T00:00:00+00:00", "refreshed_s": time.time(), **fields}  # fmt: skip
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
    assert _files(tmp_path / "out") == ["sub/lock.json"]  # no temporary file left


# ---- the lock ------------------------------------------------------------------------------------------------


def test_the_lock_names_its_holder_refuses_others_and_goes_away(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _state(out).lock():
        lock = json.loads((out / ".wsishard" / "lock.json").read_text())
        assert (lock["host"], lock["pid"], lock["fingerprint"], lock["part"]) == (socket.gethostname(), os.getpid(),
                                                                                  DIGEST, None)  # fmt: skip
        assert lock["token"] and lock["started"].startswith(time.strftime("%Y-"))
        with pytest.raises(OptionError) as info, _state(out, "another").lock():
            pass
        message = str(info.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and f"started {lock['started']}" in message
        assert "another build (other slides or options)" in message and "lock.json" in message and "\n" not in message
        with pytest.raises(OptionError, match="another run of this build"), _state(out).lock():
            pass
        assert _files(out) == [".wsishard/lock.json"]  # the refused one left nothing
    assert not out.joinpath(".wsishard").exists()  # nothing else was there: the state folder goes too


def test_the_lock_is_released_when_the_block_raises(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt), _state(out).lock():
        _put(out, ".wsishard/build.json")
        raise KeyboardInterrupt
    assert _files(out) == [".wsishard/build.json"]


def test_parts_of_one_build_share_the_output_and_nothing_else_does(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with _state(out, part=(1, 3)).lock(), _state(out, part=(3, 3)).lock():
        for digest, part, holder in [(DIGEST, None, "part 1/3 of this build"), (DIGEST, (2, 4), "part 1/3 of this"),
                                     ("another", (2, 3), "part 1/3 of another build"),
                                     (DIGEST, (3, 3), "part 3/3 of this build")]:  # fmt: skip
            with pytest.raises(OptionError, match=holder), _state(out, digest, part).lock():
                pass
        with _state(out, part=(2, 3)).lock():
            assert sorted(p.name for p in (out / ".wsishard").iterdir()) == [
                f"lock.part-000{i}-of-0003.json" for i in (1, 2, 3)
            ]
    part_one, whole = _state(out, part=(1, 3)), _state(out, "another")
    with part_one.lock(), pytest.raises(OptionError, match="part 1/3 of another build"), whole.lock():
        pass


def test_stale_locks_are_taken_over_and_live_ones_are_not(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "out"
    caplog.set_level(logging.WARNING, logger="wsishard")
    dead = _dead_pid()
    _lock_file(out, pid=dead)  # a crashed build on this host
    _lock_file(out, "lock.part-0001-of-0002.json", host="elsewhere", refreshed_s=time.time() - 2 * 3600)
    (out / ".wsishard" / "lock.part-0002-of-0002.json").write_text("not json")  # a torn write
    with _state(out).lock():
        assert sorted(p.name for p in (out / ".wsishard").iterdir()) == ["lock.json"]
    assert any(f"pid {dead}" in r.getMessage() and "not running any more" in r.getMessage() for r in caplog.records)
    _lock_file(out, host="elsewhere", pid=1, refreshed_s=time.time() - 600)  # another host, re-written lately
    with pytest.raises(OptionError, match="pid 1 on elsewhere"), _state(out).lock():
        pass


def test_refresh_rewrites_the_lock_and_stops_a_build_whose_lock_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    monkeypatch.setattr(state_module, "LOCK_REFRESH_S", 0.0)
    state = _state(out)
    with state.lock():
        before = json.loads((out / ".wsishard" / "lock.json").read_text())
        time.sleep(0.01)
        state.save_failed({})  # recording progress re-writes the lock
        after = json.loads((out / ".wsishard" / "lock.json").read_text())
        assert after["refreshed_s"] > before["refreshed_s"] and after["token"] == before["token"]
        _lock_file(out, host="elsewhere", pid=77)  # taken over by a build that thought this one dead
        with pytest.raises(OptionError, match=r"pid 77 on elsewhere.*took over"):
            state.refresh()
    assert json.loads((out / ".wsishard" / "lock.json").read_text())["pid"] == 77  # theirs is left alone


# ---- claim: what is kept, what is removed ----------------------------------------------------------------------


def test_a_folder_of_other_files_is_refused_or_built_beside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    _put(out, "notes.txt", "qc/notes.txt", "manifest_of_patients.xlsx")
    with pytest.raises(OptionError, match=r"holds 3 files that are not a wsishard build \(manifest_of_patients"):
        _state(out).claim(overwrite=False)
    _state(out).claim(overwrite=True, stamps={"/slides/a.svs": {"size": 1, "mtime_ns": 1}})
    assert _files(out) == [".wsishard/build.json", "manifest_of_patients.xlsx", "notes.txt", "qc/notes.txt"]


@pytest.mark.parametrize("theirs", ["shard-000000.tar", "manifest.json", "manifest.part-0001-of-0002.json", "qc/a.png",
                                    ".shard-000003.tar.tmp-42"])  # fmt: skip
def test_overwrite_never_builds_over_a_file_that_is_not_a_builds(tmp_path: Path, theirs: str) -> None:
    out = tmp_path / "out"
    _put(out, theirs, "notes.txt")
    with pytest.raises(OptionError, match=f"names a build writes \\({theirs}\\)"):
        _state(out).claim(overwrite=True, stamps={"/slides/a.svs": {"size": 1, "mtime_ns": 1}})
    assert _files(out) == sorted([theirs, "notes.txt"])


def test_overwrite_removes_what_the_previous_build_recorded_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "out"
    old = _state(out, "old")
    old.claim(overwrite=False)
    shard = ShardRecord(name="shard-000001.tar", samples=1, bytes=1, sha256="0" * 64)
    manifest = Manifest(options={}, shards=[shard], slides=[SlideRecord(slide_id="s", file="s.svs", status="ok")],
                        extra={"fingerprint": "old", "part": [1, 2]})  # fmt: skip
    (out / "manifest.part-0001-of-0002.json").write_text(manifest.to_json())
    _put(out, ".wsishard/done/shard-000000.tar.json", ".wsishard/scan.json", "shard-000000.tar", "shard-000001.tar",
         ".shard-000002.tar.tmp-7", "qc/s.png", "qc/.s.png.tmp-7", "shard-000009.tar", "manifest.json",
         "qc/annotated.png", "notes.txt", "shard-plan.docx", "manifest_of_patients.xlsx")  # fmt: skip
    (out / ".wsishard" / "scan.json").write_text("[]")
    caplog.set_level(logging.INFO, logger="wsishard")
    _state(out).claim(overwrite=True)
    assert _files(out) == [".wsishard/build.json", "manifest.json", "manifest_of_patients.xlsx", "notes.txt",
                           "qc/annotated.png", "shard-000009.tar", "shard-plan.docx"]  # fmt: skip
    messages = [r.getMessage() for r in caplog.records]
    assert any("removing 2 shards, 1 manifests, 1 QC pictures" in m for m in messages)
    assert any("keeping 1 files named like shards" in m and "shard-000009.tar" in m for m in messages)


def test_a_changed_slide_is_named_and_refused_until_overwrite(tmp_path: Path) -> None:
    out = tmp_path / "out"
    stamps = {"/s/a.svs": {"size": 10, "mtime_ns": 1}, "/s/b.svs": {"size": 20, "mtime_ns": 2}}
    _state(out).claim(overwrite=False, stamps=stamps)
    _put(out, "shard-000000.tar", ".wsishard/done/shard-000000.tar.json")
    _state(out).claim(overwrite=False, stamps=stamps)  # unchanged: resumed
    changed = {**stamps, "/s/b.svs": {"size": 20, "mtime_ns": 3}}
    with pytest.raises(OptionError, match=r"slides changed since this build began \(/s/b\.svs\).*--overwrite"):
        _state(out).claim(overwrite=False, stamps=changed)
    _state(out, part=(1, 2)).claim(overwrite=True, stamps=stamps)  # a part resumes the same, unchanged build
    assert (out / "shard-000000.tar").exists()
    _state(out).claim(overwrite=True, stamps=changed)  # replaced: its shards and state removed
    assert _files(out) == [".wsishard/build.json"]
    assert json.loads((out / ".wsishard" / "build.json").read_text())["inputs"] == changed


def test_input_stamps_follow_size_and_modification_time(tmp_path: Path) -> None:
    a, b = tmp_path / "a.svs", tmp_path / "b.svs"
    a.write_bytes(b"aaaa")
    b.write_bytes(b"bbbb")
    first = input_stamps([str(a), str(b)])
    assert first == input_stamps([str(a), str(b)]) and first[str(a)]["size"] == 4
    os.utime(b, ns=(b.stat().st_atime_ns, b.stat().st_mtime_ns + 10**9))
    second = input_stamps([str(a), str(b)])
    assert second[str(a)] == first[str(a)] and second[str(b)] != first[str(b)]
