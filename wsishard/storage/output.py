"""Where a build writes: a local folder or an fsspec URL prefix (``s3://bucket/prefix``, ...).

Every write is atomic. Locally a file is written under a temporary name and renamed. On S3 the object is uploaded
under its final key and S3 makes it visible only when the upload completes; an aborted upload is discarded
(multipart uploads are aborted), so no partial object is ever listed. Other fsspec stores get a temporary key
and a move. Credentials come from ``storage_options`` and the standard AWS sources and are never logged.

A :class:`Destination` pickles (location and options only; the filesystem is made lazily in each process).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Mapping
from typing import IO, Any

import fsspec

from wsishard.errors import OutputError
from wsishard.format import temp_name
from wsishard.storage.opener import list_names
from wsishard.storage.retry import RetryPolicy, call_with_retries
from wsishard.storage.secrets import redact, refuse_url_credentials
from wsishard.storage.urls import is_url, local_path

_UPLOAD_BLOCK_BYTES = 16 * 2**20
_DIRECT_UPLOAD_PROTOCOLS = ("s3", "s3a")  # stores that show an object only when its upload completes


class AtomicFile:
    """A file being written: :meth:`commit` makes it visible under its final name, :meth:`abort` drops it.

    An ``OSError`` from writing or committing (a full disk, ``ulimit -f``, a failed upload) names the file in
    its ``filename``: ``[Errno 28] No space left on device: 'out/shard-000003.tar'`` (same errno, same ``OSError``
    subclass, chained to the original).

    Args:
        name: the file's final path or URL (credentials redacted), as errors show it.
    """

    def __init__(self, fh: IO[bytes], commit: Any, abort: Any, name: str = "") -> None:
        self.fh = fh
        self.name = name
        self._commit = commit
        self._abort = abort

    def write(self, data: bytes) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            raise _named(exc, self.name) from exc

    def flush(self) -> None:
        try:
            self.fh.flush()
        except OSError as exc:
            raise _named(exc, self.name) from exc

    def commit(self) -> None:
        try:
            self._commit()
        except OSError as exc:
            raise _named(exc, self.name) from exc

    def abort(self) -> None:
        self._abort()


def _named(exc: OSError, name: str) -> OSError:
    """``exc`` with ``name`` as its ``filename`` (``exc`` itself when it names a file already)."""
    if not name or exc.filename is not None:
        return exc
    if exc.errno is None:  # no errno (an upload's error): the name leads the message
        named = OSError(f"{name}: {exc}")
        named.filename = name
        return named
    return OSError(exc.errno, exc.strerror or str(exc), name)  # the errno's OSError subclass


class Destination:
    """A build output location.

    Args:
        location: local folder, ``file://`` path, or fsspec URL prefix.
        storage_options: fsspec options for URLs (``endpoint_url``, ``key``, ...); never logged or stored.
    """

    def __init__(self, location: str, storage_options: Mapping[str, Any] | None = None) -> None:
        refuse_url_credentials(location)
        self.location = location.rstrip("/") or location
        self.storage_options = dict(storage_options or {})
        self.remote = is_url(location)
        self._fs: Any = None

    def __repr__(self) -> str:  # never shows storage options
        return f"Destination({self.location!r})"

    def __getstate__(self) -> dict[str, Any]:
        return {"location": self.location, "storage_options": self.storage_options, "remote": self.remote}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _fs=None)

    @property
    def fs(self) -> Any:
        if self._fs is None:
            self._fs, _ = fsspec.core.url_to_fs(self.location, **self.storage_options)
        return self._fs

    def path(self, name: str) -> str:
        """The full path or URL of ``name`` (relative, ``/``-separated)."""
        if self.remote:
            return f"{self.location}/{name}"
        return os.path.join(local_path(self.location), *name.split("/"))

    def makedirs(self, name: str = "") -> None:
        if not self.remote:
            os.makedirs(self.path(name) if name else self.path(""), exist_ok=True)

    def exists(self, name: str) -> bool:
        return bool(self.fs.exists(self.path(name))) if self.remote else os.path.exists(self.path(name))

    def read_bytes(self, name: str) -> bytes | None:
        """The content of ``name``, or None when it does not exist."""
        try:
            if self.remote:
                data: bytes = self.fs.cat_file(self.path(name))
                return data
            with open(self.path(name), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def write_bytes(self, name: str, data: bytes) -> None:
        """Write ``name`` atomically."""
        out = self.open_atomic(name)
        try:
            out.write(data)
        except BaseException:
            out.abort()
            raise
        out.commit()

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` if it does not exist yet: True if this call created it, False if it existed.

        Locally a complete temporary file is hard-linked to the name (atomic, also on NFS; ``O_CREAT | O_EXCL``
        where the file system has no hard links). On S3 a conditional PUT (``If-None-Match: *``, which AWS and moto
        honour) after a fresh existence check (for S3-compatible stores that ignore the header). Other fsspec stores
        have no such primitive: there it is the existence check and an atomic write, so two callers racing within
        one round trip may both get True; callers that need certainty read the object back.
        """
        final = self.path(name)
        if self.remote:
            self.fs.invalidate_cache(final)  # what this process listed earlier may be gone or new
            if self.fs.exists(final):
                return False
            protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
            if not set(protocols) & set(_DIRECT_UPLOAD_PROTOCOLS):
                self.write_bytes(name, data)
                return True
            try:
                self.fs.pipe_file(final, data, mode="create")
            except FileExistsError:
                return False
            except FileNotFoundError as exc:  # an object store's PUT needs no folder: the bucket is missing
                raise self._no_bucket(exc) from exc
            return True
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        head, base = os.path.split(final)
        tmp = os.path.join(head, temp_name(base, os.getpid()))
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            return _link_exclusive(tmp, final, data)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def _no_bucket(self, exc: OSError) -> OutputError:
        """The error of a write that found no bucket, naming it (s3fs says only "The specified bucket does not
        exist")."""
        bucket = self.location.split("://", 1)[-1].split("/", 1)[0]
        return OutputError(
            self.location, f"the bucket {bucket!r} does not exist ({exc}); create it, or check the output URL"
        )

    def remove(self, name: str) -> None:
        """Delete ``name`` if it exists."""
        if self.remote:
            if self.fs.exists(self.path(name)):
                self.fs.rm(self.path(name), recursive=True)
        elif os.path.isdir(self.path(name)):
            shutil.rmtree(self.path(name))
        elif os.path.exists(self.path(name)):
            os.remove(self.path(name))

    def listdir(self, name: str = "") -> list[str]:
        """Names (not paths) directly under ``name``; empty when it does not exist."""
        try:
            return list_names(self.path(name) if name else self.location, self.storage_options, files_only=False)
        except FileNotFoundError:
            return []

    def file_stats(self, name: str = "") -> dict[str, tuple[int, int | None]]:
        """``{name: (bytes, modification time in ns)}`` of the files directly under ``name``, from a fresh listing
        (the time: None where the store gives none); empty when ``name`` does not exist."""
        if not self.remote:
            try:
                with os.scandir(self.path(name) if name else self.path("")) as entries:
                    return {e.name: (st.st_size, st.st_mtime_ns) for e in entries if e.is_file() for st in (e.stat(),)}
            except FileNotFoundError:
                return {}
        folder = self.path(name) if name else self.location
        fs_path = fsspec.core.url_to_fs(folder, **self.storage_options)[1]

        def listing() -> list[dict[str, Any]]:
            self.fs.invalidate_cache(fs_path)
            found: list[dict[str, Any]] = self.fs.ls(fs_path, detail=True)
            return found

        try:
            listed = call_with_retries(
                listing, f"{folder} (listing)", policy=RetryPolicy(), storage_options=self.storage_options
            )
        except FileNotFoundError:
            return {}
        return {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]: (int(e.get("size") or 0), None)
            for e in listed
            if e.get("type") != "directory"
        }

    def open_atomic(self, name: str) -> AtomicFile:
        """Open ``name`` for writing; it appears only on :meth:`AtomicFile.commit`."""
        final = self.path(name)
        if not self.remote:
            os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
            head, base = os.path.split(final)
            tmp = os.path.join(head, temp_name(base, os.getpid()))
            fh = open(tmp, "wb")  # noqa: SIM115 - closed by commit/abort
            return AtomicFile(fh, lambda: _commit_local(fh, tmp, final), lambda: _abort_local(fh, tmp), final)
        shown = redact(final, self.storage_options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        if set(protocols) & set(_DIRECT_UPLOAD_PROTOCOLS):
            fh = self.fs.open(final, "wb", block_size=_UPLOAD_BLOCK_BYTES)
            return AtomicFile(fh, fh.close, lambda: _discard(fh), shown)
        tmp = f"{os.path.dirname(final)}/{temp_name(os.path.basename(final), os.getpid())}"
        fh = self.fs.open(tmp, "wb")
        return AtomicFile(
            fh, lambda: (fh.close(), self.fs.mv(tmp, final)), lambda: _abort_remote(self.fs, fh, tmp), shown
        )


def _commit_local(fh: IO[bytes], tmp: str, final: str) -> None:
    fh.flush()
    os.fsync(fh.fileno())
    fh.close()
    os.replace(tmp, final)


def _link_exclusive(tmp: str, final: str, data: bytes) -> bool:
    """Give the complete file ``tmp`` the name ``final`` unless that exists (``O_EXCL`` without hard links)."""
    try:
        os.link(tmp, final)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
    try:
        fd = os.open(final, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return True


def _abort_local(fh: IO[bytes], tmp: str) -> None:
    try:
        with contextlib.suppress(OSError):  # flushing what is being dropped failed (the disk is full): no matter
            fh.close()
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _discard(fh: Any) -> None:
    """Drop an S3 upload in flight: abort its multipart upload; nothing becomes visible."""
    fh.discard()
    fh.closed = True


def _abort_remote(fs: Any, fh: Any, tmp: str) -> None:
    try:
        fh.close()
    finally:
        if fs.exists(tmp):
            fs.rm(tmp)
