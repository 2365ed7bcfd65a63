"""Who holds a build output: the live lock files in its state folder, read for a message only.

The build's lock (:mod:`wsishard.builder.run.lock`) writes ``STATE_DIR/lock.*.json`` and decides with :func:`live`
whether a holder may still run; a reader that finds no manifest asks :func:`running_builds` why. Both sides use
this module, which knows nothing of the builder or of :class:`~wsishard.storage.output.Destination` (the opener
reads manifests below both).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Mapping
from typing import Any

import fsspec

from wsishard import format as fmt
from wsishard.storage.urls import StorageOptions, join

LOCK_LEASE_S = 3600.0  # another host's lock not re-written for this long is stale


def where(holder: Mapping[str, Any]) -> str:
    """A lock's holder in words: ``pid 12 on host, started ...``."""
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {holder.get('started')}"


def live(holder: Mapping[str, Any]) -> bool:
    """Whether a lock's holder may run: its process exists (same host; a pid reused since keeps the lock, and the
    refusal says how to remove it), or it re-wrote the lock less than ``LOCK_LEASE_S`` ago (another host)."""
    pid, refreshed = holder.get("pid"), holder.get("refreshed_s")
    if holder.get("host") != socket.gethostname():
        return isinstance(refreshed, int | float) and time.time() - refreshed < LOCK_LEASE_S
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def running_builds(root: str, storage_options: StorageOptions | None = None) -> list[str]:
    """The builds (or parts) that hold a live lock on the output at ``root``, in words (``a build, pid 12 on host,
    started ...``): why an output has no manifest yet. Unreadable or stale locks are left out; an unreadable state
    folder gives none."""
    found: list[str] = []
    try:
        fs, folder = fsspec.core.url_to_fs(join(root, fmt.STATE_DIR), **dict(storage_options or {}))
        names = sorted(str(p).rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False))
    except (OSError, ValueError):
        return found
    for name in names:
        if not (name.startswith("lock.") and name.endswith(".json")):
            continue
        with contextlib.suppress(ValueError, OSError):
            holder = json.loads(fs.cat_file(f"{folder}/{name}") or b"null")
            if isinstance(holder, dict) and live(holder):
                part = holder.get("part")
                build = (
                    f"part {part[0]}/{part[1]} of a build" if isinstance(part, list) and len(part) == 2 else "a build"
                )
                found.append(f"{build}, {where(holder)}")
    return found
