"""The house rules the code map in the design notes promises: small modules, short functions, one package boundary."""

from __future__ import annotations

import ast
from pathlib import Path

import wsishard

PACKAGE = Path(wsishard.__file__).parent
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    found = sorted(PACKAGE.rglob("*.py"))
    assert len(found) > 40  # the walk found the package
    return found


def test_no_module_over_400_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not long, long


def test_no_function_over_60_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = length
    assert not long, long


def test_the_build_side_never_names_torch_or_webdataset() -> None:
    """Not even lazily, inside a function: slide/, builder/, shards/ and storage/ stay installable without them."""
    offenders = []
    for sub in ("slide", "builder", "shards", "storage"):
        for path in sorted((PACKAGE / sub).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                offenders += [f"{path.relative_to(PACKAGE)}: {n}" for n in names
                              if n.split(".")[0] in ("torch", "webdataset")]  # fmt: skip
    assert not offenders, offenders
