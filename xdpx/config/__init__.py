"""Typed configuration: one pydantic model per ``params.yaml`` section.

``params.yaml`` is the single source of every knob. Each stage reads exactly
one section (plus nothing else), so ``dvc.yaml`` can list the exact keys a
stage depends on. Values are validated at load time; an unknown key fails
with the closest valid name, a wrong type names the key and the bad value.

Overrides use ``section.key=value`` (the value is parsed as YAML, so
``train.filter_sizes=[2,3]`` and ``fetch.limit=null`` work).

The package: :mod:`~xdpx.config.base` (the error, the section base),
:mod:`~xdpx.config.sections` (every section but ``train``, :class:`Params`),
:mod:`~xdpx.config.train` (:class:`TrainConfig`), :mod:`~xdpx.config.loading` (YAML,
``extends``, overrides, references) and :mod:`~xdpx.config.argv` (a stage's command line).
Every name is importable from ``xdpx.config`` as before.
"""

from __future__ import annotations

from xdpx.config.argv import (
    OUTPUT_KEYS,
    StageArgs,
    _grid_label as _grid_label,
    _suffixed as _suffixed,
    load_stage_configs,
    render_tree,
    stage_argv,
)
from xdpx.config.base import (
    ConfigError,
    _Section as _Section,
)
from xdpx.config.loading import (
    _REF as _REF,
    _check_keys as _check_keys,
    _deep_merge as _deep_merge,
    _format_validation_error as _format_validation_error,
    _resolve_refs as _resolve_refs,
    _suggest as _suggest,
    apply_overrides,
    build_section,
    dump_yaml,
    load_params,
    non_defaults,
    parse_override,
    read_config_file,
    read_params_raw,
    read_yaml_mapping,
)
from xdpx.config.sections import (
    RUN_SECTIONS,
    SECTIONS,
    CVConfig,
    DistillConfig,
    EvaluateConfig,
    ExportConfig,
    FetchConfig,
    Params,
    PredictConfig,
    PreproConfig,
)
from xdpx.config.train import (
    HF_MODELS,
    MLM_METRICS,
    MODELS_WITHOUT_EMBEDDINGS,
    REGRESSION_METRICS,
    ModelName,
    TrainConfig,
)

__all__ = [
    "ConfigError",
    "FetchConfig",
    "PreproConfig",
    "TrainConfig",
    "EvaluateConfig",
    "PredictConfig",
    "ExportConfig",
    "CVConfig",
    "DistillConfig",
    "Params",
    "SECTIONS",
    "RUN_SECTIONS",
    "load_params",
    "read_params_raw",
    "apply_overrides",
    "non_defaults",
    "ModelName",
    "HF_MODELS",
    "MLM_METRICS",
    "REGRESSION_METRICS",
    "MODELS_WITHOUT_EMBEDDINGS",
    "parse_override",
    "build_section",
    "dump_yaml",
    "read_yaml_mapping",
    "read_config_file",
    "StageArgs",
    "stage_argv",
    "OUTPUT_KEYS",
    "load_stage_configs",
    "render_tree",
]
