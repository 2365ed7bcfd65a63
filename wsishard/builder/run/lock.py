"""The cross-host lock of a build's output: who writes it, held while the build runs.

The lock is a small JSON file in the build's state folder (``.wsishard/lock.json``, or
``.wsishard/lock.part-0002-of-0008.json`` for a part of a cluster build) created only if absent
(:meth:`Destination.create_exclusive`: ``O_EXCL`` locally, a conditional PUT on object storage) and read back. It
names its holder (host, pid, start time, the build's fingerprint and part) so that a refusal can say who holds the
output. A lock whose process is gone (same host), or that was not re-written for ``LOCK_LEASE_S`` (another host), is
stale and taken over with a warning; parts of one build do not block each other.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from wsishard import format as fmt
from wsishard.errors import OptionError
from wsishard.storage.holders import LOCK_LEASE_S as LOCK_LEASE_S
from wsishard.storage.holders import live as _live
from wsishard.storage.holders import where as _where
from wsishard.storage.output import Destination
from wsishard.storage.secrets import describe

logger = logging.getLogger(__name__)

LOCK_REFRESH_S = 120.0  # a running build re-writes its lock at most this often, when it records progress


class OutputLock:
    """The lock of one build (or part) on its output, as a context manager: held inside the ``with`` block, released
    when it ends, also on errors and interrupts.

    Args:
        dest: the output.
        digest: the build's fingerprint; locks of the same fingerprint are "this build".
        part: ``(i, n)`` for part i of n of a cluster build, None for a whole build.
        refresh_s: :meth:`refresh` re-writes the lock at most this often (seconds).

    Raises:
        OptionError: on entering, when another live build (or a whole build, for a part) holds the output; from
            :meth:`refresh`, when another build took the lock over. Each is one line naming the holder.
    """

    def __init__(
        self,
        dest: Destination,
        digest: str,
        part: tuple[int, int] | None = None,
        *,
        refresh_s: float = LOCK_REFRESH_S,
    ) -> None:
        self.dest, self.digest, self.part, self.refresh_s = dest, digest, part, refresh_s
        self.name = "lock.json" if part is None else f"lock.{fmt.part_label(part)}.json"
        self.siblings: list[dict[str, Any]] = []  # live locks of this build's other parts, while held
        self._held: dict[str, Any] | None = None  # our lock while we hold it

    def __enter__(self) -> OutputLock:
        self._acquire()
        try:
            self.siblings = self._others()
        except BaseException:
            self._release()
            raise
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._release()

    def refresh(self) -> None:
        """Re-write the lock (at most every ``refresh_s``) so that other hosts see this build is alive; nothing when
        the lock is not held.

        Raises:
            OptionError: another build took the lock over, thinking this one dead: this one stops rather than mix.
        """
        if self._held is None or time.time() - self._held["refreshed_s"] < self.refresh_s:
            return
        current = self._read(self.name)
        if current is not None and current.get("token") != self._held["token"]:
            raise OptionError(
                f"{self.dest.location}: {who(current, self.digest)}, took over the lock of this "
                "build; this build stops so that the two do not mix"
            )
        self._held["refreshed_s"] = time.time()
        self.dest.write_bytes(self._path(self.name), json.dumps(self._held).encode())

    def refreshing(self, progress: Callable[[Any], None]) -> Callable[[Any], None]:
        """``progress`` that also refreshes the lock, for long phases that record nothing (scanning)."""

        def report(event: Any) -> None:
            self.refresh()
            progress(event)

        return report

    def _path(self, name: str) -> str:
        return f"{fmt.STATE_DIR}/{name}"

    def _acquire(self) -> None:
        now = time.time()
        mine = {
            "fingerprint": self.digest,
            "part": self.part and list(self.part),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "token": secrets.token_hex(8),
            "refreshed_s": now,
            "started": datetime.datetime.fromtimestamp(now).astimezone().isoformat(timespec="seconds"),
        }
        for _ in range(3):
            created = self.dest.create_exclusive(self._path(self.name), json.dumps(mine).encode())
            holder = self._read(self.name)
            if created and holder is not None and holder.get("token") == mine["token"]:
                self._held = mine
                return
            if holder is not None and _live(holder):
                raise OptionError(self._held_by(self.name, holder))
            self._remove(self.name, holder, stale=True)
        raise OptionError(f"{self.dest.location}: could not take {self._path(self.name)}: others keep taking it")

    def _others(self) -> list[dict[str, Any]]:
        """The live locks of this build's other parts (stale locks are removed; any other live lock is refused)."""
        siblings = []
        for name in self.dest.listdir(fmt.STATE_DIR):
            if not name.startswith("lock.") or name == self.name or (holder := self._read(name)) is None:
                continue
            part = holder.get("part")
            if not _live(holder):
                self._remove(name, holder, stale=True)
            elif holder.get("fingerprint") != self.digest or not part or not self.part or part[1] != self.part[1]:
                raise OptionError(self._held_by(name, holder))
            else:
                siblings.append(holder)
        return siblings

    def _release(self) -> None:
        held, self._held, self.siblings = self._held, None, []
        try:
            self._remove(self.name, held)
            if not self.dest.remote:  # a refused claim leaves nothing behind in a folder that held no build
                with contextlib.suppress(OSError):
                    os.rmdir(self.dest.path(fmt.STATE_DIR))
        except OSError as exc:  # never hide the error the build ends with
            text = describe(exc, self.dest.storage_options)  # a store's error may quote a signed URL or a key
            logger.warning("%s: could not remove the lock %s: %s", self.dest.location, self.name, text)

    def _remove(self, name: str, holder: dict[str, Any] | None, *, stale: bool = False) -> None:
        """Remove a lock unless it changed since ``holder`` was read from it; a ``stale`` one with a warning."""
        if holder is None:
            return
        if stale:
            logger.warning(
                "%s: taking over the lock of %s: it is not running any more",
                self.dest.location,
                who(holder, self.digest),
            )
        current = self._read(name)
        if current is not None and current.get("token") == holder.get("token"):
            if self.dest.remote:
                self.dest.fs.invalidate_cache(self.dest.path(self._path(name)))
            self.dest.remove(self._path(name))

    def _read(self, name: str) -> dict[str, Any] | None:
        """A lock's content: None when there is none, ``{}`` (stale) when it is not one."""
        with contextlib.suppress(ValueError):
            holder = json.loads(self.dest.read_bytes(self._path(name)) or b"null")
            return holder if holder is None or isinstance(holder, dict) else {}
        return {}

    def _held_by(self, name: str, holder: dict[str, Any]) -> str:
        return (
            f"{self.dest.location} is being written by {who(holder, self.digest)}; wait for it to end, or "
            f"remove {self.dest.path(self._path(name))} if it is not running any more"
        )


def who(holder: Mapping[str, Any], digest: str) -> str:
    """The holder of a lock in words, relative to the build of fingerprint ``digest``."""
    same, part = holder.get("fingerprint") == digest, holder.get("part")
    build = "this build" if same else "another build (other slides or options)"
    holder_is = f"part {part[0]}/{part[1]} of {build}" if part else "another run of this build" if same else build
    return f"{holder_is}, {_where(holder)}"
