"""wsishard: whole-slide images to mixed tissue-patch WebDataset shards, streamed into PyTorch.

The public names are listed once, in ``__init__.pyi`` (``from MODULE import NAME as NAME``), which type checkers
read; this module reads the same list and loads each name from its module on first use, so that ``import wsishard``
(and every build worker, which imports submodules) does not pay for torch and webdataset unless the streaming side
is used.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path
from typing import Any

__version__ = "0.2.0"


def _exports() -> dict[str, str]:
    """Public name -> the module that defines it, from ``__init__.pyi``."""
    stub = ast.parse(Path(__file__).with_suffix(".pyi").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in stub.body
        if isinstance(node, ast.ImportFrom) and node.module
        for alias in node.names
    }


_EXPORTS = _exports()
__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'wsishard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
