"""dvc.yaml is complete: every repo file a stage can run is among its deps.

The closure of ``python -m stages.<name>`` is computed statically (tools/import_closure.py:
``import``, ``from ... import``, ``importlib.import_module("...")`` with literal names, lazy
imports in function bodies included). A stage whose code can change without ``dvc repro``
noticing would silently keep stale outputs; this names the stage and the file.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_closure  # noqa: E402

pytestmark = pytest.mark.unit

DVC_YAML = yaml.safe_load((ROOT / "dvc.yaml").read_text())
STAGES = DVC_YAML["stages"]


def _module(stage: dict) -> str:
    match = re.fullmatch(r"python -m ([\w.]+)", stage["cmd"].strip())
    assert match, f"cmd {stage['cmd']!r} is not `python -m <module>`"
    return match.group(1)


def _code_deps(stage: dict) -> list[str]:
    return [d for d in stage["deps"] if "${" not in d]


@pytest.mark.parametrize("name", sorted(STAGES))
def test_every_file_a_stage_runs_is_a_dep(name):
    deps = _code_deps(STAGES[name])
    missing = []
    for path in sorted(import_closure.closure(_module(STAGES[name]))):
        rel = path.relative_to(ROOT).as_posix()
        if not any(rel == d or rel.startswith(d.rstrip("/") + "/") for d in deps):
            missing.append(rel)
    assert not missing, f"dvc.yaml stage {name!r} runs {missing} but does not list them in deps"


@pytest.mark.parametrize("name", sorted(STAGES))
def test_code_deps_exist(name):
    for dep in _code_deps(STAGES[name]):
        assert (ROOT / dep).exists(), f"dvc.yaml stage {name!r}: dep {dep} does not exist"


def test_fetch_and_prepro_run_no_model_code():
    for module in ("stages.fetch", "stages.prepro"):
        files = {p.relative_to(ROOT).as_posix() for p in import_closure.closure(module)}
        assert not {f for f in files if f.startswith("xdpx/models")}, module
        assert "xdpx/train/trainer.py" not in files and "xdpx/checkpoint.py" not in files, module


def test_closure_follows_lazy_and_literal_imports(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg import b\n")
    (pkg / "b.py").write_text("import importlib\nimportlib.import_module('pkg.c')\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("import os\n")
    (pkg / "unused.py").write_text("")
    found = {p.name for p in import_closure.closure("pkg.a", tmp_path)}
    assert found == {"__init__.py", "a.py", "b.py", "c.py", "d.py"}
