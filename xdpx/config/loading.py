"""Reading params: YAML files and their ``extends`` chains, ``section.key=value`` overrides,
``${section.key}`` references, validation into the sections, and writing YAML back."""

from __future__ import annotations

import difflib
import re
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from xdpx import io
from xdpx.config.base import ConfigError, _Section
from xdpx.config.sections import SECTIONS, Params


def _suggest(word: str, options: list[str]) -> str:
    close = difflib.get_close_matches(word, options, n=1, cutoff=0.5)
    return (
        f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(options))}"
    )


def _check_keys(raw: dict[str, Any], where: str) -> None:
    for section, body in raw.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"{where}: unknown section {section!r}{_suggest(section, list(SECTIONS))}"
            )
        if body is None:
            continue
        if not isinstance(body, dict):
            raise ConfigError(f"{where}: section {section!r} must be a mapping, got {body!r}")
        fields = list(SECTIONS[section].model_fields)
        for key in body:
            if key not in fields:
                raise ConfigError(
                    f"{where}: unknown key {section}.{key}{_suggest(str(key), fields)}"
                )


_REF = re.compile(r"\$\{([a-z_]+)\.([a-z_0-9]+)\}")


def _resolve_refs(raw: dict[str, Any], fill_all: bool = True) -> None:
    """Resolve ``${section.key}`` inside string values (DVC-templating style), in place.

    A key missing from ``raw`` whose default holds a reference (``evaluate.checkpoint``
    defaults to ``${train.save_dir}/<best>``) is added with its default first, so the
    downstream follows an overridden upstream path whether or not params.yaml lists it.
    ``fill_all``: do so for every section of :data:`SECTIONS` (absent ones included), not
    only for those in ``raw``.

    Raises:
        ConfigError: a circular or unresolvable reference.
    """
    for section in list(SECTIONS) if fill_all else list(raw):
        cls = SECTIONS.get(section)
        if cls is None:
            continue
        body = raw[section] = dict(raw.get(section) or {})
        for key, field in cls.model_fields.items():
            if key not in body and isinstance(field.default, str) and "${" in field.default:
                body[key] = field.default

    def value_of(section: str, key: str, seen: tuple[str, ...]) -> Any:
        ref = f"{section}.{key}"
        if ref in seen:
            raise ConfigError(f"circular reference ${{{ref}}}")
        cls = SECTIONS.get(section)
        if cls is None or key not in cls.model_fields:
            raise ConfigError(f"unresolvable reference ${{{ref}}}")
        value = (raw.get(section) or {}).get(key, cls.model_fields[key].default)
        return sub(value, seen + (ref,))

    def sub(value: Any, seen: tuple[str, ...]) -> Any:
        if not isinstance(value, str):
            return value
        whole = _REF.fullmatch(value)
        if whole:
            return value_of(whole.group(1), whole.group(2), seen)
        return _REF.sub(lambda m: str(value_of(m.group(1), m.group(2), seen)), value)

    for section, body in raw.items():
        for key, value in (body or {}).items():
            body[key] = sub(value, (f"{section}.{key}",))


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split ``section.key=value`` into its parts; the value is parsed as YAML.

    Raises:
        ConfigError: the item is not of that form.
    """
    if "=" not in item:
        raise ConfigError(f"override {item!r} must look like section.key=value")
    path, text = item.split("=", 1)
    if "." not in path:
        raise ConfigError(f"override {item!r} must name its section, e.g. train.{path}={text}")
    section, key = path.strip().split(".", 1)
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({e})") from None
    return section, key, value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Return a copy of ``raw`` (a params dict) with ``section.key=value`` overrides applied.

    Raises:
        ConfigError: malformed override or unknown section/key (with a did-you-mean).
    """
    out = {s: dict(b or {}) for s, b in raw.items()}
    for item in overrides:
        section, key, value = parse_override(item)
        _check_keys({section: {key: value}}, f"override {item!r}")
        out.setdefault(section, {})[key] = value
    return out


def _format_validation_error(
    e: ValidationError, section: str, raw: dict[str, Any], where: str
) -> str:
    err = e.errors()[0]
    msg = err["msg"].removeprefix("Value error, ")
    loc = ".".join(str(p) for p in err["loc"])
    if not loc:  # a cross-field rule: its message names the keys
        return f"{where}: invalid {section}: {msg}"
    head = loc.split(".")[0]
    bad = raw.get(head, err.get("input"))
    return f"{where}: invalid {section}.{loc}={bad!r}: {msg}"


def build_section(section: str, body: dict[str, Any], where: str = "params") -> _Section:
    """Validate one section's dict into its model.

    Raises:
        ConfigError: unknown key or invalid value (one line naming key and value).
    """
    _check_keys({section: body}, where)
    try:
        return SECTIONS[section](**body)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, section, body, where)) from None


def load_params(path: str = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> Params:
    """Load ``params.yaml`` (missing file = all defaults), apply overrides, validate.

    A params file may start with ``extends: parent.yaml`` (``params/bert-minilm.yaml``):
    the parent is merged first, as for stage config files (:func:`read_config_file`).

    Args:
        path: params file (local path or fsspec URL).
        overrides: ``section.key=value`` strings, applied after the file.

    Raises:
        ConfigError: malformed YAML, unknown section/key, invalid value, a ``grid:``.
    """
    raw = read_params_raw(path, overrides)
    _resolve_refs(raw)
    sections = {s: build_section(s, raw.get(s) or {}, path) for s in SECTIONS}
    return Params(**sections)


def read_params_raw(path: str = "params.yaml", overrides: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    """The params mapping of ``path`` (an ``extends`` chain merged) with ``overrides`` applied,
    ``${section.key}`` references left as written: what a params.yaml holding exactly these
    values says (``studies.record`` writes one per flow run). Missing file: ``{}`` + overrides.

    Raises:
        ConfigError: malformed YAML, unknown section/key, a ``grid:``, a malformed override.
    """
    raw = read_yaml_mapping(path, hint=" of sections") if io.exists(path) else {}
    if "extends" in raw:
        raw = read_config_file(path)
        if "grid" in raw:
            raise ConfigError(f"{path}: grid: expands stage runs (xdpx <stage> {path}), not params")
    _check_keys(raw, path)
    return apply_overrides(raw, list(overrides))


def non_defaults(cfg: BaseModel) -> dict[str, Any]:
    """The keys of a section (or of Params) whose value differs from the default (a default
    that references another section, ``${prepro.data_dir}``, compared resolved against that
    section's default)."""
    out: dict[str, Any] = {}
    defaults = type(cfg)()
    for name in type(cfg).model_fields:
        value = getattr(cfg, name)
        if isinstance(value, BaseModel):
            sub = non_defaults(value)
            if sub:
                out[name] = sub
        elif value != getattr(defaults, name):
            out[name] = value.model_dump() if isinstance(value, BaseModel) else value
    return out


def dump_yaml(data: Any) -> str:
    """YAML text of plain data (tuples as lists), keys in insertion order."""

    def plain(x: Any) -> Any:
        if isinstance(x, BaseModel):
            return plain(x.model_dump())
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [plain(v) for v in x]
        return x

    return yaml.safe_dump(plain(data), sort_keys=False, allow_unicode=True)


# ------------------------------------------------------------------ config files
def _deep_merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_yaml_mapping(
    path: str, what: str = "config file", where: str = "", hint: str = ""
) -> dict:
    """The top-level mapping of a YAML file (local or URL), with errors that name the file.

    Args:
        path: the file.
        what: what the file is, for the not-found message (``config file``, ``tune file``).
        where: appended to the not-found message (e.g. `` (extended by a.yaml)``).
        hint: the expected keys, appended to the not-a-mapping message.

    Raises:
        ConfigError: missing file, invalid YAML, or a top level that is not a mapping.
    """
    if not io.exists(path):
        raise ConfigError(f"{what} {path} not found{where}")
    try:
        raw = yaml.safe_load(io.read_text(path)) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping{hint}")
    return raw


def read_config_file(
    path: str, section: str | None = None, _chain: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Read a YAML config file into params form ``{section: {key: value}, "grid": {...}}``.

    A file is either sectioned (top-level keys are params.yaml sections) or
    flat (the keys of one section, ``section``). ``extends: parent.yaml``
    (relative to the file) merges a parent first, the child winning key by key
    (XDPX's ``__parent__``); chains are followed. ``grid:`` maps keys
    (``key`` or ``section.key``) to lists of values; it is returned under
    ``"grid"`` with ``section.key`` names.

    Raises:
        ConfigError: missing file, invalid YAML, a flat file without a section,
            an ``extends`` cycle, a malformed grid.
    """
    if path in _chain:
        raise ConfigError(f"{path}: extends cycle {' -> '.join((*_chain, path))}")
    where = f" (extended by {_chain[-1]})" if _chain else ""
    raw = read_yaml_mapping(path, "config file", where)
    parent = raw.pop("extends", None)
    grid = raw.pop("grid", None) or {}
    if not isinstance(grid, dict):
        raise ConfigError(f"{path}: grid must map keys to lists of values, got {grid!r}")
    if raw and not set(raw) & set(SECTIONS):
        if section is None:
            raise ConfigError(f"{path}: flat config (no section names) but no section given")
        raw = {section: raw}
    out: dict[str, Any] = {}
    if parent:
        parent_path = str(parent)
        if "://" not in parent_path and not parent_path.startswith("/"):
            parent_path = io.join(io.dirname(path), parent_path)  # relative to the child file
        out = read_config_file(parent_path, section, (*_chain, path))
    _check_keys(raw, path)
    full_grid: dict[str, list[Any]] = dict(out.pop("grid", {}))
    for key, values in grid.items():
        name = key if "." in str(key) else f"{section}.{key}"
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: grid.{key} must be a non-empty list, got {values!r}")
        sec, _, k = name.partition(".")
        _check_keys({sec: {k: None}}, f"{path}: grid")
        full_grid[name] = values
    out = _deep_merge(out, raw)
    if full_grid:
        out["grid"] = full_grid
    return out


#: The output path of each section: a grid run is suffixed there.
