#!/usr/bin/env python
"""Benchmark slides and shards in object storage behind a request delay: builds read in place, through the copy path
and from local disk; the loader streaming the build from the store and from local disk.

Example::

    python benchmarks/bench_storage.py
    python benchmarks/bench_storage.py --smoke

An S3 server (moto, ``python -m moto.server``) runs in its own process; a proxy in another process forwards every
request to it after ``delay`` ms (0, 20, 50), as a remote store's round trip would, and counts requests and bytes.
Builds (2 jobs): slides read in place (ranged GETs), through the copy path (``fast_path=False``: each slide copied
to scratch first, then read by OpenSlide) and from local disk. Streaming: the loader alone (2 workers, uint8
batches of 64) over the local build's shards, from the store at each delay and from local disk, interleaved. The
proxy, the server and the build share the machine's cores: on 2 shared cores the figures are noisy.

Prints Markdown tables, then one line ``JSON: {...}``; ``benchkit`` saves both to
``benchmarks/results/bench_storage.json``. Wall-clock figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

HERE = Path(__file__).resolve().parent
BUCKET = "bench-storage"
KEYS = {"key": "testing", "secret": "testing"}


# ---- the delay proxy (its own process) -------------------------------------------------------------------


class _Proxy(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the upstream server after the delay; ``GET /__stats`` answers the counts so far,
    ``GET /__reset`` zeroes them."""

    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)
    delay_s = 0.0
    lock = threading.Lock()
    stats: ClassVar[dict[str, int]] = {"requests": 0, "gets": 0, "bytes": 0}

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        if self.path in ("/__stats", "/__reset"):
            with self.lock:
                if self.path == "/__reset":
                    self.stats.update(requests=0, gets=0, bytes=0)
                body = json.dumps(self.stats).encode()
            self._answer(200, [("Content-Length", str(len(body)))], body)
            return
        time.sleep(self.delay_s)
        length = int(self.headers.get("Content-Length") or 0)
        payload = self.rfile.read(length) if length else None
        conn = http.client.HTTPConnection(*self.upstream, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "keep-alive")}
        conn.request(self.command, self.path, body=payload, headers=headers)
        resp = conn.getresponse()
        body = resp.read()
        conn.close()
        with self.lock:
            self.stats["requests"] += 1
            self.stats["gets"] += self.command == "GET"
            self.stats["bytes"] += len(body) if self.command == "GET" else 0
        head = self.command == "HEAD"  # its Content-Length is the object's size, sent as the server sent it
        skip = ("transfer-encoding", "connection", "keep-alive", *(() if head else ("content-length",)))
        kept = [(k, v) for k, v in resp.getheaders() if k.lower() not in skip]
        self._answer(resp.status, kept if head else [*kept, ("Content-Length", str(len(body)))], body, head=head)

    def _answer(self, status: int, headers: list[tuple[str, str]], body: bytes, head: bool = False) -> None:
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


def proxy_main(port: int, upstream_port: int, delay_ms: float) -> None:
    _Proxy.upstream, _Proxy.delay_s = ("127.0.0.1", upstream_port), delay_ms / 1000
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _Proxy)
    server.daemon_threads = True
    server.serve_forever()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen[bytes]) -> None:
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit(f"a server process ended at start (exit {proc.returncode})")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return
        time.sleep(0.1)
    raise SystemExit(f"nothing listens on port {port}")


@contextlib.contextmanager
def _process(args: list[str], port: int) -> Iterator[None]:
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_port(port, proc)
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _stats(port: int, reset: bool = False) -> dict[str, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/__reset" if reset else "/__stats")
    out = json.loads(conn.getresponse().read())
    conn.close()
    return dict(out)


# ---- the runs --------------------------------------------------------------------------------------------


def _build(inputs: list[str], out: Path, options: dict[str, Any] | None, fast: bool, sizes: dict[str, int]) -> dict:
    from wsishard.builder.options.buildopts import BuildOptions
    from wsishard.builder.run.orchestrate import build
    from wsishard.builder.scan.grid import PatchOptions

    opts = BuildOptions(patch=PatchOptions(patch_size_px=256), shard_samples=128, jobs=2, fast_path=fast)
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    manifest = build(inputs, str(out), opts, storage_options=options)
    seconds = time.perf_counter() - t0
    return {
        "s": round(seconds, 2),
        "patches": sum(s.patches for s in manifest.slides),
        "shards": [(r.name, r.sha256) for r in manifest.shards],
        "bytes_read": sum(s.bytes_read for s in manifest.slides),
        "slide_bytes": sum(sizes.values()),
    }


def _stream(source: str, options: dict[str, Any] | None, batches: int) -> dict[str, float]:
    from wsishard.streaming.loader import loader
    from wsishard.streaming.sources import stream

    ds = stream(source, batch_size=64, resampled=True, seed=0, storage_options=options)
    it = iter(loader(ds, num_workers=2))
    for _ in range(2):  # a batch per worker: start-up aside
        next(it)
    t0 = time.perf_counter()
    n = sum(len(next(it)["key"]) for _ in range(batches))
    rate = n / (time.perf_counter() - t0)
    del it
    return {"samples_per_s": round(rate, 1)}


def _upload(endpoint: str, folder: Path, prefix: str) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")  # fmt: skip
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=BUCKET)
    for path in sorted(folder.iterdir()):
        if path.is_file():
            client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")


def run_all(args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    from wsishard.testing.synthetic import make_slides

    slides = work / "slides"
    if not slides.exists():
        make_slides(slides, args.slides, seed=7, width=args.size, height=args.size, tissue_fraction=0.6)
    sizes = {p.name: p.stat().st_size for p in slides.iterdir()}
    local_out = work / "local"
    result: dict[str, Any] = {"slides": args.slides, "size_px": args.size, "delays_ms": args.delays}
    log("build from local disk")
    result["local"] = _build([str(slides)], local_out, None, True, sizes)
    s3_port = _free_port()
    moto = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(s3_port)]
    env_keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    os.environ.update(env_keys)
    with _process(moto, s3_port):
        _upload(f"http://127.0.0.1:{s3_port}", slides, "slides")
        _upload(f"http://127.0.0.1:{s3_port}", local_out, "shards")
        for delay in args.delays:
            port = _free_port()
            proxy = [sys.executable, __file__, "--proxy", str(port), str(s3_port), str(delay)]
            with _process(proxy, port):
                options = {"endpoint_url": f"http://127.0.0.1:{port}", **KEYS}
                for mode, fast in (("in_place", True), ("copy", False)):
                    log(f"build {mode}, {delay} ms")
                    _stats(port, reset=True)
                    r = _build([f"s3://{BUCKET}/slides/"], work / mode, options, fast, sizes)
                    r.update(_stats(port))
                    r["identical"] = r.pop("shards") == result["local"]["shards"]
                    result[f"{mode}_{delay}"] = r
                log(f"stream, {delay} ms, and local disk")
                for _ in range(args.rounds):
                    result.setdefault(f"stream_{delay}", []).append(
                        _stream(f"s3://{BUCKET}/shards", options, args.batches)["samples_per_s"]
                    )
                    result.setdefault(f"stream_local_{delay}", []).append(
                        _stream(str(local_out), None, args.batches)["samples_per_s"]
                    )
    result["local"].pop("shards")
    return result


def report(r: dict[str, Any]) -> None:
    from benchkit import markdown, spread

    n = r["slides"]
    rows = [("local disk", "-", f"{r['local']['s']:.1f}", "-", "-", "-", "-")]
    for delay in r["delays_ms"]:
        for mode in ("in_place", "copy"):
            b = r[f"{mode}_{delay}"]
            ratio = b["s"] / r[f"copy_{delay}"]["s"]
            rows.append(
                (
                    mode.replace("_", " "),
                    f"{delay}",
                    f"{b['s']:.1f}",
                    f"{ratio:.2f}x",
                    f"{b['gets'] / n:.0f}",
                    f"{b['bytes'] / n / 2**20:.1f}",
                    "yes" if b["identical"] else "NO",
                )
            )
    print(markdown(
        ("build", "delay ms", "seconds", "/ copy", "GETs per slide", "MB per slide", "shards = local"), rows,
        f"Builds of {n} slides of {r['size_px']} px (2 jobs) from moto S3 behind a delay proxy, against local disk",
        "lrrrrrl",
    ))  # fmt: skip
    print()
    srows = []
    for delay in r["delays_ms"]:
        s3, local = r[f"stream_{delay}"], r[f"stream_local_{delay}"]
        ratios = [a / b for a, b in zip(s3, local, strict=True)]
        srows.append((f"{delay}", spread(s3, 0, "/s"), spread(local, 0, "/s"), spread(ratios, 3)))
    print(markdown(
        ("delay ms", "S3 samples/s", "local disk samples/s", "S3 / local"), srows,
        "Streaming the build: the loader alone, 2 workers, batches of 64 (each S3 round beside its local twin)",
        "rrrr",
    ))  # fmt: skip
    print("JSON: " + json.dumps(r, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slides", type=int, default=4)
    p.add_argument("--size", type=int, default=4096, help="slide width and height, px")
    p.add_argument("--delays", type=int, nargs="+", default=[0, 20, 50], help="ms per request")
    p.add_argument("--rounds", type=int, default=2, help="streaming rounds per delay (each beside a local one)")
    p.add_argument("--batches", type=int, default=40, help="batches timed per streaming round")
    p.add_argument("--workdir", default=None, help="where slides and builds go (default: a temporary folder)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round, nothing saved (CI)")
    p.add_argument("--proxy", nargs=3, type=float, metavar=("PORT", "UPSTREAM", "DELAY_MS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.proxy:
        proxy_main(int(args.proxy[0]), int(args.proxy[1]), args.proxy[2])
        return 0
    if args.smoke:
        args.slides, args.size, args.delays, args.rounds, args.batches = 2, 1536, [0, 20], 1, 3
    from benchkit import logger

    log = logger("bench_storage")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        report(run_all(args, work, log))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(HERE))
    import benchkit

    if "--proxy" in sys.argv:
        sys.exit(main())
    sys.exit(benchkit.run("bench_storage", main))
