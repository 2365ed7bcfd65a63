"""The build's worker processes: a process pool that notices a dead worker, or plain in-process calls for one job.

``multiprocessing.Pool`` silently replaces a worker that dies (an out-of-memory kill on a huge slide) and loses its
task, so the build would wait for ever. :class:`WorkerPool` runs on ``concurrent.futures.ProcessPoolExecutor``,
which reports the death (``BrokenProcessPool``): the tasks in flight are run again one at a time on a fresh pool,
and a task that kills its worker again, alone, is handed to the caller's ``on_crash`` instead of being run.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing as mp
import os
import select
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import forkserver
from typing import Any, TypeVar

import cv2

from wsishard.slide.cache import close_readers

logger = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")
_END: Any = object()
_PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends
_WATCH_S = 1.0  # how often a worker with neither that signal nor a pidfd looks whether the caller is still there


class WorkerPool:
    """A process pool of ``jobs`` workers, or plain in-process calls for ``jobs == 1``.

    A single-threaded caller on Linux forks its workers directly: they start at once with every module already
    imported. A caller running other threads (an fsspec I/O loop, a server in tests, a training loop) gets workers
    from a forkserver instead, since forking a multi-threaded process can deadlock on a lock another thread held;
    the forkserver keeps the environment it started with, so each of its workers takes on the caller's current
    environment (credentials and endpoints set later included).
    """

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self._before = set(mp.active_children())  # processes that are not this pool's workers
        self._cv2_threads = cv2.getNumThreads()
        # One job is one core; with workers, forked ones must not inherit OpenCV's thread pool: a worker forked while
        # the pool's threads ran (the caller used OpenCV before) hung for ever in its first cv2.setNumThreads.
        # Set to 1 here, that pool is wound down before any fork (restored on exit).
        cv2.setNumThreads(1)
        self._executor: ProcessPoolExecutor | None = _executor(jobs) if jobs > 1 else None

    def imap(
        self,
        fn: Callable[[T], R],
        items: Iterable[T],
        *,
        on_crash: Callable[[T], R] | None = None,
        window: int | None = None,
    ) -> Iterator[R]:
        """``fn(item)`` for each item, in order, with at most ``window`` (default ``2 * jobs``) in flight.

        Args:
            on_crash: the result for an item whose task killed its worker process twice (the second time alone
                on a fresh pool); with one job, tasks run in this process and a crash is the caller's.

        Raises:
            Whatever ``fn`` raises, from the item that raised it.
            ChildProcessError: a task killed its worker twice and there is no ``on_crash``.
        """
        if self._executor is None:
            yield from map(fn, items)
            return
        source, pending = iter(items), deque[tuple[T, Future[R] | None]]()
        while True:
            while len(pending) < (window or 2 * self.jobs) and (item := next(source, _END)) is not _END:
                pending.append((item, self._try_submit(fn, item)))
            if not pending:
                return
            item, future = pending.popleft()
            try:
                if future is None:  # the pool had already broken when this item came to be submitted
                    raise BrokenProcessPool("a worker process died")
                yield future.result()
            except BrokenProcessPool:
                suspects = [item, *(it for it, _ in pending)]
                pending.clear()
                logger.warning(
                    "a worker process died; running its %d tasks in flight again, one at a time", len(suspects)
                )
                self._restart()
                for suspect in suspects:
                    yield self._alone(fn, suspect, on_crash)

    def _submit(self, fn: Callable[[T], R], item: T) -> Future[R]:
        assert self._executor is not None
        return self._executor.submit(fn, item)

    def _try_submit(self, fn: Callable[[T], R], item: T) -> Future[R] | None:
        """The item's future, or None when the pool has broken (a worker died since the last result)."""
        try:
            return self._submit(fn, item)
        except BrokenProcessPool:
            return None

    def _alone(self, fn: Callable[[T], R], item: T, on_crash: Callable[[T], R] | None) -> R:
        """``fn(item)`` as the only task in flight; ``on_crash(item)`` if it kills its worker."""
        try:
            return self._submit(fn, item).result()
        except BrokenProcessPool as exc:
            self._restart()
            if on_crash is None:
                raise ChildProcessError(f"a worker process died twice running {item!r}") from exc
            logger.warning("a task killed its worker process twice; recording it as failed")
            return on_crash(item)

    def _restart(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._executor = _executor(self.jobs)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._executor is not None and exc[0] is KeyboardInterrupt:
            # Ctrl-C: the workers ignore it (the caller answers for them); end them rather than wait for their tasks
            for proc in set(mp.active_children()) - self._before:
                proc.terminate()
        if self._executor is not None:
            self._executor.shutdown(wait=True, cancel_futures=exc[0] is not None)
        cv2.setNumThreads(self._cv2_threads)
        close_readers()


def _executor(jobs: int) -> ProcessPoolExecutor:
    if _fork_is_safe():
        return ProcessPoolExecutor(
            jobs, mp_context=mp.get_context("fork"), initializer=_start_worker, initargs=(None, os.getpid())
        )
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["wsishard.builder.scan.scan", "wsishard.builder.extract.extract"])
    _start_forkserver_deaf()
    return ProcessPoolExecutor(
        jobs, mp_context=ctx, initializer=_start_worker, initargs=(dict(os.environ), os.getpid())
    )


def _start_forkserver_deaf() -> None:
    """Start the forkserver (if it is not running) with SIGINT blocked, which it and every worker it forks inherit:
    a Ctrl-C while it imports its preloaded modules printed a KeyboardInterrupt traceback of its own. Only the main
    thread can tell; a SIGINT that arrives meanwhile is delivered to this process once unblocked."""
    if threading.current_thread() is not threading.main_thread():
        forkserver.ensure_running()
        return
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _fork_is_safe() -> bool:
    """Forking copies only the calling thread: safe when there is no other thread whose locks it could copy."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _start_worker(environ: dict[str, str] | None, caller: int) -> None:
    """A worker is one core: OpenCV's own threads would compete with the other workers. A forkserver's worker
    takes on the caller's ``environ``. A worker ends when the ``caller`` (the build's process) ends. It ignores
    Ctrl-C, which the terminal sends to every process of the group: the caller stops the build and its workers."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _end_with(caller)
    cv2.setNumThreads(1)
    if environ is not None:
        os.environ.clear()
        os.environ.update(environ)


def _end_with(caller: int) -> None:
    """End this worker when the process ``caller`` ends, however it ends (SIGKILL included), instead of going on
    as an orphan holding its memory and its slides open.

    A worker forked by the caller on Linux asks the kernel for SIGKILL when its parent ends (``PR_SET_PDEATHSIG``).
    A forkserver's worker cannot: its parent is the forkserver, which outlives the caller for as long as a worker
    holds its pipe open. It (and any worker where the signal is not to be had) runs a thread that waits for the
    caller to end, on a pidfd where Linux has them, else looking every :data:`_WATCH_S`.
    """
    if os.getppid() == caller and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != caller:  # it ended before the signal was asked for
                    os._exit(1)
                return
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(caller)  # type: ignore[attr-defined,unused-ignore]  # Linux 5.3+
    if pidfd is None and not _running(caller):
        os._exit(1)
    threading.Thread(target=_watch, args=(caller, pidfd), name="wsishard-caller-watch", daemon=True).start()


def _watch(caller: int, pidfd: int | None) -> None:
    """Wait for the process ``caller`` to end (its ``pidfd`` becomes readable then), and end this process."""
    if pidfd is not None:
        select.select([pidfd], [], [])
    else:
        while _running(caller):
            time.sleep(_WATCH_S)
    os._exit(1)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: it exists
        pass
    return True
