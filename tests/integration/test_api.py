"""The public API: every exported name resolves, and the build side never pays for torch."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import wsishard


def test_every_exported_name_resolves() -> None:
    for name in wsishard.__all__:
        assert getattr(wsishard, name) is not None, name


def test_the_public_names_are_listed_once() -> None:
    """``__init__.pyi`` lists them (type checkers read it); ``__all__`` and the lazy loading come from it."""
    init = Path(wsishard.__file__)
    stub = ast.parse(init.with_suffix(".pyi").read_text())
    imports = [node for node in stub.body if isinstance(node, ast.ImportFrom)]
    listed = {a.name: node.module for node in imports for a in node.names}
    assert len(listed) > 40 and all(a.asname == a.name for node in imports for a in node.names)  # re-exported
    assert wsishard.__all__ == sorted([*listed, "__version__"])
    for name, module in listed.items():
        assert getattr(wsishard, name) is getattr(importlib.import_module(str(module)), name), name
    source = init.read_text()
    assert not [name for name in listed if f'"{name}"' in source or f" {name}," in source]  # named nowhere else


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
    assert "wsishard.builder.run.orchestrate" in lines and "wsishard.storage.opener" in lines  # the walk found them
    assert lines[-2].split() == ["False", "False"]


def test_build_takes_one_path_and_the_cli_options_as_keywords(tmp_path: Path) -> None:
    from wsishard.builder.scan.grid import PatchOptions
    from wsishard.testing.synthetic import make_slides

    make_slides(tmp_path / "in", 2, seed=3, width=1024, height=1024, tissue_fraction=0.5)
    flat = wsishard.build(tmp_path / "in", str(tmp_path / "flat"), mpp=1.0, patch_size=64, jobs=1, qc=False)
    nested = wsishard.build(
        [str(tmp_path / "in")],
        str(tmp_path / "nested"),
        wsishard.BuildOptions(patch=PatchOptions(target_mpp=1.0, patch_size_px=64), jobs=1, qc=False),
    )
    assert flat.total_samples > 0 and flat.options == nested.options
    assert [s.sha256 for s in flat.shards] == [s.sha256 for s in nested.shards]
    with pytest.raises(TypeError, match="did you mean 'patch_size'"):
        wsishard.build(str(tmp_path / "in"), str(tmp_path / "bad"), patch_sise=64)
    assert not (tmp_path / "bad").exists()  # refused before anything is written
