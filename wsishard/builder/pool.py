"""The build's worker processes: a forkserver pool, or plain in-process calls for one job."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from wsishard.slide.cache import close_readers

T = TypeVar("T")
R = TypeVar("R")


class WorkerPool:
    """A process pool of ``jobs`` workers, or plain in-process calls for ``jobs == 1``.

    A single-threaded caller on Linux forks its workers directly: they start at once with every module already
    imported. A caller running other threads (an fsspec I/O loop, a server in tests, a training loop) gets workers
    from a forkserver instead, since forking a multi-threaded process can deadlock on a lock another thread held;
    the forkserver keeps the environment it started with, so each of its workers takes on the caller's current
    environment (credentials and endpoints set later included).
    """

    def __init__(self, jobs: int) -> None:
        self._pool = None
        if jobs > 1 and _fork_is_safe():
            self._pool = mp.get_context("fork").Pool(jobs)
        elif jobs > 1:
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload(["wsishard.builder.scan", "wsishard.builder.extract"])
            self._pool = ctx.Pool(jobs, initializer=_take_environment, initargs=(dict(os.environ),))

    def imap(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return self._pool.imap(fn, items) if self._pool else map(fn, items)

    def imap_unordered(self, fn: Callable[[T], R], items: Iterable[T]) -> Iterator[R]:
        return self._pool.imap_unordered(fn, items) if self._pool else map(fn, items)

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.terminate() if exc[0] else self._pool.close()
            self._pool.join()
        close_readers()


def _fork_is_safe() -> bool:
    """Forking copies only the calling thread: safe when there is no other thread whose locks it could copy."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def _take_environment(environ: dict[str, str]) -> None:
    os.environ.clear()
    os.environ.update(environ)
