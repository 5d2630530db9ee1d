"""Print the parameter reference, generated from the pydantic models in xdpx/config/.

Usage: ``python tools/params_table.py``; the documentation site's reference page is this
output (docs/hooks.py inserts it at build time; tests/test_docs.py checks it covers params.yaml).
"""

from __future__ import annotations

import typing

from pydantic.fields import FieldInfo

from xdpx.config import SECTIONS


def _type_name(annotation: typing.Any) -> str:
    text = str(annotation).replace("typing.", "").replace("NoneType", "None")
    return text.replace("<class '", "").replace("'>", "")


def _default(field: FieldInfo) -> str:
    value = field.default
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{'null' if value is None else value}`"


def params_table() -> str:
    """Markdown: one table per section, every key with its type, default and meaning."""
    out = []
    for section, model in SECTIONS.items():
        out.append(f"#### `{section}`\n")
        out.append("| key | type | default | meaning |")
        out.append("|---|---|---|---|")
        for name, field in model.model_fields.items():
            kind = _type_name(field.annotation).replace("|", r"\|")
            default = _default(field).replace("|", r"\|")
            out.append(f"| `{section}.{name}` | {kind} | {default} | {field.description} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(params_table())
