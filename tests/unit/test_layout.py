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


def _docstring_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return (first.end_lineno or first.lineno) - first.lineno + 1
    return 0


def test_no_function_over_60_lines() -> None:
    """Code lines, the signature included: a public function's docstring is its contract, not its length."""
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1 - _docstring_lines(node)
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
                offenders += [
                    f"{path.relative_to(PACKAGE)}: {n}" for n in names if n.split(".")[0] in ("torch", "webdataset")
                ]
    assert not offenders, offenders


# Imports of wsishard modules inside a function, each for a reason; never to break an import cycle between the
# package's rooms (move the helper to the module that owns it instead).
DEFERRED_IMPORTS = {
    ("cli.py", "wsishard.demo"): "the demo pulls in torch; the other commands do not",
    ("embedding/flags.py", "wsishard.embedding.run"): "torch: the CLI starts without it",
    ("embedding/flags.py", "wsishard.embedding.export"): "h5py: only when exporting",
    ("demo.py", "wsishard.streaming.collate"): "torch: only once the demo streams",
    ("demo.py", "wsishard.streaming.loader"): "torch: only once the demo streams",
    ("demo.py", "wsishard.streaming.sources"): "torch: only once the demo streams",
    ("shards/summary.py", "wsishard.storage.opener"): "the build writes indexes without the opener",
    ("augment/stain.py", "wsishard.storage.opener"): "slide records are read only for a stain table",
    ("builder/scan/tissue.py", "wsishard.builder.scan.artefacts"): "scipy and scikit-image: not at CLI start-up",
    ("builder/scan/tissue.py", "wsishard.builder.scan.morphology"): "OpenCV: not at CLI start-up",
    ("slide/__init__.py", "wsishard.slide.openslide_backend"): "OpenSlide: not at CLI start-up",
    ("slide/__init__.py", "wsishard.slide.tiff"): "tifffile: not at CLI start-up",
    **{
        ("cli.py", m): "a command's own modules, imported when it runs: --help starts without them"
        for m in (
            "wsishard.builder.run.orchestrate",
            "wsishard.builder.run.merge",
            "wsishard.builder.qc.qcdraw",
            "wsishard.qc_html",
            "wsishard.report",
            "wsishard.shards.verify",
            "wsishard.shards.summary",
            "wsishard.storage.opener",
        )
    },
}


def test_the_package_imports_its_own_modules_at_the_top() -> None:
    deferred = set()
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("wsishard"):
                        deferred.add((path.relative_to(PACKAGE).as_posix(), inner.module))
    assert deferred <= set(DEFERRED_IMPORTS), sorted(deferred - set(DEFERRED_IMPORTS))
