"""A real S3 endpoint for the benchmarks: moto's ``ThreadedMotoServer`` on 127.0.0.1, in the benchmark's process."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def moto_s3(folder: Path, bucket: str, prefix: str = "shards") -> Iterator[tuple[str, dict[str, Any]]]:
    """A moto S3 server holding every file of ``folder`` (manifest, shards, indexes, summary) under
    ``s3://bucket/prefix``: yields ``(url, storage_options)`` and stops the server on exit."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no per-request lines from the server
    os.environ["AWS_ACCESS_KEY_ID"] = os.environ["AWS_SECRET_ACCESS_KEY"] = "testing"  # moto's dummy values
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=bucket)
        for name in sorted(os.listdir(folder)):
            if (folder / name).is_file():
                client.upload_file(str(folder / name), bucket, f"{prefix}/{name}")
        yield f"s3://{bucket}/{prefix}", {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}
    finally:
        server.stop()
