"""The config error and the base of every ``params.yaml`` section (unknown keys refused)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class ConfigError(ValueError):
    """A configuration problem: unknown key, wrong type or conflicting options.

    The message is one line that names the key, the bad value and, for a
    typo, the closest valid name.
    """


class _Section(BaseModel):
    """A params section. A string may name another section's key, ``${train.save_dir}``.

    Such references are resolved when params are loaded (:func:`load_params`,
    :func:`load_stage_configs`: against the other sections of the same file and its
    overrides). A section built directly in Python (``EvaluateConfig()``) resolves
    them against the referenced keys' defaults.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)

    @model_validator(mode="before")
    @classmethod
    def _resolve_default_refs(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        from xdpx.config.loading import (
            _resolve_refs,  # the sections and the loading build on this base
        )
        from xdpx.config.sections import SECTIONS

        name = next((n for n, c in SECTIONS.items() if c is cls), None)
        if name is None:
            return data
        raw = {name: dict(data)}
        _resolve_refs(raw, fill_all=False)
        return raw[name]
