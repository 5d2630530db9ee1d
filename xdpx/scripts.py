"""Result scripts over training run directories (XDPX's ``x-script``).

A *run directory* is a ``train.save_dir``: it holds ``params.yaml`` (the
resolved ``train`` section), ``result.json`` (``TrainResult``),
``train.log.tsv``, ``valid.log.tsv``, ``best/``, ``last/`` and, with
``train.keep_checkpoints``, ``checkpoint-<update>/`` directories. The
functions here read them through ``xdpx.io`` (local paths or fsspec URLs):

* ``find_runs``: every run directory under a root.
* ``aggregate_results`` / ``write_aggregate``: one row per run with its best
  validation row and the ``train`` params that differ between the runs
  (a sweep table).
* ``load_run_params`` / ``diff_params``: which ``train`` keys differ between
  two runs or config files (missing keys count as the ``TrainConfig`` default).
* ``clean_checkpoints``: drop every ``checkpoint-<update>/`` but the best and
  the last, and the debris of interrupted atomic writes.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import yaml

from xdpx import io
from xdpx.metrics import METRIC_DIRECTIONS
from xdpx.rundir import BEST, CHECKPOINT_PREFIX, INNER_DIRS, LAST, RUN_FILES, RunDir

log = logging.getLogger("xdpx.scripts")

__all__ = [
    "find_runs",
    "read_log",
    "read_result",
    "major_metric_of",
    "best_valid_row",
    "aggregate_results",
    "write_aggregate",
    "load_run_params",
    "diff_params",
    "clean_checkpoints",
]

#: ``valid.log.tsv`` columns that are positions, not metrics.
POSITION_COLUMNS = ("update", "epoch", "samples_seen")

_CHECKPOINT = re.compile(rf"^{re.escape(CHECKPOINT_PREFIX)}(\d+)$")
_OLD = re.compile(r"^(?P<name>.+)\.old-[0-9a-f]{8}$")  # io.replace_dir's renamed-aside copy
_TMP = re.compile(r"^\.(?P<name>.+)\.tmp-[0-9a-f]{8}$")  # io.tmp_sibling's temp directory


# ---------------------------------------------------------------- reading one run
def read_log(run_dir: str, name: str, required: bool = True) -> pd.DataFrame | None:
    """Read the run's ``<name>.log.tsv`` (``train``, ``valid``, ``grad``, ``samples``;
    :meth:`xdpx.rundir.RunDir.log`) into a DataFrame.

    Args:
        run_dir: training run directory (local path or fsspec URL).
        name: the log's name: ``"train"`` reads ``train.log.tsv``.
        required: raise when the file is missing; otherwise return None.

    Raises:
        FileNotFoundError: the file is missing and ``required`` (the message
            names the path and asks whether ``run_dir`` is a run directory).
    """
    path = RunDir(run_dir).log(name)
    if not io.exists(path):
        if not required:
            return None
        raise FileNotFoundError(
            f"{path} not found: is {run_dir} a training run directory (train.save_dir)?"
        )
    with io.open(path, "rb") as f:
        return pd.read_csv(f, sep="\t")


def read_result(run_dir: str) -> dict[str, Any] | None:
    """``<run_dir>/result.json`` (``TrainResult`` fields) as a dict, or None when absent."""
    path = RunDir(run_dir).result
    if not io.exists(path):
        return None
    return json.loads(io.read_text(path))


def _read_yaml(path: str) -> Any:
    try:
        return yaml.safe_load(io.read_text(path))
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None


def _run_train_section(run_dir: str) -> dict[str, Any] | None:
    path = RunDir(run_dir).params
    if not io.exists(path):
        return None
    raw = _read_yaml(path) or {}
    return dict(raw.get("train") or {}) if isinstance(raw, dict) else None


def major_metric_of(run_dir: str, valid_log: pd.DataFrame | None = None) -> str | None:
    """The run's ``major_metric``, or None when nothing records it.

    Looked up in ``result.json``, then ``params.yaml`` ``train.major_metric``,
    then the ``best_<metric>`` column the trainer writes into ``valid.log.tsv``
    (``valid_log``, if given). Only names in ``METRIC_DIRECTIONS`` count.
    """
    result = read_result(run_dir) or {}
    candidates = [
        result.get("major_metric"),
        (_run_train_section(run_dir) or {}).get("major_metric"),
    ]
    if valid_log is not None:
        candidates += [c[len("best_") :] for c in valid_log.columns if c.startswith("best_")]
    return next((m for m in candidates if m in METRIC_DIRECTIONS), None)


def _best_index(valid_log: pd.DataFrame, metric: str) -> int | None:
    """Index label of the best row by ``metric`` and its direction (first of ties, NaN skipped)."""
    if metric not in valid_log.columns:
        return None
    score = pd.to_numeric(valid_log[metric], errors="coerce") * METRIC_DIRECTIONS[metric]
    return None if score.isna().all() else score.idxmax()


def best_valid_row(
    run_dir: str, valid_log: pd.DataFrame | None = None, trust_result: bool = True
) -> pd.Series | None:
    """The row of ``valid.log.tsv`` of the run's best evaluation, or None.

    With ``trust_result`` the row whose ``update`` equals ``result.json``
    ``best_update`` is taken when there is one; otherwise (or without
    ``trust_result``) the best row by the run's ``major_metric`` honouring its
    direction (``METRIC_DIRECTIONS``: +1 higher is better, -1 lower), the
    first of equal scores as the trainer's strict improvement rule picks.

    Args:
        run_dir: training run directory.
        valid_log: its ``valid.log.tsv`` if already read (read here otherwise).
        trust_result: use ``result.json`` ``best_update`` when present.

    Returns:
        The row (index = column names), or None when the run has no
        ``valid.log.tsv``, no rows, or no known major metric.
    """
    if valid_log is None:
        valid_log = read_log(run_dir, "valid", required=False)
    if valid_log is None or valid_log.empty:
        return None
    result = read_result(run_dir) or {}
    if trust_result and result.get("best_update") is not None:
        hit = valid_log.index[valid_log["update"] == result["best_update"]]
        if len(hit):
            return valid_log.loc[hit[0]]
    metric = major_metric_of(run_dir, valid_log)
    idx = _best_index(valid_log, metric) if metric else None
    return None if idx is None else valid_log.loc[idx]


# ---------------------------------------------------------------- finding runs
def _fs_root(root: str) -> tuple[Any, str]:
    fs, p = io.fs_of(root)
    return fs, p.rstrip("/") or "/"


def find_runs(root: str) -> list[str]:
    """Every training run directory under ``root`` (``root`` itself included), sorted.

    A directory is a run when it directly holds ``valid.log.tsv`` or
    ``result.json``. Checkpoint directories (``best``, ``last``,
    ``checkpoint-*``), ``dvclive`` and write debris inside a run are not
    searched.

    Args:
        root: directory (local path or fsspec URL).

    Returns:
        Paths in the form of ``root`` (``io.join(root, relative)``; ``root``
        itself when it is a run).

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    if not io.isdir(root):
        raise FileNotFoundError(f"{root} not found (or not a directory): expected a folder of runs")
    fs, base = _fs_root(root)
    runs: list[str] = []
    for dirpath, dirs, files in fs.walk(base, topdown=True):
        if any(name in files for name in RUN_FILES):
            rel = dirpath.rstrip("/")[len(base) :].strip("/")
            runs.append(io.join(root, rel) if rel else str(root))
            dirs[:] = [
                d
                for d in dirs
                if not (d in INNER_DIRS or _CHECKPOINT.match(d) or _OLD.match(d) or _TMP.match(d))
            ]
    return sorted(runs)


def _rel(root: str, run: str) -> str:
    rel = run[len(str(root).rstrip("/")) :].strip("/")
    return rel or "."


# ---------------------------------------------------------------- params
def load_run_params(path: str) -> dict[str, Any]:
    """The ``train`` params of a run directory or a YAML config file, as written.

    Args:
        path: a run directory (its ``params.yaml`` ``train`` section is read),
            or a YAML file: its ``train`` section if it has one (``params.yaml``,
            ``starter.yaml``), else the whole file as a flat ``train`` section.

    Returns:
        key -> value as loaded from YAML (no defaults filled in).

    Raises:
        FileNotFoundError: ``path`` does not exist, or a run directory has no ``params.yaml``.
        ValueError: the file is not valid YAML or not a mapping.
    """
    if io.isdir(path):
        file = RunDir(path).params
        if not io.exists(file):
            raise FileNotFoundError(
                f"{file} not found: is {path} a training run directory (train.save_dir)?"
            )
    elif io.exists(path):
        file = path
    else:
        raise FileNotFoundError(f"{path} not found: expected a run directory or a YAML config file")
    raw = _read_yaml(file)
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: expected a mapping of params, got {type(raw).__name__}")
    if "train" in raw:
        train = raw["train"] or {}
        if not isinstance(train, dict):
            raise ValueError(f"{file}: the train section must be a mapping, got {train!r}")
        return dict(train)
    return dict(raw)


def _train_defaults() -> dict[str, Any]:
    from xdpx.config import TrainConfig

    return TrainConfig().model_dump(mode="json")


def _normalise(params: dict[str, Any]) -> dict[str, Any]:
    """Defaults filled in, each known value coerced by its ``TrainConfig`` field type (JSON form).

    So ``1e-3`` (a YAML 1.1 string), ``0.001`` and tuples vs lists compare
    equal, and ``learning_rate: null`` is the model's default learning rate (what it
    means in training). A value its field rejects, or an unknown key (a run from another
    version), is kept as written.
    """
    from pydantic import TypeAdapter, ValidationError

    from xdpx.config import TrainConfig

    out = _train_defaults()
    fields = TrainConfig.model_fields
    for key, value in params.items():
        if key in fields:
            adapter = TypeAdapter(fields[key].annotation)
            try:
                value = adapter.dump_python(adapter.validate_python(value), mode="json")
            except ValidationError:
                pass
        out[key] = value
    if out.get("learning_rate") is None:
        from xdpx.models import MODELS, default_learning_rate

        if out.get("model") in MODELS:
            out["learning_rate"] = default_learning_rate(out["model"])
    return out


def diff_params(a: str, b: str) -> dict[str, tuple[Any, Any]]:
    """``train`` keys whose values differ between two runs or config files.

    A key missing on one side counts as its ``xdpx.config.TrainConfig``
    default, so a run's ``starter.yaml`` (non-default keys only) equals the
    run. Values are compared after coercion to the field's type.

    Args:
        a, b: run directories or YAML files (see ``load_run_params``).

    Returns:
        key -> (value in a, value in b), keys sorted; empty when equivalent.

    Raises:
        FileNotFoundError / ValueError: as ``load_run_params``.
    """
    pa, pb = _normalise(load_run_params(a)), _normalise(load_run_params(b))
    return {
        k: (pa.get(k), pb.get(k)) for k in sorted(pa.keys() | pb.keys()) if pa.get(k) != pb.get(k)
    }


# ---------------------------------------------------------------- aggregate
def aggregate_results(root: str, include: Sequence[str] = ()) -> pd.DataFrame:
    """One row per run under ``root``: its best validation row and the params that differ.

    Columns, in order: ``run`` (path relative to ``root``; ``.`` for ``root``
    itself), ``best_update``, ``best_epoch``, ``best_samples_seen``,
    ``valid_<metric>`` for each metric of the best ``valid.log.tsv`` row
    (``best_valid_row``; a run without ``valid.log.tsv`` falls back to
    ``result.json`` ``best_valid`` with unknown epoch/samples), then one column
    per ``train`` key whose value differs between the selected runs (defaults
    filled in as in ``diff_params``; lists shown as strings). ``save_dir`` is
    left out: ``run`` already names the run.

    Rows are sorted best first by ``valid_<major_metric>`` honouring the
    metric's direction, where the major metric is the one most runs use;
    runs without a score come last.

    Args:
        root: directory holding runs (see ``find_runs``).
        include: keep only runs whose relative path contains every one of these words.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    runs = [r for r in find_runs(root) if all(w in _rel(root, r) for w in include)]
    rows: list[dict[str, Any]] = []
    params: list[dict[str, Any]] = []
    majors: list[str] = []
    for run in runs:
        valid_log = read_log(run, "valid", required=False)
        result = read_result(run) or {}
        row: dict[str, Any] = {"run": _rel(root, run)}
        best = best_valid_row(run, valid_log)
        if best is not None:
            row.update(
                best_update=int(best["update"]),
                best_epoch=int(best["epoch"]),
                best_samples_seen=int(best["samples_seen"]),
            )
            metrics = {
                k: v
                for k, v in best.items()
                if k not in POSITION_COLUMNS and not str(k).startswith("best_")
            }
        else:
            row.update(
                best_update=result.get("best_update"), best_epoch=None, best_samples_seen=None
            )
            metrics = dict(result.get("best_valid") or {})
        row.update({f"valid_{k}": v for k, v in metrics.items()})
        rows.append(row)
        section = _run_train_section(run)
        params.append(_normalise(section or {}))
        major = major_metric_of(run, valid_log)
        if major:
            majors.append(major)
    table = pd.DataFrame(rows, columns=["run", "best_update", "best_epoch", "best_samples_seen"])
    if rows:
        table = pd.DataFrame(rows)
        for c in ("best_update", "best_epoch", "best_samples_seen"):
            table[c] = table[c].astype("Int64")
    keys = sorted({k for p in params for k in p} - {"save_dir"})
    varying = [k for k in keys if len({json.dumps(p.get(k), sort_keys=True) for p in params}) > 1]
    for k in varying:
        table[k] = [
            json.dumps(p.get(k)) if isinstance(p.get(k), (list, dict)) else p.get(k) for p in params
        ]
    major = max(dict.fromkeys(majors), key=majors.count) if majors else None
    if major and f"valid_{major}" in table.columns:
        score = pd.to_numeric(table[f"valid_{major}"], errors="coerce") * METRIC_DIRECTIONS[major]
        order = np.argsort(-score.fillna(-np.inf).to_numpy(), kind="stable")
        table = table.iloc[order].reset_index(drop=True)
    return table


def write_aggregate(root: str, out_tsv: str, include: Sequence[str] = ()) -> str:
    """Write ``aggregate_results(root, include)`` to ``out_tsv`` (TSV, atomic); returns the path."""
    table = aggregate_results(root, include)
    io.write_text(out_tsv, table.to_csv(sep="\t", index=False))
    return out_tsv


# ---------------------------------------------------------------- cleaning
def _debris(run: str, names: set[str]) -> list[str]:
    """Leftovers of interrupted atomic directory writes in ``run``.

    ``<name>.old-<hex8>`` (``io.replace_dir``'s renamed-aside copy) only while
    ``<name>/`` exists: a lone ``last.old-*`` is the complete previous ``last``
    that ``find_resumable`` falls back to, so it is kept (with a warning).
    ``.<name>.tmp-<hex8>`` (``io.tmp_sibling``) is always removed.
    """
    out = []
    for name in sorted(names):
        old, tmp = _OLD.match(name), _TMP.match(name)
        if tmp:
            out.append(name)
        elif old:
            if old.group("name") in names:
                out.append(name)
            else:
                log.warning(
                    "%s: keeping %s: %s/ is missing, so it is the only complete copy",
                    run,
                    name,
                    old.group("name"),
                )
    return out


def clean_checkpoints(root: str, dry: bool = False) -> list[str]:
    """Remove every ``checkpoint-<update>/`` but the best and the last, plus write debris.

    For each run under ``root`` (``find_runs``):

    * the best checkpoint is the one of the best ``valid.log.tsv`` row by the
      run's ``major_metric`` (``result.json``, else ``params.yaml``) honouring
      its direction (``loss``: lower is better); ``best/`` and
      ``result.json`` ``best_update`` are not trusted;
    * the last is the ``checkpoint-<update>/`` with the highest update;
    * a run without ``valid.log.tsv`` (or without a known major metric) keeps
      all its checkpoints (a warning is logged);
    * ``best/`` and ``last/`` are never removed; debris of interrupted writes
      (``<name>.old-*`` while ``<name>/`` exists, ``.<name>.tmp-*``) is.

    Do not run it on a run that is still training: its in-flight temp
    directories would be removed.

    Args:
        root: directory holding runs (local path or fsspec URL).
        dry: only list what would be removed.

    Returns:
        The removed (with ``dry``: to-be-removed) directory paths, sorted.

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    doomed: list[str] = []
    for run in find_runs(root):
        fs, base = _fs_root(run)
        names = {
            str(e["name"]).rstrip("/").rsplit("/", 1)[-1]
            for e in fs.ls(base, detail=True)
            if e["type"] == "directory"
        }
        remove = _debris(run, names)
        checkpoints = {int(m.group(1)): n for n in names if (m := _CHECKPOINT.match(n))}
        if checkpoints:
            valid_log = read_log(run, "valid", required=False)
            metric = major_metric_of(run, valid_log) if valid_log is not None else None
            best = best_valid_row(run, valid_log, trust_result=False) if metric else None
            if best is None:
                log.warning(
                    "%s: no valid.log.tsv rows with a known major metric; keeping all %d checkpoints",
                    run,
                    len(checkpoints),
                )
            else:
                keep = {max(checkpoints), int(best["update"])}
                if int(best["update"]) not in checkpoints:
                    log.warning(
                        "%s: the best update %d (by %s) has no %s/; keeping the last only",
                        run,
                        int(best["update"]),
                        metric,
                        RunDir(run).checkpoint(int(best["update"])),
                    )
                remove += [n for u, n in checkpoints.items() if u not in keep]
        assert not {BEST, LAST} & set(remove)
        doomed += [io.join(run, n) for n in remove]
    doomed.sort()
    if not dry:
        for path in doomed:
            io.rm(path, recursive=True)
            log.info("removed %s", path)
    return doomed
