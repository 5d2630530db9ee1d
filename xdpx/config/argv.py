"""A stage's command line: ``stage_argv`` (a config file or ``params.yaml`` plus
overrides), the grid of configs it expands to, and the resolved tree printed for it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel

from xdpx import io
from xdpx.config.base import ConfigError, _Section
from xdpx.config.loading import (
    _check_keys,
    _resolve_refs,
    apply_overrides,
    build_section,
    non_defaults,
    read_config_file,
)


class StageArgs(NamedTuple):
    """A stage command line, parsed: ``[CONFIG.yaml] [--params F] [--dry] [key=value ...]``."""

    params: str
    overrides: list[str]
    config_file: str | None = None
    dry: bool = False


def stage_argv(section: str, argv: list[str]) -> StageArgs:
    """Parse ``[CONFIG.yaml] [--params FILE] [--dry] [key=value ...]`` of a stage command.

    A bare ``key=value`` is taken as ``<section>.key=value``; one argument
    ending in ``.yaml``/``.yml`` is the config file (default: ``--params``,
    i.e. params.yaml).

    Raises:
        ConfigError: an argument of none of these forms, or two config files.
    """
    params = "params.yaml"
    overrides: list[str] = []
    config_file: str | None = None
    dry = False
    it = iter(argv)
    for arg in it:
        if arg in ("-p", "--params"):
            params = next(it, params)
        elif arg.startswith("--params="):
            params = arg.split("=", 1)[1]
        elif arg == "--dry":
            dry = True
        elif "=" in arg and not arg.startswith("-"):
            head = arg.split("=", 1)[0]
            overrides.append(arg if "." in head else f"{section}.{arg}")
        elif arg.endswith((".yaml", ".yml")) and not arg.startswith("-"):
            if config_file is not None:
                raise ConfigError(f"two config files given: {config_file} and {arg}; pass one")
            config_file = arg
        else:
            raise ConfigError(
                f"unexpected argument {arg!r}; use [CONFIG.yaml] [--params FILE] [--dry] "
                "[section.key=value ...]"
            )
    return StageArgs(params, overrides, config_file, dry)


OUTPUT_KEYS = {
    "fetch": "out_dir",
    "prepro": "data_dir",
    "train": "save_dir",
    "evaluate": "metrics_file",
    "predict": "out_file",
    "export": "out_dir",
    "cv": "save_dir",
    "distill": "out_file",
}


def _grid_label(combo: dict[str, Any]) -> str:
    def text(v: Any) -> str:
        return "+".join(map(str, v)) if isinstance(v, (list, tuple)) else str(v)

    return "_".join(f"{k.split('.', 1)[1]}-{text(v)}" for k, v in combo.items())


def _suffixed(path: str, label: str, is_file: bool) -> str:
    if not is_file:
        return io.join(path, label)
    head, dot, ext = path.rpartition(".")
    return f"{head}_{label}.{ext}" if dot and "/" not in ext else f"{path}_{label}"


def load_stage_configs(
    section: str,
    config_file: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    params_file: str = "params.yaml",
    updates: Mapping[str, Any] | None = None,
) -> list[tuple[str, _Section]]:
    """Resolve the config(s) of one stage: file (or params.yaml) + overrides, expanded by grid.

    Args:
        section: the stage's params section (``train`` ...).
        config_file: YAML config (flat or sectioned, may ``extends:``); None =
            ``params_file``.
        overrides: ``section.key=value`` strings (command-line text, parsed as YAML).
        params_file: used when no config file is given.
        updates: ``{"section.key": value}`` with Python values, applied after
            ``overrides`` (before ``${...}`` references are resolved): for a caller that
            holds values, not text (``xdpx tune``'s trials), so nothing goes through YAML.

    Returns:
        ``[(label, config)]``: one entry, label ``""``, without a grid; else one
        per combination of the grid values, label ``key-value_key-value``, with
        the section's output path (``OUTPUT_KEYS``) suffixed by the label.

    Raises:
        ConfigError: unknown key (with suggestion), invalid value, bad file.
    """
    if config_file is not None:
        raw = read_config_file(config_file, section)
        where = config_file
    else:
        raw, where = {}, params_file
        if io.exists(params_file):
            raw = read_config_file(params_file, section)
    grid = raw.pop("grid", {})
    raw = apply_overrides(raw, list(overrides))
    for name, value in (updates or {}).items():
        sec, _, key = name.partition(".")
        _check_keys({sec: {key: value}}, f"{where}: update {name!r}")
        raw.setdefault(sec, {})[key] = value
    if overrides or updates:
        where += " + overrides"
    combos: list[dict[str, Any]] = [{}]
    for name, values in grid.items():
        combos = [{**c, name: v} for c in combos for v in values]
    out: list[tuple[str, _Section]] = []
    out_key = OUTPUT_KEYS[section]
    for combo in combos:
        body = {s: dict(b or {}) for s, b in raw.items()}
        for name, value in combo.items():
            sec, _, key = name.partition(".")
            body.setdefault(sec, {})[key] = value
        _resolve_refs(body)
        cfg = build_section(section, body.get(section) or {}, where)
        label = _grid_label(combo) if combo else ""
        if label:
            path = getattr(cfg, out_key)
            cfg = cfg.model_copy(update={out_key: _suffixed(path, label, out_key.endswith("file"))})
        out.append((label, cfg))
    return out


def render_tree(cfg: BaseModel, section: str) -> str:
    """The resolved config as an indented tree; ``*`` marks each non-default value.

    Example::

        train
          * learning_rate: 0.003
            batch_size: 64
    """
    changed = non_defaults(cfg)
    lines = [section]
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        mark = "*" if name in changed else " "
        lines.append(f"  {mark} {name}: {text}")
    return "\n".join(lines)
