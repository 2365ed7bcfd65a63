"""The public API: every exported name resolves, and the build side never pays for torch."""

from __future__ import annotations

import subprocess
import sys

import wsishard


def test_every_exported_name_resolves() -> None:
    for name in wsishard.__all__:
        assert getattr(wsishard, name) is not None, name


def test_build_side_imports_neither_torch_nor_webdataset() -> None:
    code = (
        "import sys, wsishard, wsishard.build, wsishard.cli; print('torch' in sys.modules, 'webdataset' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["False", "False"]
