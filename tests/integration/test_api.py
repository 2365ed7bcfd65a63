"""The public API: every exported name resolves, and the build side never pays for torch."""

from __future__ import annotations

import subprocess
import sys

import wsishard


def test_every_exported_name_resolves() -> None:
    for name in wsishard.__all__:
        assert getattr(wsishard, name) is not None, name


BUILD_SIDE = ("slide", "builder", "shards", "storage")


def test_build_side_imports_neither_torch_nor_webdataset() -> None:
    """Every module of the build-side subpackages, the CLI and the format: the package boundary holds."""
    code = (
        "import importlib, pkgutil, sys, wsishard, wsishard.cli, wsishard.format, wsishard.report\n"
        f"for sub in {BUILD_SIDE!r}:\n"
        "    pkg = importlib.import_module('wsishard.' + sub)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(info.name)\n"
        "        print(info.name)\n"
        "print('torch' in sys.modules, 'webdataset' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    lines = out.stdout.split("\n")
    assert "wsishard.builder.run" in lines and "wsishard.storage.opener" in lines  # the walk found the modules
    assert lines[-2].split() == ["False", "False"]
