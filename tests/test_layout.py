"""Layout names live in one place: xdpx.rundir (run directories) and xdpx.data.meta (meta.json).

Every other module asks a ``RunDir`` for ``best/``, ``valid.log.tsv`` ... and reads
``meta.json`` through ``PreparedMeta.read``; a string literal naming one of them elsewhere
means a module joins the layout by hand again (issue 21).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("xdpx", "stages", "flows", "studies")
#: The modules that own the names.
OWNERS = {"xdpx/rundir.py", "xdpx/data/meta.py"}
#: Strings no other module may spell.
LAYOUT_NAMES = {
    "best",
    "last",
    "meta.json",
    "train.log.tsv",
    "valid.log.tsv",
    "result.json",
    "repro.json",
    "run.json",
    "time.log.tsv",
    "starter.yaml",
}
LAYOUT_SUFFIXES = ("/best", "/last", "/meta.json")
#: Keyword arguments whose string value is not a path: matplotlib's ``legend(loc="best")``.
NOT_PATH_KEYWORDS = {"loc"}


def _exempt(tree: ast.AST) -> set[int]:
    """ids of the Constant nodes that name no path: module/class/function docstrings and
    the values of :data:`NOT_PATH_KEYWORDS` arguments."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                ids.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg in NOT_PATH_KEYWORDS:
            ids.add(id(node.value))
    return ids


def _is_layout_name(value: str) -> bool:
    return value in LAYOUT_NAMES or value.endswith(LAYOUT_SUFFIXES)


def layout_violations(source: str, rel: str) -> list[str]:
    """``file:line: 'name'`` for each layout name spelled in ``source`` (docstrings and
    ``loc=`` excepted), in line order."""
    tree = ast.parse(source, filename=rel)
    exempt = _exempt(tree)
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in exempt
            and _is_layout_name(node.value)
        ):
            found.append((node.lineno, node.col_offset, f"{rel}:{node.lineno}: {node.value!r}"))
    return [text for *_, text in sorted(found)]


def _sources() -> list[Path]:
    return sorted(
        p
        for pkg in PACKAGES
        for p in (ROOT / pkg).rglob("*.py")
        if p.relative_to(ROOT).as_posix() not in OWNERS
    )


def test_sources_found():
    names = {p.relative_to(ROOT).as_posix() for p in _sources()}
    assert {"xdpx/checkpoint.py", "stages/train.py", "flows/pipeline.py"} <= names


def test_layout_names_only_in_rundir_and_meta():
    violations = [
        v
        for p in _sources()
        for v in layout_violations(p.read_text(encoding="utf-8"), p.relative_to(ROOT).as_posix())
    ]
    assert not violations, (
        "run-layout / meta.json names spelled outside xdpx/rundir.py and xdpx/data/meta.py "
        "(use RunDir / rundir constants / PreparedMeta):\n" + "\n".join(violations)
    )


def test_checker_sees_joins_not_docstrings():
    source = (
        '"""Module doc: <run>/best and meta.json."""\n'
        "def f(d):\n"
        '    """Reads d/valid.log.tsv."""\n'
        '    ax.legend(loc="best")\n'
        '    return io.join(d, "best"), f"{d}/last", io.join(d, "meta.json")\n'
    )
    assert layout_violations(source, "x.py") == [
        "x.py:5: 'best'",
        "x.py:5: '/last'",
        "x.py:5: 'meta.json'",
    ]
