"""MkDocs hooks: the generated parts of the site, rebuilt from the code at every build.

* ``<!-- params-table -->``: every params.yaml key from the pydantic models
  (``tools/params_table.py``: type, default, description);
* ``<!-- cli-help -->``: every ``xdpx`` command's ``--help``, as typer prints it;
* ``<!-- readme -->``: the README (the home page), its ``docs/`` links made site-relative.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _params_table() -> str:
    sys.path.insert(0, str(ROOT / "tools"))
    from params_table import params_table

    return params_table()


def _cli_help() -> str:
    import typer
    from typer.testing import CliRunner

    from xdpx.cli import app

    group = typer.main.get_command(app)
    out = []
    runner = CliRunner()
    for name in sorted(group.commands):
        if group.commands[name].hidden:
            continue
        text = runner.invoke(app, [name, "--help"], env={"COLUMNS": "100", "NO_COLOR": "1"}).output
        out.append(f"### `xdpx {name}`\n\n```text\n{text.rstrip()}\n```\n")
    return "\n".join(out)


def _readme() -> str:
    import re

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    text = text.replace("](docs/", "](")
    return re.sub(r"The documentation is a site.*?readable here too\.\n", "", text, flags=re.S)


GENERATED = {
    "<!-- params-table -->": _params_table,
    "<!-- cli-help -->": _cli_help,
    "<!-- readme -->": _readme,
}


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ANN001 - mkdocs' hook
    for marker, build in GENERATED.items():
        if marker in markdown:
            markdown = markdown.replace(marker, build())
    return markdown
