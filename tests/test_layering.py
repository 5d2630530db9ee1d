"""Imports go one way: flows/ -> studies/ (``xdpx tune``, ``xdpx suite``) -> stages/ -> xdpx
core; every orchestrator reaches stages through one registry, ``stages.registry.STAGES``; and
flows/ holds Prefect flows only.

Checked statically (ast, lazy imports in function bodies included): a module of ``xdpx/``
never imports ``stages`` or ``flows``, a module of ``stages/`` never imports ``flows``. The
one exception is ``xdpx/cli/``, the command-line entry point: it sits on top of everything
(``xdpx train`` is ``STAGES["train"].main(argv)``, ``xdpx tune`` runs ``studies.tune``), so it
may import ``stages``/``flows``, but only ``stages.registry`` at import time (cheap: no stage
module, no torch, so ``xdpx --help`` stays fast); the rest inside the commands.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
import yaml

from stages.registry import STAGES
from xdpx.config import RUN_SECTIONS, SECTIONS

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_closure  # noqa: E402

#: The command-line entry point, a package: may import stages/flows/studies (see the module
#: docstring).
ENTRY_POINT = "xdpx/cli/"
#: Forbidden top-level packages per layer.
FORBIDDEN = {
    "xdpx": ("stages", "flows", "studies"),
    "stages": ("flows", "studies"),
    "studies": ("flows",),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, wherever it appears."""
    return import_closure.imports_in(path, ROOT)


def _top_level_imports(path: Path) -> list[tuple[int, str]]:
    """Imports executed when the module is imported (module body only, not functions)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def _violations() -> dict[tuple[str, str], list[str]]:
    out: dict[tuple[str, str], list[str]] = {}
    for layer, forbidden in FORBIDDEN.items():
        for path in sorted((ROOT / layer).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel.startswith(ENTRY_POINT):
                continue
            for line, name in _imports(path):
                if name.split(".")[0] in forbidden:
                    out.setdefault((rel, name), []).append(f"{rel}:{line}: imports {name}")
    return out


def test_core_never_imports_stages_or_flows_and_stages_never_import_flows():
    bad = [msg for msgs in _violations().values() for msg in msgs]
    assert not bad, (
        "imports must go flows -> stages -> xdpx core (README); move the code to the layer "
        "that may import it:\n" + "\n".join(bad)
    )


def test_the_checker_sees_lazy_relative_and_importlib_imports(tmp_path, monkeypatch):
    pkg = tmp_path / "xdpx" / "sub"
    pkg.mkdir(parents=True)
    (pkg / "m.py").write_text(
        "import importlib\n"
        "def f():\n    from stages import train\n"
        "def g():\n    return importlib.import_module('studies.tune')\n"
        "from ... import stages\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    names = {name for _, name in _imports(pkg / "m.py")}
    assert {"stages.train", "studies.tune", "stages"} <= names


def test_cli_imports_only_the_registry_at_import_time():
    heavy = [
        f"{path.relative_to(ROOT)}:{line}: imports {name} at import time (import it inside the command)"
        for path in sorted((ROOT / ENTRY_POINT).glob("*.py"))
        for line, name in _top_level_imports(path)
        if name.split(".")[0] in ("stages", "flows", "studies") and name != "stages.registry.STAGES"
    ]
    assert not heavy, "\n".join(heavy)


def test_registry_is_the_dvc_dag_with_the_config_sections():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert list(STAGES) == list(dvc), "STAGES (stages/registry.py) and dvc.yaml's stages differ"
    assert list(STAGES) == [s for s in SECTIONS if s not in RUN_SECTIONS]  # cv: not a stage
    for name, stage in STAGES.items():
        assert stage.name == name
        assert dvc[name]["cmd"].strip() == f"python -m stages.{name}", name


def test_no_stage_module_imports_the_registry():
    """Each dvc stage's code deps (its import closure) must not grow with the other stages."""
    for path in sorted((ROOT / "stages").glob("*.py")):
        if path.name == "registry.py":
            continue
        names = [n for _, n in _imports(path)]
        assert not any(n.startswith("stages.registry") for n in names), path.name


def _architecture_rows() -> list[tuple[str, str]]:
    """(first cell, whole row) of each row of the README's architecture table."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Architecture", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| `")]
    return [(r.split("|")[1], r) for r in rows]


def test_the_readme_architecture_table_names_every_module_and_nothing_else():
    """Every module and package of xdpx/ is in the README's table (a package's modules in
    its row), and every xdpx/ path the table names exists."""
    rows = _architecture_rows()
    named_paths = {p for cell, _ in rows for p in re.findall(r"`(xdpx/[\w/.]*)`", cell)}
    for path in named_paths:
        assert (ROOT / path.rstrip("/")).exists(), f"README architecture names {path}: missing"
    first_cells = " ".join(cell for cell, _ in rows)
    for entry in sorted((ROOT / "xdpx").iterdir()):
        name = entry.name
        if name.startswith(("_", ".")) or (entry.is_file() and entry.suffix != ".py"):
            continue
        if entry.is_dir():
            row = next((r for c, r in rows if f"`xdpx/{name}/`" in c), None)
            assert row is not None or f"xdpx/{name}/" in " ".join(r for _, r in rows), name
            if name in ("train", "serving", "doctor"):
                for mod in sorted(entry.glob("*.py")):
                    if mod.name != "__init__.py":
                        assert f"`{mod.name}`" in row, f"xdpx/{name}/{mod.name} not in its row"
        else:
            assert f"`xdpx/{name}`" in first_cells or f"`{name}`" in first_cells, (
                f"xdpx/{name} is not in the README's architecture table"
            )


def test_the_data_layer_never_imports_the_trainer_and_bench_imports_no_test():
    """xdpx/data/ sits under the trainer (the epoch order both read is xdpx.batching's), and
    bench/ scripts stand on the package alone, not on a test module."""
    bad = [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in sorted((ROOT / "xdpx" / "data").rglob("*.py"))
        for line, name in _imports(path)
        if name.startswith(("xdpx.train", "xdpx.models", "xdpx.doctor"))
    ]
    bad += [
        f"{path.relative_to(ROOT)}:{line}: imports {name}"
        for path in sorted((ROOT / "bench").glob("*.py"))
        for line, name in _imports(path)
        if name.split(".")[0] in ("tests", "conftest") or name.startswith("test_")
    ]
    assert not bad, "\n".join(bad)


def test_every_module_of_flows_defines_a_prefect_flow():
    """flows/ is for Prefect flows; plain-Python studies (the suite, tune) live in studies/."""
    bare = []
    for path in sorted((ROOT / "flows").glob("*.py")):
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        decorated = any(
            isinstance(d, (ast.Name, ast.Call, ast.Attribute)) and "flow" in ast.unparse(d).split("(")[0].split(".")[-1]
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            for d in node.decorator_list
        )  # fmt: skip
        if not decorated:
            bare.append(path.relative_to(ROOT).as_posix())
    assert not bare, f"modules of flows/ without a @flow: {bare} (plain Python belongs in studies/)"


#: The largest a module of the package, stages, flows, studies or tools may grow (lines):
#: past it, split the module along its seams (issue 58: a house a newcomer can live in).
MAX_MODULE_LINES = 700


def test_no_module_outside_tests_and_bench_is_over_700_lines():
    big = [
        f"{path.relative_to(ROOT)}: {n} lines"
        for top in ("xdpx", "stages", "flows", "studies", "tools")
        for path in sorted((ROOT / top).rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines (split them): {big}"
