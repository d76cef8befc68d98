"""The runtime's boundary: what it imports, and what it exports."""

from __future__ import annotations

import ast
import types
from pathlib import Path

import lockgate.runtime as runtime

#: (lockgate.lazy: the package loads its names on first use)
ALLOWED = {"lockgate.spec", "lockgate.errors", "lockgate.lazy"}


def test_runtime_imports_only_spec_and_errors() -> None:
    package = Path(runtime.__file__).parent
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text("utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.startswith("lockgate") and not name.startswith("lockgate.runtime"):
                    assert name in ALLOWED, f"{path.name} imports {name}"


def test_public_api_is_complete() -> None:
    public = {n for n in dir(runtime) if not n.startswith("_")
              and not isinstance(getattr(runtime, n), types.ModuleType)}
    assert set(runtime.__all__) == public
