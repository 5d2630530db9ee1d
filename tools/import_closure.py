"""The in-repo import closure of a module: the repo files ``python -m MODULE`` can execute.

Static: parses each file with :mod:`ast` and follows ``import a.b``, ``from a.b import c``
(``c`` a submodule when ``a/b/c.py`` or ``a/b/c/`` exists), relative imports, and
``importlib.import_module("a.b")`` with a literal name, wherever they appear (function
bodies included: a lazy import runs when its function does). Importing ``a.b.c`` also runs
``a/__init__.py`` and ``a/b/__init__.py``. Modules outside the repo are ignored.

dvc.yaml's code deps are checked against this by tests/test_dvc_deps.py; to see what a
stage needs:

    python tools/import_closure.py stages.train
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_file(name: str, root: Path = ROOT) -> Path | None:
    """``a.b`` -> ``a/b.py`` or ``a/b/__init__.py`` under ``root``; None if not in the repo."""
    base = root.joinpath(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _package_of(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] != "__init__" else parts[:-1])


def imports_in(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``path``, wherever it appears
    (candidates: ``from a import b`` gives ``a`` and ``a.b``, which may be an attribute)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package_of(path, root)
    if path.name == "__init__.py":
        package = ".".join(path.relative_to(root).parent.parts)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                parts = package.split(".") if package else []
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{a.name}") for a in node.names if a.name != "*"]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return [(line, name.strip(".")) for line, name in found if name.strip(".")]


def imported_names(path: Path, root: Path = ROOT) -> set[str]:
    """Absolute module names a file imports (see :func:`imports_in`)."""
    return {name for _, name in imports_in(path, root)}


def closure(module: str, root: Path = ROOT) -> set[Path]:
    """Every repo file that running ``module`` may import, ``module``'s own file included.

    Raises:
        ModuleNotFoundError: ``module`` is not a file of the repo.
    """
    start = module_file(module, root)
    if start is None:
        raise ModuleNotFoundError(f"{module} is not a module of {root}")
    seen: set[Path] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for i in range(1, len(parts) + 1):  # a.b.c runs a/__init__, a/b/__init__, a/b/c
            path = module_file(".".join(parts[:i]), root)
            if path is None or path in seen:
                continue
            seen.add(path)
            todo.extend(imported_names(path, root))
    return seen


def main(argv: list[str] | None = None) -> None:
    for module in argv if argv is not None else sys.argv[1:]:
        for path in sorted(closure(module)):
            print(path.relative_to(ROOT))


if __name__ == "__main__":
    main()
