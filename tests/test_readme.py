"""The README's parameter table is generated from xdpx/config.py and must stay in sync."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def test_readme_params_table_matches_config():
    sys.path.insert(0, str(ROOT / "tools"))
    from params_table import params_table

    readme = (ROOT / "README.md").read_text()
    assert params_table().strip() in readme, (
        "README params table is stale: run python tools/params_table.py"
    )


def test_readme_commands_are_the_makefile_targets():
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "\ndemo:" in makefile and "\ntest:" in makefile
    assert "make test" in (ROOT / ".ci" / "run").read_text()
