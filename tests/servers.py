"""Real storage servers on 127.0.0.1 for tests: moto's S3 server and a plain HTTP file server with faults.

Use the fixtures from a test module with ``pytest_plugins = ("servers",)``, or the classes directly:

- ``s3`` (session): a :class:`S3Server` (moto, fake credentials in the environment for the session);
  ``s3.new_bucket()`` gives a fresh bucket, ``s3.upload(folder, url)`` copies a build output there.
- ``s3_bucket``: a fresh bucket name per test.
- ``http_serve``: ``http_serve(folder) -> HttpServer`` serving ``folder`` until the test ends; its ``faults``
  make chosen requests fail (HTTP status, or a connection dropped mid-body) and its ``log`` lists requests.

Nothing here reaches beyond 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import http.server
import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

HOST = "127.0.0.1"
FAKE_KEY, FAKE_SECRET = "testing", "testing"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


# ---- S3 (moto) -----------------------------------------------------------------------------------------


@dataclass
class S3Server:
    """A running moto S3 server.

    Attributes:
        endpoint_url: ``http://127.0.0.1:<port>``.
        storage_options: fsspec/s3fs options reaching it (credentials come from the environment).
    """

    endpoint_url: str
    storage_options: dict[str, Any]

    def fs(self) -> Any:
        """An ``s3fs.S3FileSystem`` on this server (fsspec's instance cache makes it cheap)."""
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options)

    def new_bucket(self, prefix: str = "wsishard") -> str:
        """Create a bucket with a fresh name and return the name."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name

    def upload(self, folder: str, url: str) -> None:
        """Copy the files directly in ``folder`` to the prefix ``url`` (``s3://bucket/prefix``)."""
        fs = self.fs()
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if os.path.isfile(path):
                fs.put_file(path, f"{url.rstrip('/')}/{name}")
        fs.invalidate_cache()


def aws_test_env(mp: pytest.MonkeyPatch) -> None:
    """Fake AWS credentials in the environment; no profile, config file or instance metadata lookups."""
    for name in (
        "AWS_PROFILE",
        "AWS_DEFAULT_PROFILE",
        "AWS_SESSION_TOKEN",
        "AWS_SECURITY_TOKEN",
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
    ):
        mp.delenv(name, raising=False)
    mp.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY)
    mp.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
    mp.setenv("AWS_CONFIG_FILE", os.devnull)
    mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    mp.setenv("AWS_EC2_METADATA_DISABLED", "true")


@contextlib.contextmanager
def running_s3() -> Iterator[S3Server]:
    """Start moto's threaded S3 server on a free port of 127.0.0.1 (with :func:`aws_test_env`)."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    with pytest.MonkeyPatch.context() as mp:
        aws_test_env(mp)
        port = free_port()
        server = ThreadedMotoServer(ip_address=HOST, port=port, verbose=False)
        server.start()
        try:
            url = f"http://{HOST}:{port}"
            yield S3Server(endpoint_url=url, storage_options={"endpoint_url": url})
        finally:
            server.stop()


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """moto's S3 server for the whole session (fake credentials in the environment while it runs)."""
    with running_s3() as server:
        yield server


@pytest.fixture
def s3_bucket(s3: S3Server) -> str:
    """A fresh, empty bucket on :func:`s3`."""
    return s3.new_bucket()


# ---- HTTP ----------------------------------------------------------------------------------------------


@dataclass
class Faults:
    """Failures an :class:`HttpServer` injects into requests whose path contains ``match``.

    Attributes:
        fail: the next this many matching requests (HEAD or GET) answer ``status`` with no body.
        reset: the next this many matching GETs send half the body, then drop the connection.
        status: HTTP status of a failed request.
        match: substring of the request path that selects the requests (``""``: all).
        min_offset: only requests for bytes from this offset on (HEAD and whole-file GETs are offset 0).
    """

    fail: int = 0
    reset: int = 0
    status: int = 503
    match: str = ".tar"
    min_offset: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take(self, kind: str, path: str, offset: int = 0) -> bool:
        """Use up one ``kind`` (``"fail"`` or ``"reset"``) fault for a request, if one is left for it."""
        with self._lock:
            if self.match not in path or offset < self.min_offset or getattr(self, kind) <= 0:
                return False
            setattr(self, kind, getattr(self, kind) - 1)
            return True


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Static files with byte ranges (206/416), faults, and a request log; no console output."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        rng = self.headers.get("Range")
        self.server.log.append((self.command, self.path, rng))
        match = _RANGE.match(rng or "")
        offset = int(match[1]) if match and match[1] else 0
        if self.server.faults.take("fail", self.path, offset):
            self.send_error(self.server.faults.status)
            return
        path = self.translate_path(self.path)
        if not os.path.isfile(path):
            if head:  # folders (index pages, redirects) and 404s
                super().do_HEAD()
            else:
                super().do_GET()
            return
        with open(path, "rb") as fh:
            data = fh.read()
        start, end, status = 0, len(data), 200
        if match and (match[1] or match[2]):
            start, end = _byte_range(match[1], match[2], len(data))
            if start >= len(data):
                self.send_error(416)
                return
            status = 206
        self._send(data[start:end], status, (start, end, len(data)), head)

    def _send(self, body: bytes, status: int, span: tuple[int, int, int], head: bool) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {span[0]}-{span[1] - 1}/{span[2]}")
        self.end_headers()
        if head:
            return
        if len(body) > 1 and self.server.faults.take("reset", self.path, span[0]):
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)


def _byte_range(first: str, last: str, size: int) -> tuple[int, int]:
    if not first:  # "bytes=-N": the last N bytes
        return max(0, size - int(last)), size
    return int(first), min(size, int(last) + 1) if last else size


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    faults: Faults
    log: list[tuple[str, str, str | None]]


@dataclass
class HttpServer:
    """A running HTTP server for one folder.

    Attributes:
        url: ``http://127.0.0.1:<port>`` (the folder is the server's ``/``).
        faults: failures to inject; change them at any time.
        log: ``(method, path, Range header)`` of every request so far.
    """

    url: str
    faults: Faults
    log: list[tuple[str, str, str | None]]

    def requests_to(self, name: str) -> list[tuple[str, str, str | None]]:
        """The logged requests whose path ends with ``name``."""
        return [r for r in self.log if r[1].split("?")[0].endswith(name)]


@contextlib.contextmanager
def running_http(folder: str) -> Iterator[HttpServer]:
    """Serve ``folder`` on a free port of 127.0.0.1 until the block ends."""
    handler = _handler_for(folder)
    server = _Server((HOST, 0), handler)
    server.faults, server.log = Faults(), []
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield HttpServer(url=f"http://{HOST}:{server.server_address[1]}", faults=server.faults, log=server.log)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def _handler_for(folder: str) -> Callable[..., _Handler]:
    def make(*args: Any, **kwargs: Any) -> _Handler:
        return _Handler(*args, directory=folder, **kwargs)

    return make


@pytest.fixture
def http_serve() -> Iterator[Callable[[str], HttpServer]]:
    """``http_serve(folder)`` starts an :class:`HttpServer` for ``folder``; all stop when the test ends."""
    with contextlib.ExitStack() as stack:
        yield lambda folder: stack.enter_context(running_http(os.fspath(folder)))
