"""``xdpx tune``: hyper-parameter search with Optuna and a Hyperband pruner (XDPX's x-tune).

An orchestrator of stages, beside the Prefect flow: it calls ``STAGES["prepro"].run`` and
``STAGES["train"].run`` (``stages.registry``) as functions with config objects, in this
process: the trainer's ``on_eval`` hook must reach the Optuna trial, and a trial's sampled
values go into its configs as Python values (no argv, no YAML written and read back).

XDPX's AutoML read three files (train.hjson, space.hjson, tune.hjson) and ran
its own Hyperband. Here one YAML file holds the search space, in the style of
XDPX's space.hjson (``type`` / ``values`` / ``log`` / ``step``), plus the study
settings; Optuna does the rest:

.. code-block:: yaml

    study: ngram-lr                 # default: the file name
    params: params.yaml             # base params (flat or sectioned; extends: works)
    overrides: [train.max_epoch=2, train.eval_interval=20]   # fixed for every trial
    n_trials: 20                    # trials run by this command (a resumed study adds them)
    storage: null                   # default sqlite:///<out_dir>/<study>/study.db
    seed: 1                         # TPE sampler seed
    space:
      train.learning_rate: {type: float, values: [1.0e-4, 1.0e-1], log: true}
      train.batch_size: {type: int, values: [32, 128], step: 32}
      train.ngram_orders: {type: categorical, values: [[1, 2], [1, 2, 3]]}

Each trial trains (``STAGES["train"].run``) into ``<save_root>/<study>/trial-<n>``.
After every dev evaluation the trainer's ``on_eval`` hook reports the
``major_metric`` to Optuna (``trial.report(value, step=samples_seen)``); when
``HyperbandPruner`` says so, the hook raises ``StopTraining`` and the trial
ends as PRUNED. The trial's value is its best dev score. Direction:
``xdpx.metrics.METRIC_DIRECTIONS`` (``loss`` is minimised, the rest maximised).

Prepro runs once into ``<save_root>/<study>/prepared`` (reused while its
config is unchanged) unless the space tunes ``prepro.*`` keys; then every
trial prepares its own copy in ``<trial dir>/prepared``.

Outputs in ``<out_dir>/<study>/``: ``trials.tsv`` (one row per trial),
``best_params.yaml`` (the best trial's config as a params file that
``extends:`` the base and holds every override the command received, any section, plus
``prepro.data_dir`` of the data the trial trained on), ``history.png`` and ``intermediate.png`` (Optuna's
matplotlib plots). The same command against the same storage and study name
continues the study (trial numbers go on); several machines running it with
one PostgreSQL URL share the trials.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from stages.registry import STAGES
from xdpx import io
from xdpx.config import (
    ConfigError,
    PreproConfig,
    TrainConfig,
    _check_keys,
    _suggest,
    build_section,
    load_stage_configs,
    read_yaml_mapping,
)
from xdpx.data.meta import PreparedMeta
from xdpx.metrics import METRIC_DIRECTIONS
from xdpx.model_configs import reading_config

log = logging.getLogger("xdpx.tune")

__all__ = [
    "RESERVED_KEYS",
    "TUNABLE_SECTIONS",
    "default_resources",
    "SpaceEntry",
    "PrunerConfig",
    "TuneConfig",
    "TuneResult",
    "load_tune_config",
    "run",
    "default_storage",
    "hide_password",
]

#: Sections whose keys a space may tune.
TUNABLE_SECTIONS = ("train", "prepro")
#: Keys ``xdpx tune`` sets itself (paths, run-dir policy) or that would make trials incomparable.
RESERVED_KEYS = {
    "train.save_dir",
    "train.data_dir",
    "train.overwrite",
    "train.auto_suffix",
    "train.resume",
    "train.resume_from",
    "train.major_metric",
    "train.valid_subset",
    "prepro.data_dir",
    "prepro.data_source",
    "prepro.data_files",
}
_STUDY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


class SpaceEntry(BaseModel):
    """One tuned key, as in XDPX's space.hjson.

    ``type: float|int`` with ``values: [low, high]`` (inclusive), optional
    ``log: true`` (sample log-uniformly; needs ``low > 0``) or ``step``
    (a grid ``low, low+step, ...``; not with ``log``); ``type: categorical``
    with ``values: [choice, ...]`` (any YAML value, lists included).
    """

    model_config = ConfigDict(extra="forbid")
    type: Literal["float", "int", "categorical"]
    values: list[Any] = Field(min_length=1)
    log: bool = False
    step: float | None = Field(None, gt=0)

    def check(self) -> SpaceEntry:
        """Cross-field rules; returns a copy with numeric ``values`` (YAML may read ``1e-3`` as text).

        Raises:
            ValueError: the rule that failed (the caller adds file and key).
        """
        if self.type == "categorical":
            if self.log or self.step is not None:
                raise ValueError("log/step apply to float and int ranges, not to categorical")
            texts = [json.dumps(v, sort_keys=True) for v in self.values]
            if len(set(texts)) != len(texts):
                raise ValueError(f"categorical values repeat: {self.values}")
            return self
        if len(self.values) != 2:
            raise ValueError(f"a {self.type} range needs values: [low, high], got {self.values}")
        try:
            low, high = (float(v) for v in self.values)
        except (TypeError, ValueError):
            raise ValueError(f"range values must be numbers, got {self.values}") from None
        if not (math.isfinite(low) and math.isfinite(high)) or low >= high:
            raise ValueError(f"range needs low < high, got [{self.values[0]}, {self.values[1]}]")
        if self.log and low <= 0:
            raise ValueError(f"log: true needs low > 0, got {self.values[0]}")
        if self.log and self.step is not None:
            raise ValueError("log and step cannot be combined (Optuna samples one or the other)")
        step = self.step
        if self.type == "int":
            if low != int(low) or high != int(high):
                raise ValueError(f"an int range needs whole numbers, got {self.values}")
            if step is not None and step != int(step):
                raise ValueError(f"an int range needs a whole step, got {step}")
            return self.model_copy(
                update={"values": [int(low), int(high)], "step": int(step) if step else None}
            )
        return self.model_copy(update={"values": [low, high]})


class PrunerConfig(BaseModel):
    """``HyperbandPruner`` settings; resources are training samples seen (``EvalEvent.samples_seen``).

    ``min_resource`` defaults to the samples seen at the base config's first
    evaluation, ``max_resource`` to its whole budget (``max_epoch`` /
    ``max_update`` / ``max_samples`` over the prepared train split).
    ``reduction_factor`` is Hyperband's eta (Li et al. 2018; Optuna's default 3).
    """

    model_config = ConfigDict(extra="forbid")
    min_resource: int | None = Field(None, ge=1)
    max_resource: int | None = Field(None, ge=1)
    reduction_factor: int = Field(3, ge=2)


class TuneConfig(BaseModel):
    """The tune file: the study, the base params and the search space (see the module docstring)."""

    model_config = ConfigDict(extra="forbid")
    study: str | None = Field(None, description="Study name; default: the tune file's stem.")
    params: str = Field("params.yaml", description="Base params file (a missing file = defaults).")
    overrides: list[str] = Field([], description="section.key=value applied to every trial.")
    n_trials: int = Field(20, ge=1, description="Trials this command runs.")
    storage: str | None = Field(None, description="Optuna RDB URL; default SQLite in out_dir.")
    seed: int = Field(1, description="TPE seed (plus the trials already in the study).")
    out_dir: str = Field("reports/tune", description="Tables and plots: <out_dir>/<study>/.")
    save_root: str = Field("models/tune", description="Trial runs: <save_root>/<study>/trial-<n>.")
    pruner: PrunerConfig = PrunerConfig()
    space: dict[str, SpaceEntry] = Field(min_length=1)


@dataclass
class TuneResult:
    """What ``run`` produced: the study and the files written."""

    study_name: str
    storage: str  # password hidden
    direction: str
    n_trials: int  # trials in the study now, all runs together
    states: dict[str, int]  # state name -> count
    best_number: int | None
    best_value: float | None
    best_params: dict[str, Any]
    paths: dict[str, str]


# ------------------------------------------------------------------ the tune file
def _full_key(key: str) -> str:
    return key if "." in key else f"train.{key}"


def _yaml_value(value: Any) -> str:
    """``value`` as YAML flow text that ``yaml.safe_load`` reads back (``1.0e-05``, ``[1, 2]``)."""
    text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


def _pydantic_message(e: ValidationError, path: str, prefix: str, fields: list[str]) -> str:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    where = f"{prefix}.{loc}" if prefix and loc else (prefix or loc)
    if err["type"] == "extra_forbidden":
        name = str(err["loc"][-1])
        return f"{path}: unknown key {where}{_suggest(name, fields)}"
    msg = err["msg"].removeprefix("Value error, ")
    return f"{path}: {where}: {msg} (got {err.get('input')!r})"


def load_tune_config(
    path: str,
    overrides: list[str] | tuple[str, ...] = (),
    **options: Any,
) -> TuneConfig:
    """Read and validate a tune file.

    Args:
        path: YAML tune file (local path or fsspec URL).
        overrides: extra ``section.key=value`` (bare ``key`` = ``train.key``)
            appended to the file's ``overrides``.
        options: top-level settings that replace the file's when not None
            (``study``, ``n_trials``, ``storage``, ``out_dir``, ``params``, ``seed``, ...).

    Raises:
        ConfigError: missing file, bad YAML, unknown key (with the closest valid
            name, as params.yaml errors), a bad range, a value a params key
            rejects (alone, or on the base params: a key its model does not read), a
            reserved key; every message names the file and the key.
    """
    raw = read_yaml_mapping(path, "tune file", hint=" (study, params, space, ...)")
    fields = list(TuneConfig.model_fields)
    for key in raw:
        if key not in fields:
            raise ConfigError(f"{path}: unknown key {key!r}{_suggest(str(key), fields)}")
    raw.update({k: v for k, v in options.items() if v is not None})
    raw["overrides"] = [*(raw.get("overrides") or []), *overrides]
    space_raw = raw.get("space")
    if not isinstance(space_raw, dict) or not space_raw:
        raise ConfigError(
            f"{path}: space must map params keys to ranges, e.g. "
            f"'train.learning_rate: {{type: float, values: [1.0e-4, 1.0e-1], log: true}}'; "
            f"got {space_raw!r}"
        )
    space: dict[str, SpaceEntry] = {}
    for key, body in space_raw.items():
        full = _full_key(str(key))
        if full in space:
            raise ConfigError(f"{path}: space.{full} is given twice")
        space[full] = _check_entry(path, full, body)
    try:
        cfg = TuneConfig(**{**raw, "space": space})
    except ValidationError as e:
        raise ConfigError(_pydantic_message(e, path, "", fields)) from None
    if cfg.study is None:
        cfg = cfg.model_copy(update={"study": Path(str(path)).stem})
    if not _STUDY_NAME.fullmatch(cfg.study or ""):
        raise ConfigError(
            f"{path}: study: {cfg.study!r} must be letters, digits, '.', '_' or '-' "
            "(it names directories)"
        )
    # as for the stages, a missing params.yaml means the defaults; any other missing file is an error
    if cfg.params != "params.yaml" and not io.exists(cfg.params):
        raise ConfigError(f"{path}: params: base params file {cfg.params} not found")
    fixed = [o if "." in o.split("=", 1)[0] else f"train.{o}" for o in cfg.overrides]
    cfg = cfg.model_copy(update={"overrides": fixed})
    _check_space_on_base(path, cfg)
    return cfg


def _check_entry(path: str, key: str, body: Any) -> SpaceEntry:
    """Validate one space entry and its values against the params model of its key."""
    section, _, name = key.partition(".")
    _check_keys({section: {name: None}}, f"{path}: space")
    if section not in TUNABLE_SECTIONS:
        raise ConfigError(
            f"{path}: space.{key}: only {' and '.join(TUNABLE_SECTIONS)} keys can be tuned"
        )
    if key in RESERVED_KEYS:
        raise ConfigError(f"{path}: space.{key}: set by xdpx tune itself; it cannot be tuned")
    if not isinstance(body, dict):
        raise ConfigError(
            f"{path}: space.{key} must be a mapping like {{type: float, values: [low, high]}}, "
            f"got {body!r}"
        )
    try:
        entry = SpaceEntry(**body).check()
    except ValidationError as e:
        raise ConfigError(
            _pydantic_message(e, path, f"space.{key}", list(SpaceEntry.model_fields))
        ) from None
    except ValueError as e:
        raise ConfigError(f"{path}: space.{key}: {e}") from None
    probes = list(entry.values)  # each end of a range, each choice must be a valid value
    if entry.type == "float" and entry.step is None:
        low, high = entry.values  # and a value inside: catches float ranges over int keys
        probes.append(low * (high / low) ** 0.37 if entry.log else low + 0.37 * (high - low))
    context = reading_config(name) if section == "train" else {}  # a model that reads it
    for value in probes:
        build_section(section, {**context, name: value}, f"{path}: space.{key}")
    return entry


# ------------------------------------------------------------------ storage, names
def hide_password(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for logs, tables and files)."""
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an RDB URL: hide a user:pass@ part by hand
        return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)


def default_storage(out_dir: str, study: str) -> str:
    """``sqlite:///<abs out_dir>/<study>/study.db`` (its directory is created).

    Raises:
        ConfigError: ``out_dir`` is remote (SQLite needs a local file; give a storage URL).
    """
    study_dir = io.join(out_dir, study)
    if not io.is_local(study_dir):
        raise ConfigError(
            f"out_dir {out_dir} is remote: SQLite needs a local file; pass --storage "
            "(e.g. postgresql://user@host/db)"
        )
    local = os.path.abspath(study_dir.removeprefix("file://"))
    os.makedirs(local, exist_ok=True)
    return f"sqlite:///{local}/study.db"


# ------------------------------------------------------------------ configs of a trial
def _stage_config(section: str, cfg: TuneConfig, updates: dict[str, Any]) -> Any:
    """The ``section`` config of the base params + the fixed overrides + ``updates`` (values)."""
    configs = load_stage_configs(section, None, cfg.overrides, cfg.params, updates=updates)
    if len(configs) != 1:
        raise ConfigError(
            f"{cfg.params}: has a grid: (one run per combination); xdpx tune needs one base config"
        )
    return configs[0][1]


def _check_space_on_base(path: str, cfg: TuneConfig) -> None:
    """Load the base train config with each value of each tuned ``train`` key (each end of a
    range, each choice) before any trial: a key the base's model does not read, say, is
    refused here (``xdpx.model_configs.unread_keys``), not in a trial. Skipped when the
    space tunes ``train.model`` (a key's validity then depends on the trial's model).

    Raises:
        ConfigError: ``<path>: space.<key>=<value> on the base params: <the error>``.
    """
    if "train.model" in cfg.space:
        return
    for key, entry in cfg.space.items():
        if not key.startswith("train."):
            continue
        for value in entry.values:
            try:
                _stage_config("train", cfg, {key: value})
            except ConfigError as e:
                raise ConfigError(
                    f"{path}: space.{key}={value!r} on the base params: {e}"
                ) from None


def _samples_at(update: int, n_train: int, window: int) -> int:
    """Samples seen after ``update`` updates (each epoch: ceil(n/window) updates, the last partial)."""
    per_epoch = math.ceil(n_train / window)
    epochs, rem = divmod(update, per_epoch)
    return epochs * n_train + rem * window


def default_resources(train: TrainConfig, n_train: int) -> tuple[int, int]:
    """(samples at the first evaluation, samples of the whole budget) of ``train`` on ``n_train`` samples.

    Mirrors ``Trainer``: ``window = batch_size * update_freq``; evaluations every
    ``eval_interval`` updates (or at epoch ends for -1) from ``eval_interval_warmup``
    on, and always at the end; budget = the smallest of ``max_epoch``,
    ``max_update``, ``max_samples``.
    """
    window = train.batch_size * train.update_freq
    per_epoch = math.ceil(n_train / window)
    total = train.max_epoch * per_epoch
    if train.max_update is not None:
        total = min(total, train.max_update)
    if train.max_samples is not None:
        total = min(total, math.ceil(train.max_samples / window))
    every = train.eval_interval if train.eval_interval > 0 else per_epoch
    first = every * math.ceil(max(train.eval_interval_warmup, 1) / every)
    return _samples_at(min(first, total), n_train, window), _samples_at(total, n_train, window)


def _decode_choice(value: Any) -> Any:
    return (
        yaml.safe_load(value[len("yaml:") :])
        if isinstance(value, str) and value.startswith("yaml:")
        else value
    )


def _encode_choice(value: Any) -> Any:
    """Optuna choices are scalars: lists/dicts travel as ``yaml:<flow text>``."""
    return f"yaml:{_yaml_value(value)}" if isinstance(value, (list, dict)) else value


def _suggest_value(trial: Any, key: str, entry: SpaceEntry) -> Any:
    if entry.type == "categorical":
        choices = [_encode_choice(v) for v in entry.values]
        return _decode_choice(trial.suggest_categorical(key, choices))
    low, high = entry.values
    if entry.type == "int":
        return trial.suggest_int(key, low, high, step=int(entry.step or 1), log=entry.log)
    return trial.suggest_float(key, low, high, step=entry.step, log=entry.log)


# ------------------------------------------------------------------ the study
def _prepared_dir(cfg: TuneConfig, trial_dir: str | None) -> str:
    """Where a trial's prepared data is: ``<trial_dir>/prepared`` when the space tunes
    ``prepro.*`` keys, else the study's shared ``<save_root>/<study>/prepared``."""
    if trial_dir and any(k.startswith("prepro.") for k in cfg.space):
        return io.join(trial_dir, "prepared")
    return io.join(cfg.save_root, cfg.study, "prepared")


def _prepare(prepro: PreproConfig) -> str:
    """Run prepro into ``prepro.data_dir`` unless it already holds the output of this same config."""
    if io.exists(PreparedMeta.path_in(prepro.data_dir)):
        meta = PreparedMeta.read(prepro.data_dir)
        if meta.prepro == prepro.model_dump(mode="json"):
            log.info("tune: reusing prepared data in %s (same prepro config)", prepro.data_dir)
            return prepro.data_dir
    STAGES["prepro"].run(prepro)
    return prepro.data_dir


def run(cfg: TuneConfig) -> TuneResult:
    """Run ``cfg.n_trials`` trials of the study (created, or continued from its storage).

    Raises:
        ConfigError: bad base params/overrides, a base config with a grid, no
            validation split, a study stored with the other direction.
        ValueError: the model does not fit the shared prepared data
            (:func:`xdpx.train.setup.resolve`, before any trial).
        FileNotFoundError: missing input paths (the pre-flight checks of prepro/train).
    """
    import optuna

    from studies.tune_outputs import _write_outputs  # the outputs build on this module's config
    from xdpx.train.trainer import EvalEvent, StopTraining

    study_root = io.join(cfg.save_root, cfg.study)
    tunes_prepro = any(k.startswith("prepro.") for k in cfg.space)
    base_prepro: PreproConfig = _stage_config("prepro", cfg, {"prepro.data_dir": _prepared_dir(cfg, None)})  # fmt: skip
    base_train: TrainConfig = _stage_config("train", cfg, {})
    metric = base_train.major_metric
    direction = "maximize" if METRIC_DIRECTIONS[metric] > 0 else "minimize"
    shared = None if tunes_prepro else _prepare(base_prepro)

    pruner_cfg = cfg.pruner
    min_res, max_res = pruner_cfg.min_resource, pruner_cfg.max_resource
    if shared is not None:
        from xdpx.train.setup import resolve

        meta = PreparedMeta.read(shared)
        # the trials' set-up step, once before the study: a model that does not fit the data
        # (or a task that does not fit its labels) fails here, not in every trial
        resolve(base_train.model_copy(update={"data_dir": shared}), meta)
        if base_train.valid_subset not in meta.splits:
            raise ConfigError(
                f"xdpx tune: no {base_train.valid_subset!r} split in {shared} "
                "(trials are scored on it); set prepro.data_files"
            )
        n_train = meta.split(base_train.train_subset).rows
        first, budget = default_resources(base_train, n_train)
        min_res, max_res = min_res or first, max_res or budget
    elif min_res is None:
        if base_train.eval_interval > 0:
            min_res = base_train.eval_interval * base_train.batch_size * base_train.update_freq
        else:
            raise ConfigError(
                "xdpx tune: the space tunes prepro keys, so the train split size is unknown "
                "before the first trial; set pruner.min_resource (samples seen at the first "
                "evaluation) or train.eval_interval in overrides"
            )
    pruner = optuna.pruners.HyperbandPruner(
        min_resource=min_res,
        max_resource=max_res if max_res is not None else "auto",
        reduction_factor=pruner_cfg.reduction_factor,
    )
    storage = cfg.storage or default_storage(cfg.out_dir, cfg.study)
    shown = hide_password(storage)
    study = optuna.create_study(
        study_name=cfg.study,
        storage=storage,
        direction=direction,
        pruner=pruner,
        load_if_exists=True,
    )
    if study.direction.name.lower() != direction:
        raise ConfigError(
            f"study {cfg.study!r} in {shown} was created to {study.direction.name.lower()}; "
            f"train.major_metric={metric} needs {direction}: use another study name"
        )
    existing = len(study.trials)
    # a fresh TPE seeded by seed + trials so far: a resumed study does not redraw its first trials
    study.sampler = optuna.samplers.TPESampler(seed=cfg.seed + existing)
    log.info(
        "tune: study %r (%s), %d trials already, %d to run; %s %s; Hyperband on samples seen "
        "min_resource=%s max_resource=%s eta=%d",
        cfg.study,
        shown,
        existing,
        cfg.n_trials,
        direction,
        metric,
        min_res,
        max_res or "auto",
        pruner_cfg.reduction_factor,
    )

    def objective(trial: Any) -> float:
        values = {key: _suggest_value(trial, key, entry) for key, entry in cfg.space.items()}
        trial_dir = io.join(study_root, f"trial-{trial.number}")
        trial.set_user_attr("save_dir", trial_dir)
        if io.exists(trial_dir):  # left by an earlier study of this name (a new storage)
            log.warning("tune: replacing %s (an earlier study's trial %d)", trial_dir, trial.number)
            io.rm(trial_dir, recursive=True)
        data_dir = shared
        if data_dir is None:
            data_dir = _prepared_dir(cfg, trial_dir)
            _prepare(_stage_config("prepro", cfg, {**values, "prepro.data_dir": data_dir}))
        forced = {
            "train.save_dir": trial_dir,
            "train.data_dir": data_dir,
            "train.overwrite": True,
            "train.auto_suffix": False,
            "train.resume": False,
            "train.resume_from": None,
        }
        train_cfg = _stage_config("train", cfg, {**values, **forced})
        log.info(
            "tune: trial %d: %s",
            trial.number,
            " ".join(f"{k}={_yaml_value(v)}" for k, v in values.items()),
        )
        pruned: list[int] = []

        def on_eval(event: EvalEvent) -> None:
            trial.report(event.metrics[metric], step=event.samples_seen)
            if trial.should_prune():
                pruned.append(event.samples_seen)
                raise StopTraining(
                    f"Hyperband pruned trial {trial.number} at {event.samples_seen} samples "
                    f"(dev {metric}={event.metrics[metric]:.4f})"
                )

        result = STAGES["train"].run(train_cfg, on_eval=on_eval)
        trial.set_user_attr("best_update", result.best_update)
        if pruned:
            raise optuna.TrialPruned(f"pruned at {pruned[0]} samples seen")
        if result.best_score is None:
            raise ConfigError(f"trial {trial.number}: no dev score (no {metric} evaluated)")
        return float(result.best_score)

    from xdpx.errors import DivergenceError

    started = time.perf_counter()
    try:
        study.optimize(
            objective,
            n_trials=cfg.n_trials,
            catch=(DivergenceError,),  # a diverged trial is FAIL, the study goes on
            callbacks=[lambda s, _t: _write_outputs(cfg, s, metric, plots=False)],
            gc_after_trial=True,
        )
    finally:
        paths = _write_outputs(cfg, study, metric, plots=True)
    log.info(
        "tune: %d trials in %.0f s", len(study.trials) - existing, time.perf_counter() - started
    )
    states: dict[str, int] = {}
    for t in study.trials:
        states[t.state.name] = states.get(t.state.name, 0) + 1
    try:
        best = study.best_trial
        best_number, best_value = best.number, best.value
        best_params = {k: _decode_choice(v) for k, v in best.params.items()}
    except ValueError:
        best_number, best_value, best_params = None, None, {}
    return TuneResult(
        study_name=cfg.study or "",
        storage=shown,
        direction=direction,
        n_trials=len(study.trials),
        states=states,
        best_number=best_number,
        best_value=best_value,
        best_params=best_params,
        paths=paths,
    )
