"""k-fold cross-validation as a run: ``xdpx cv`` (folds one after another, in this process)
and the Prefect flow ``xdpx_cv`` (folds at the same time, one process each).

The data half (stratified folds of the train split, a prepared data directory per fold, the
summary over folds) is :mod:`xdpx.cv`; this module runs the stages on it, through
``stages.registry.STAGES`` as functions with config objects, like every orchestrator:
for fold k, ``STAGES["train"].run`` on ``<cv.save_dir>/fold-<k>/data`` (train = the other
folds, early stopping and the best checkpoint on ``dev``) into ``fold-<k>/model``, then
``STAGES["evaluate"].run`` of its best checkpoint on the ``heldout`` split into
``fold-<k>/metrics.json``; each fold's summary goes to ``fold-<k>/fold.json`` and the
whole run's to ``cv.report`` (``reports/cv.json``, :func:`xdpx.cv.build_report`).

Why the flow runs each fold in its own process: the stages are pure functions of their
configs, but training uses process-wide torch state: ``torch.manual_seed`` (parameter init,
and again before every update for dropout, ``xdpx.train.trainer``) seeds the one global
generator, and ``torch.set_num_threads`` (``train.threads``) sets the one intra-op pool.
Two folds training in two threads of one process would draw from the same generator in an
order set by thread timing (a fold's result would depend on the other folds and would not
reproduce) and would fight over the thread count. So each fold task (a thread of the flow's
``ThreadPoolTaskRunner``) starts ``python -m flows.cv fold K`` with the resolved params as
JSON on stdin, waits for it, and reads back its ``fold.json``; the child's output goes to
``fold-<k>/fold.log``. A fold process gets ``train.threads`` = cores / folds running at once
when ``train.threads`` is null (and ``OMP_NUM_THREADS`` the same, for evaluate).

Run it::

    xdpx cv params.yaml --folds 5                                   # sequential
    python -m flows.cv --params params.yaml cv.folds=5              # Prefect, folds at once
    python -m flows.cv cv.folds=5 --workers 2 train.max_epoch=3     # at most 2 at a time
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

from flows.pipeline import StageError
from stages.registry import STAGES
from xdpx import io
from xdpx.config import ConfigError, EvaluateConfig, Params, TrainConfig, load_params
from xdpx.cv import (
    HELDOUT,
    build_report,
    check_params,
    fold_paths,
    prepare_folds,
    write_report,
)
from xdpx.data.meta import PreparedMeta
from xdpx.rundir import RunDir

__all__ = [
    "FoldError",
    "fold_configs",
    "run_fold",
    "run_cv",
    "run_fold_process",
    "xdpx_cv",
    "main",
]

log = logging.getLogger("xdpx.cv")


class FoldError(RuntimeError):
    """A fold's process failed; the message names the fold, its exit status, the last
    error line of its output and the log file holding the rest."""


def fold_configs(params: Params, fold: int) -> tuple[TrainConfig, EvaluateConfig]:
    """The train and evaluate configs of fold ``fold`` (0-based): ``params.train`` with the
    fold's data and run directory, and an evaluate of its best checkpoint on ``heldout``.

    Raises:
        ConfigError: the train section is not valid with these paths.
    """
    paths = fold_paths(params.cv.save_dir, fold)
    body = params.train.model_dump()
    body.update(
        data_dir=paths.data,
        save_dir=paths.model,
        train_subset="train",  # the fold's other rows, whatever the folded split was called
        overwrite=False,
        auto_suffix=False,
    )
    try:
        train = TrainConfig.model_validate(body)
    except ValueError as e:
        raise ConfigError(f"cv fold {fold}: invalid train config: {e}") from None
    evaluate = EvaluateConfig(
        checkpoint=RunDir(paths.model).best_alias,
        data_dir=paths.data,
        splits=[HELDOUT],
        batch_size=params.evaluate.batch_size,
        metrics_file=paths.metrics_file,
        confusion_png=paths.confusion_png,
    )
    return train, evaluate


def run_fold(params: Params, fold: int) -> dict[str, Any]:
    """Train and evaluate fold ``fold`` in this process; its data must be prepared
    (:func:`xdpx.cv.prepare_folds`).

    Returns:
        ``{"fold", "n_train", "n_heldout", "heldout": {metric: value}, "best_valid":
        {metric: value} (dev, at the best checkpoint), "best_update", "num_updates",
        "epochs", "model_dir", "metrics_file", "started", "ended" (Unix times, seconds),
        "seconds"}``, also written to ``fold-<k>/fold.json``.

    Raises:
        What ``stages.train.run`` / ``stages.evaluate.run`` raise.
    """
    paths = fold_paths(params.cv.save_dir, fold)
    train_cfg, eval_cfg = fold_configs(params, fold)
    started = time.time()
    trained = STAGES["train"].run(train_cfg)
    evaluated = STAGES["evaluate"].run(eval_cfg)
    ended = time.time()
    meta = PreparedMeta.read(paths.data)
    result = {
        "fold": fold,
        "n_train": meta.splits["train"].rows,
        "n_heldout": meta.splits[HELDOUT].rows,
        "heldout": evaluated.metrics[HELDOUT],
        "best_valid": dict(trained.best_valid),
        "best_update": trained.best_update,
        "num_updates": trained.num_updates,
        "epochs": trained.epochs,
        "model_dir": paths.model,
        "metrics_file": paths.metrics_file,
        "started": started,
        "ended": ended,
        "seconds": round(ended - started, 1),
    }
    io.write_text(paths.result, json.dumps(result, indent=2) + "\n")
    return result


def run_cv(
    params: Params, on_fold: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """``xdpx cv``: prepare the folds, run them one after another here, write ``cv.report``.

    Args:
        params: resolved params (``train``, ``evaluate``'s batch size, ``cv``).
        on_fold: called with each fold's result as it finishes (progress lines).

    Returns:
        The report (:func:`xdpx.cv.build_report`), also written to ``params.cv.report``.

    Raises:
        ConfigError: train settings CV cannot honour (:func:`xdpx.cv.check_params`).
        FileNotFoundError: no prepared data at ``train.data_dir``.
        FileExistsError: ``cv.save_dir`` holds files and ``cv.overwrite`` is false.
        DataError: unlabelled rows, or a class with fewer rows than ``cv.folds``.
        And what the train and evaluate stages raise.
    """
    check_params(params)
    start = time.perf_counter()
    prepare_folds(params)
    results = []
    for k in range(params.cv.folds):
        results.append(run_fold(params, k))
        if on_fold is not None:
            on_fold(results[-1])
    report = build_report(params, results, time.perf_counter() - start)
    write_report(params.cv.report, report)
    return report


def _threads_per_fold(params: Params, at_once: int) -> Params:
    """``train.threads`` = cores // folds running at once (>= 1) when it is null."""
    if params.train.threads is not None:
        return params
    threads = max(1, (os.cpu_count() or 1) // max(1, at_once))
    train = params.train.model_copy(update={"threads": threads})
    return params.model_copy(update={"train": train})


def run_fold_process(params: Params, fold: int) -> dict[str, Any]:
    """Run :func:`run_fold` in a new process (``python -m flows.cv fold FOLD``, the params
    as JSON on stdin) and return its result; its output goes to ``fold-<k>/fold.log``.

    Raises:
        FoldError: the process exited with a non-zero status.
    """
    paths = fold_paths(params.cv.save_dir, fold)
    env = dict(os.environ)
    if params.train.threads is not None:
        env["OMP_NUM_THREADS"] = str(params.train.threads)
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cv", "fold", str(fold)],
        input=params.model_dump_json(),
        capture_output=True,
        text=True,
        env=env,
    )
    io.write_text(paths.log, proc.stdout + proc.stderr)
    if proc.returncode != 0:
        lines = [x for x in proc.stderr.strip().splitlines() if x.strip()]
        errors = [x for x in lines if x.startswith("error: ")]
        last = (errors or lines or ["(no output)"])[-1].removeprefix("error: ")
        raise FoldError(
            f"cv fold {fold} failed (exit status {proc.returncode}): {last} (log: {paths.log})"
        )
    return json.loads(io.read_text(paths.result))


@task(name="cv-prepare", task_run_name="prepare folds", cache_policy=NO_CACHE)
def prepare_task(params: Params) -> list[dict[str, Any]]:
    """:func:`xdpx.cv.prepare_folds` as a task; returns each fold's data summary."""
    try:
        folds = prepare_folds(params)
    except Exception as e:
        raise StageError.wrap("cv prepare", e) from e
    return [vars(f) for f in folds]


@task(name="cv-fold", task_run_name="fold {fold}", cache_policy=NO_CACHE)
def fold_task(params: Params, fold: int) -> dict[str, Any]:
    """One fold's train -> evaluate, in its own process (:func:`run_fold_process`)."""
    try:
        result = run_fold_process(params, fold)
    except Exception as e:
        raise StageError.wrap(f"cv fold {fold}", e) from e
    get_run_logger().info(
        "fold %d: heldout %s (%.0f s)",
        fold,
        {k: round(v, 4) for k, v in result["heldout"].items()},
        result["seconds"],
    )
    return result


@task(name="cv-aggregate", task_run_name="aggregate", cache_policy=NO_CACHE)
def aggregate_task(params: Params, results: list[dict[str, Any]], seconds: float) -> dict:
    """The report over folds (:func:`xdpx.cv.build_report`), written to ``cv.report``."""
    report = build_report(params, results, seconds)
    write_report(params.cv.report, report)
    get_run_logger().info("cv over %d folds:\n%s", len(results), report["table"])
    return report


@flow(name="xdpx-cv", log_prints=True, task_runner=ThreadPoolTaskRunner())
def xdpx_cv(
    params: str = "params.yaml",
    overrides: list[str] | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Cross-validate the train config: prepare the folds, run every fold as a task at the
    same time (each in its own process, see the module docstring), then aggregate.

    Args:
        params: params file (relative to the working directory, or an fsspec URL).
        overrides: ``section.key=value`` strings applied after the file (``cv.folds=3``).
        workers: folds running at once (None: all of them). Fold k waits for fold
            k - workers, so the folds run in ``workers`` lanes.

    Returns:
        The report written to ``cv.report`` (:func:`xdpx.cv.build_report`).

    Raises:
        xdpx.config.ConfigError: bad params or overrides (before anything runs).
        StageError: preparing the folds or a fold failed (names the fold and the error).
    """
    cfg = load_params(params, overrides or [])
    check_params(cfg)
    if workers is not None and workers < 1:
        raise ConfigError(f"workers must be >= 1, got {workers}")
    at_once = min(workers or cfg.cv.folds, cfg.cv.folds)
    cfg = _threads_per_fold(cfg, at_once)
    start = time.perf_counter()
    prepare_task(cfg)
    futures: list[Any] = []
    for k in range(cfg.cv.folds):
        wait = [futures[k - at_once]] if k >= at_once else None
        futures.append(fold_task.submit(cfg, k, wait_for=wait))
    results = [f.result() for f in futures]
    return aggregate_task(cfg, results, time.perf_counter() - start)


def _fold_main(argv: list[str]) -> None:
    """``python -m flows.cv fold K`` with the params JSON on stdin: one fold, in this process."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if len(argv) != 1 or not argv[0].isdigit():
        print("error: usage: python -m flows.cv fold K  (params JSON on stdin)", file=sys.stderr)
        raise SystemExit(2)
    from xdpx.stage import USER_ERRORS

    try:
        params = Params.model_validate_json(sys.stdin.read())
        result = run_fold(params, int(argv[0]))
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(json.dumps(result))


def main(argv: list[str] | None = None) -> None:
    """``python -m flows.cv [--params params.yaml] [--workers N] [section.key=value ...]``.

    Runs the flow on Prefect's embedded server (nothing to start) and prints the table.
    Exits with status 2 and a one-line ``error: ...`` when the config is bad or a fold fails.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["fold"]:
        _fold_main(argv[1:])
        return
    params, workers = "params.yaml", None
    while argv[:1] and argv[0] in ("--params", "-p", "--workers"):
        if len(argv) < 2:
            print(f"error: {argv[0]} needs a value", file=sys.stderr)
            raise SystemExit(2)
        if argv[0] == "--workers":
            if not argv[1].isdigit() or int(argv[1]) < 1:
                print(
                    f"error: --workers needs a positive integer, got {argv[1]!r}", file=sys.stderr
                )
                raise SystemExit(2)
            workers = int(argv[1])
        else:
            params = argv[1]
        argv = argv[2:]
    try:
        report = xdpx_cv(params=params, overrides=list(argv), workers=workers)
    except (ConfigError, StageError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    print(report["table"])
    print(f"{report['folds']} folds in {report['seconds']:.0f} s")


if __name__ == "__main__":
    main()
