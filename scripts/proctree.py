"""Process-tree polling for the benchmark scripts: peak RSS and CPU time over time per process, and the CPU time the
whole machine spent busy (to tell how much other work competed for the cores)."""

from __future__ import annotations

import subprocess
import threading
import time
from typing import Any

import numpy as np
import psutil

MB = 1024**2


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return list(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


class TreeWatcher(threading.Thread):
    """Polls a process and its descendants every ``interval_s``: peak RSS, and CPU time over time per pid."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval_s = pid, interval_s
        self.peak_rss: dict[int, int] = {}
        self.cpu: dict[int, list[tuple[float, float]]] = {}  # pid -> [(time.monotonic(), CPU seconds)]
        self.parent: dict[int, int] = {}
        self.helpers: set[int] = set()
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            root = psutil.Process(self.pid)
        except psutil.NoSuchProcess:
            return
        while not self._stop_event.is_set():
            try:
                procs = [root, *root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            for proc in procs:
                try:
                    with proc.oneshot():
                        rss, cpu, ppid = proc.memory_info().rss, proc.cpu_times(), proc.ppid()
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
                if proc.pid not in self.parent and "resource_tracker" in " ".join(_cmdline(proc)):
                    self.helpers.add(proc.pid)
                now = time.monotonic()
                self.peak_rss[proc.pid] = max(self.peak_rss.get(proc.pid, 0), rss)
                self.cpu.setdefault(proc.pid, [(now - self.interval_s, 0.0)]).append((now, cpu.user + cpu.system))
                self.parent[proc.pid] = ppid
            self._stop_event.wait(self.interval_s)

    def workers(self) -> list[int]:
        """Pool workers: the leaves below the root (root -> worker when forked, root -> forkserver -> worker
        otherwise; multiprocessing's resource tracker is a leaf too but is left out); no pool: the root."""
        parents = set(self.parent.values())
        found = [p for p in self.parent if p != self.pid and p not in parents and p not in self.helpers]
        return found or [self.pid]

    def cpu_between(self, pids: list[int], a: float, b: float) -> float:
        """CPU seconds ``pids`` used between monotonic times ``a`` and ``b`` (interpolated between polls)."""
        total = 0.0
        for pid in pids:
            t, c = np.array(self.cpu.get(pid, [(0.0, 0.0)])).T
            total += float(np.interp(b, t, c) - np.interp(a, t, c))
        return total

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        self.join()
        workers = self.workers()
        last = {p: s[-1][1] for p, s in self.cpu.items() if p not in self.helpers}
        return {"workers": len(workers), "worker_rss_mb": max(self.peak_rss.get(p, 0) for p in workers) / MB,
                "root_rss_mb": self.peak_rss.get(self.pid, 0) / MB,
                "workers_cpu_s": sum(last.get(p, 0.0) for p in workers), "tree_cpu_s": sum(last.values())}  # fmt: skip


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (every core, every process) since boot."""
    t = psutil.cpu_times()  # Linux: guest time is already in user
    return t.user + t.system + sum(getattr(t, k, 0.0) for k in ("nice", "irq", "softirq", "steal"))


def run_watched(cmd: list[str]) -> tuple[int, str, TreeWatcher, dict[str, Any]]:
    """Run ``cmd`` (stdout captured) under a :class:`TreeWatcher`: exit status, stdout, the watcher, and its figures
    plus ``process_wall_s`` and ``other_load_cores`` (cores other processes of the machine kept busy meanwhile)."""
    busy0, me0, t0 = busy_cpu_s(), psutil.Process().cpu_times(), time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    watcher = TreeWatcher(proc.pid)
    watcher.start()
    out, _ = proc.communicate()
    polled = watcher.stop()
    wall, me1 = time.perf_counter() - t0, psutil.Process().cpu_times()
    mine = polled["tree_cpu_s"] + (me1.user + me1.system) - (me0.user + me0.system)  # the child's tree + the polling
    others = max(0.0, busy_cpu_s() - busy0 - mine) / wall
    return proc.returncode, out, watcher, {**polled, "process_wall_s": wall, "other_load_cores": others}
