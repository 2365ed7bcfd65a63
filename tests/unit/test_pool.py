"""The worker pool: results in order, a bounded window, and a worker that dies neither hangs nor loses a task."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

import pytest

from wsishard.builder.run.pool import WorkerPool


def _double_or_die(item: tuple[int, str]) -> int:
    """Doubles the number; kills its own process for the marked item (as the OOM killer would)."""
    value, marker = item
    if marker == "die-when-told":  # dies once the test says so (the caller is busy with an earlier result then)
        deadline = time.monotonic() + 120
        while not os.path.exists(_flag_path(-1)) and time.monotonic() < deadline:
            time.sleep(0.005)
    if marker in ("die", "die-when-told") or (marker == "die-once" and not os.path.exists(_flag_path(value))):
        if marker == "die-once":
            open(_flag_path(value), "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return 2 * value


def _flag_path(value: int) -> str:
    return os.path.join(os.environ["WSISHARD_TEST_FLAGS"], f"died-{value}")


def _crashed(item: tuple[int, str]) -> int:
    return -item[0]


@pytest.fixture(autouse=True)
def _flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WSISHARD_TEST_FLAGS", str(tmp_path))


def test_a_task_that_kills_its_worker_twice_is_handed_to_on_crash_and_the_rest_still_run() -> None:
    items = [(i, "die" if i == 5 else "") for i in range(12)]
    done = threading.Event()
    results: list[int] = []

    def run() -> None:
        with WorkerPool(2) as pool:
            results.extend(pool.imap(_double_or_die, items, on_crash=_crashed))
        done.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert done.wait(120), "the pool hung after a worker died"
    assert results == [-5 if i == 5 else 2 * i for i in range(12)]  # in order, nothing lost


def test_a_worker_that_dies_once_is_retried_and_its_task_kept() -> None:
    items = [(i, "die-once" if i == 3 else "") for i in range(8)]
    with WorkerPool(2) as pool:
        assert list(pool.imap(_double_or_die, items, on_crash=_crashed)) == [2 * i for i in range(8)]


def test_without_on_crash_a_dead_worker_is_a_clear_error() -> None:
    with WorkerPool(2) as pool, pytest.raises(ChildProcessError, match="died twice"):
        list(pool.imap(_double_or_die, [(1, ""), (2, "die")]))


def test_one_job_runs_in_this_process_in_order() -> None:
    with WorkerPool(1) as pool:
        assert list(pool.imap(_double_or_die, [(i, "") for i in range(5)], on_crash=_crashed)) == [0, 2, 4, 6, 8]


def test_a_worker_dying_while_the_caller_is_busy_is_noticed_at_the_next_submit() -> None:
    """The pool breaks between two results; the next item submitted must not take the caller down."""
    items = [(i, "die-when-told" if i == 2 else "") for i in range(10)]
    results = []
    with WorkerPool(2) as pool:
        for result in pool.imap(_double_or_die, items, on_crash=_crashed, window=4):
            if not results:  # busy with the first result until item 2 has killed its worker and the pool broke
                assert pool._executor is not None
                probe = pool._executor.submit(time.sleep, 600)  # failed by the pool when it breaks: no waiting
                open(_flag_path(-1), "w").close()  # item 2 may die now (not before: the first result is in)
                assert isinstance(probe.exception(timeout=120), BrokenProcessPool)
            results.append(result)  # the refill then submits to a broken pool
    assert results == [-2 if i == 2 else 2 * i for i in range(10)]


_AFTER_OPENCV = """
import cv2, numpy as np
from wsishard.builder.run.pool import WorkerPool
from tests_pool_helper import blur
image = np.random.default_rng(0).integers(0, 256, (3000, 3000, 3), dtype=np.uint8)
for _ in range(3):  # OpenCV's thread pool now runs
    cv2.GaussianBlur(image, (5, 5), 0)
threads = cv2.getNumThreads()
with WorkerPool(2) as pool:
    assert list(pool.imap(blur, range(6))) == list(range(6))
assert cv2.getNumThreads() == threads, cv2.getNumThreads()
print("done")
"""


def test_workers_forked_after_the_caller_used_opencv_do_not_hang(tmp_path: Path) -> None:
    """A build called from a process that had used OpenCV's threads (a notebook that looked at a thumbnail): each
    forked worker hung for ever in cv2.setNumThreads. A fresh interpreter, since the bug lies in process state."""
    (tmp_path / "tests_pool_helper.py").write_text(
        "import cv2, numpy as np\n"
        "def blur(i):\n"
        "    cv2.setNumThreads(1)\n"
        "    cv2.GaussianBlur(np.zeros((500, 500, 3), np.uint8), (5, 5), 0)\n"
        "    return i\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _AFTER_OPENCV], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0 and done.stdout.strip() == "done", done.stderr[-2000:]


_INTERRUPTED = """
import sys, threading, time
from wsishard.builder.run.pool import WorkerPool
from tests_pool_helper import nap
if sys.argv[1] == "forkserver":  # another thread running (an fsspec loop, as in an S3 build): a forkserver's workers
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
try:
    with WorkerPool(3) as pool:
        for i in pool.imap(nap, [0.0, 60.0, 60.0], window=3):  # then one busy worker, one or two idle
            print("ready", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
"""


@pytest.mark.parametrize("start", ["fork", "forkserver"])
def test_ctrl_c_ends_the_workers_quietly_and_at_once(tmp_path: Path, start: str) -> None:
    """Ctrl-C reaches every process of the terminal's group: the caller stops, the workers (busy or idle) end
    without a KeyboardInterrupt traceback of their own, and nobody waits for a running task."""
    (tmp_path / "tests_pool_helper.py").write_text("import time\ndef nap(s):\n    time.sleep(s)\n    return s\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(
        [sys.executable, "-c", _INTERRUPTED, start],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(1.0)  # the other workers are running their naps or waiting for work
    os.killpg(proc.pid, signal.SIGINT)
    started = time.monotonic()
    out, err = proc.communicate(timeout=50)
    assert proc.returncode == 130 and out.strip() == "interrupted", err[-2000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
    assert time.monotonic() - started < 30  # not the 60 s nap
