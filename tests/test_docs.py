"""The documentation site (mkdocs.yml, docs/): it builds with --strict (no broken link or
anchor, no page left out of the nav, docstrings that parse), its parameter reference is the
config models' and covers params.yaml, and every shell block says whether a test runs it."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
#: keys left out of params.yaml on purpose: paths that name another stage's output, which
#: default to it (params.yaml's header says so)
DERIVED = {
    "train.data_dir",
    "evaluate.data_dir",
    "export.data_dir",
    "evaluate.checkpoint",
    "predict.checkpoint",
    "export.checkpoint",
    "export.out_dir",
    "distill.train_file",
}


@pytest.mark.e2e
def test_the_site_builds_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    params = (tmp_path / "site" / "reference" / "parameters" / "index.html").read_text()
    assert "prepro.conflicts" in params and "train.ngram_norm" in params  # generated
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert "--rdzv-endpoint" in cli  # every command's --help, from typer
    home = (tmp_path / "site" / "index.html").read_text()
    assert "The two commands" in home and 'href="own-data/"' in home  # the README, linked
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert "xdpx_pipeline" in api and "train_nproc" in api  # from the docstrings


def _documented() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "tools"))
    from params_table import params_table

    rows = [r.split("|") for r in params_table().splitlines() if r.startswith("| `")]
    return {r[1].strip().strip("`"): r[4].strip() for r in rows}


@pytest.mark.unit
def test_the_parameter_reference_covers_params_yaml_and_every_key_has_a_description():
    documented = _documented()
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    keys = {f"{s}.{k}" for s, body in raw.items() for k in body}
    assert keys - set(documented) == set(), "params.yaml keys the models do not document"
    assert set(documented) - keys == DERIVED, "documented keys missing from params.yaml"
    assert [k for k, d in documented.items() if not d] == []  # every key has its meaning


@pytest.mark.unit
def test_readme_is_a_front_page_that_links_every_guide():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    linked = set(re.findall(r"\]\(docs/([^)#]+)", readme))
    pages = {str(p.relative_to(ROOT / "docs")) for p in PAGES[1:]} - {"index.md"}
    assert pages <= linked, f"pages the README does not link: {sorted(pages - linked)}"
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(p in nav for p in pages), "a page missing from mkdocs.yml's nav"


def _shell_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line, the comment line before it)`` of every ```bash block."""
    lines = path.read_text().splitlines()
    return [(i + 1, lines[i - 1] if i else "") for i, line in enumerate(lines) if line.strip() == "```bash"]  # fmt: skip


@pytest.mark.unit
@pytest.mark.parametrize("path", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_block_says_which_test_runs_it_or_that_none_does(path):
    for line, marker in _shell_blocks(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        run = re.match(r"<!-- run by: (tests/\w+\.py)::(\w+)", marker)
        if run:
            test_file = ROOT / run.group(1)
            names = {n.name for n in ast.walk(ast.parse(test_file.read_text())) if isinstance(n, ast.FunctionDef)}  # fmt: skip
            assert run.group(2) in names, f"{where}: {run.group(1)} has no {run.group(2)}"
        else:
            assert re.match(r"<!-- not run by a test(?: in this form)?: \S", marker), (
                f"{where}: precede the block with <!-- run by: tests/FILE.py::TEST ... --> or "
                "<!-- not run by a test: why -->"
            )
