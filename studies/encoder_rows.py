"""The suite's encoder rows: a fine-tuned encoder (MiniLM, e5) per corpus, its config chosen on dev
over a small grid of learning rates and epochs, scored on test and summarised over seeds
(``xdpx suite --encoder``); and the prepro config of a corpus that every row shares."""

from __future__ import annotations

import csv
import logging
import math
import statistics
import time
from collections.abc import Sequence
from typing import Any

from stages.registry import STAGES
from studies.corpora import Corpus, materialize, redraw_without_test
from xdpx import io
from xdpx.config import EvaluateConfig, Params, PreproConfig
from xdpx.data.meta import PreparedMeta
from xdpx.rundir import RunDir

log = logging.getLogger("xdpx.suite")


def corpus_prepro(
    params: Params, corpus: Corpus, raw: str, prepared: str, **extra: Any
) -> PreproConfig:
    """``params.prepro`` pointed at the corpus's files: ``raw/{train,dev,test}.tsv`` (with a
    header), its columns and the prepro keys it needs (``corpus.prepro``), written to
    ``prepared``; ``extra`` keys last."""
    return params.prepro.model_copy(
        update={
            "data_source": raw,
            "data_dir": prepared,
            "data_files": {s: f"{s}.tsv" for s in ("train", "dev", "test")},
            "format": "tsv",
            "header": True,
            **corpus.columns,
            **corpus.prepro,
            **extra,
        }
    )


#: ``--encoder`` shorthands: name -> preset params file (relative to the project root).
ENCODER_PRESETS: dict[str, str] = {
    "minilm": "params/bert-minilm.yaml",
    "e5": "params/bert-e5.yaml",
}


def resolve_encoder(spec: str) -> tuple[str, str]:
    """``(name, params file)`` of an ``--encoder`` value: a shorthand of
    :data:`ENCODER_PRESETS` (``e5``) or a params file (``params/bert-e5.yaml``; its name is
    the file's stem without ``bert-``, so both spellings give ``e5``).

    Raises:
        ValueError: neither a shorthand nor a ``.yaml``/``.yml`` file name.
    """
    if spec in ENCODER_PRESETS:
        return spec, ENCODER_PRESETS[spec]
    if not spec.endswith((".yaml", ".yml")):
        raise ValueError(
            f"--encoder {spec!r}: not one of {', '.join(ENCODER_PRESETS)} nor a params file (.yaml)"
        )
    stem = spec.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    return stem.removeprefix("bert-"), spec


def pick_encoder_config(grid: dict[str, dict[str, float]]) -> tuple[str, str]:
    """The ``(learning rate, epoch)`` keys of the best dev accuracy in ``grid`` (``{lr:
    {epoch: dev accuracy}}``, both keys strings as in the JSON); ties: the first learning
    rate in ``grid``'s order, then the earlier epoch.

    Raises:
        ValueError: the grid holds no dev score.
    """
    points = [(lr, ep, dev) for lr, curve in grid.items() for ep, dev in curve.items()]
    if not points:
        raise ValueError("the encoder's dev grid is empty (no evaluation ran)")
    best = max(points, key=lambda p: p[2])[2]
    lr, ep, _ = next(p for p in points if p[2] == best)
    return lr, ep


def _lr_key(lr: float) -> str:
    return f"{lr:g}"


def _epoch_number(key: str) -> int | float:
    """A grid's epoch key as a number: ``"2"`` -> 2 (an epoch's end), ``"0.33"`` -> 0.33
    (an evaluation inside the first epoch, :func:`encoder_row_from_run`)."""
    return int(key) if float(key).is_integer() and "." not in key else float(key)


def run_encoder_row(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    work_dir: str,
    learning_rates: Sequence[float] | None = None,
    epochs: int | None = None,
    limit: int | None = None,
    written: dict[str, int] | None = None,
    dev_only: bool = False,
    keep_all: bool = False,
) -> dict[str, Any]:
    """One fine-tuned-encoder row: prepro with the preset, a dev grid of learning rate x
    epochs, test for the chosen point only (see the module docstring).

    Args:
        corpus: the corpus.
        params: the preset's resolved params (``train.model: hf_classifier``, ``prepro.
            tokenizer: hf``); paths and columns are replaced per corpus.
        name: the encoder's name in the results (``e5``).
        seed: split seed and ``train.seed``.
        work_dir: this corpus and seed's directory: ``raw/`` (reused when ``written``),
            ``encoder-<name>/prepared``, ``encoder-<name>/lr-<lr>/`` (one run per rate),
            ``encoder-<name>/metrics.json``.
        learning_rates: the grid's rates (None: the preset's ``train.learning_rate`` alone).
        epochs: epochs of each run, each ending with a dev evaluation (None: the preset's
            ``train.max_epoch``).
        limit: at most this many rows per split (smoke runs).
        written: rows per split of raw files already under ``work_dir/raw`` (the n-gram
            row's); None = materialise the corpus there.
        dev_only: as :func:`run_corpus_seed` (splits redrawn from train + dev).
        keep_all: keep every grid run's checkpoints (default: only the chosen run's; a
            12-layer encoder's checkpoint is ~0.5 GB).

    Returns:
        ``{"corpus", "seed", "encoder", "dev_only", "n", "params" (the preset's
        ``train.pretrained_model``, ``prepro.max_len``, ``prepro.truncation``, ``train.
        batch_size``, ``train.threads``), "model", "pair_encoding" ("joint": a cross-encoder;
        None for single texts), "dev", "test", "macro_f1" (the chosen checkpoint's, from
        evaluate), "chosen": {"learning_rate", "epoch"}, "grid": {lr: {epoch: dev}},
        "prepro_seconds", "prepro_train_seconds" (prepro + the chosen run's training),
        "grid_seconds" (prepro + every run's training), "seconds" (all, evaluate
        included)}``; accuracies are fractions in [0, 1], times wall seconds.

    Raises:
        ValueError: the preset's model is not ``hf_classifier``, or its tokenizer not hf.
    """
    if params.train.model != "hf_classifier" or params.prepro.tokenizer != "hf":
        raise ValueError(
            f"encoder {name!r}: the preset must set train.model: hf_classifier and "
            f"prepro.tokenizer: hf (got {params.train.model}, {params.prepro.tokenizer})"
        )
    raw = io.join(work_dir, "raw")
    root = io.join(work_dir, f"encoder-{name}")
    prepared = io.join(root, "prepared")
    counts = written if written is not None else materialize(corpus.name, raw, seed, limit)
    if dev_only and written is None:
        counts = redraw_without_test(raw, seed)
    rates = list(learning_rates or [params.train.learning_rate])
    n_epochs = epochs or params.train.max_epoch
    start = time.perf_counter()
    STAGES["prepro"].run(corpus_prepro(params, corpus, raw, prepared))
    prepro_seconds = time.perf_counter() - start
    grid: dict[str, dict[str, float]] = {}
    train_seconds: dict[str, float] = {}
    run_dirs: dict[str, str] = {}
    for lr in rates:
        key = _lr_key(lr)
        run_dirs[key] = io.join(root, f"lr-{key}")
        events: list[Any] = []
        t0 = time.perf_counter()
        STAGES["train"].run(
            params.train.model_copy(
                update={
                    "data_dir": prepared,
                    "save_dir": run_dirs[key],
                    "overwrite": True,
                    "auto_suffix": False,
                    "resume": False,
                    "resume_from": None,
                    "seed": seed,
                    "learning_rate": lr,
                    "max_epoch": n_epochs,
                    "max_update": None,
                    "max_samples": None,
                    "eval_interval": -1,
                    "eval_interval_warmup": 0,
                    "valid_subset": "dev",
                    "major_metric": "accuracy",
                    "tolerance": max(n_epochs, params.train.tolerance),
                }
            ),
            on_eval=events.append,
        )
        train_seconds[key] = time.perf_counter() - t0
        grid[key] = {str(e.epoch): e.metrics["accuracy"] for e in events}
        log.info("%s seed %d: %s lr %s: dev by epoch %s", corpus.name, seed, name, key, grid[key])  # fmt: skip
    lr_key, epoch = pick_encoder_config(grid)
    if not keep_all:
        for key, path in run_dirs.items():
            if key != lr_key:
                io.rm(path, recursive=True)
    return score_encoder_row(
        corpus, params, name, seed, dev_only, counts, prepared, root, run_dirs[lr_key], grid,
        prepro_seconds, train_seconds, time.perf_counter() - start,
    )  # fmt: skip


def score_encoder_row(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    dev_only: bool,
    counts: dict[str, int],
    prepared: str,
    root: str,
    run_dir: str,
    grid: dict[str, dict[str, float]],
    prepro_seconds: float,
    train_seconds: dict[str, float],
    seconds_so_far: float,
    note: str | None = None,
) -> dict[str, Any]:
    """The row of the grid point chosen on dev (:func:`pick_encoder_config`): its run's best
    checkpoint (``run_dir``) scored on dev and test by ``stages.evaluate``, the only time the
    test file is read. ``grid``/``train_seconds`` are keyed by learning rate
    (:func:`_lr_key`); the other arguments as :func:`run_encoder_row`'s.

    Raises:
        RuntimeError: the best checkpoint's dev score is not the grid's best (the run's
            ``<best>`` is another checkpoint than the one the grid chose).
    """
    start = time.perf_counter()
    lr_key, epoch = pick_encoder_config(grid)
    evaluated = STAGES["evaluate"].run(
        EvaluateConfig(
            checkpoint=RunDir(run_dir).best_alias,
            data_dir=prepared,
            splits=["dev", "test"],
            metrics_file=io.join(root, "metrics.json"),
            confusion_png=io.join(root, "confusion.png"),
        )
    )
    metrics = evaluated.metrics
    # 1e-6: a grid read from valid.log.tsv (encoder_row_from_run) holds 6 digits
    if not math.isclose(metrics["dev"]["accuracy"], grid[lr_key][epoch], abs_tol=1e-6):
        raise RuntimeError(
            f"{corpus.name} {name}: the best checkpoint of lr {lr_key} scores dev "
            f"{metrics['dev']['accuracy']:.4f}, its epoch {epoch} scored {grid[lr_key][epoch]:.4f}"
        )
    return {
        "corpus": corpus.name,
        "seed": seed,
        "encoder": name,
        "dev_only": dev_only,
        "n": counts,
        "params": {
            "pretrained_model": params.train.pretrained_model,
            "max_len": params.prepro.max_len,
            "truncation": params.prepro.truncation,
            "batch_size": params.train.batch_size,
            "threads": params.train.threads,
        },
        "model": params.train.model,
        "pair_encoding": "joint" if corpus.text2 else None,
        "dev": metrics["dev"]["accuracy"],
        "test": metrics["test"]["accuracy"],
        "macro_f1": metrics["test"]["macro_f1"],
        "chosen": {"learning_rate": float(lr_key), "epoch": _epoch_number(epoch)},
        "grid": grid,
        "prepro_seconds": round(prepro_seconds, 1),
        "prepro_train_seconds": round(prepro_seconds + train_seconds[lr_key], 1),
        "grid_seconds": round(prepro_seconds + sum(train_seconds.values()), 1),
        "seconds": round(seconds_so_far + time.perf_counter() - start, 1),
        **({"note": note} if note else {}),
    }


def encoder_row_from_run(
    corpus: Corpus,
    params: Params,
    name: str,
    seed: int,
    prepared: str,
    run_dir: str,
    prepro_seconds: float,
    train_seconds: float,
    note: str,
) -> dict[str, Any]:
    """An encoder row from a fine-tuning run made outside the suite (``xdpx train`` with the
    preset on the corpus's seed-``seed`` split, e.g. a run taking most of an hour on CPU):
    the dev grid is the run's ``valid.log.tsv`` (one learning rate; the points are the
    evaluations, keyed by epochs done, ``samples_seen / n_train`` to 2 decimals), then
    :func:`score_encoder_row`. ``note`` says how the run was made (shown in the table).

    Raises:
        DataError: the run has no ``valid.log.tsv`` rows.
    """
    from xdpx.data import DataError

    n = {s: PreparedMeta.read(prepared).split(s).rows for s in ("train", "dev", "test")}
    log_file = RunDir(run_dir).valid_log
    with io.open(log_file, "r") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows:
        raise DataError(f"{log_file}: no evaluation rows")
    curve = {f"{int(r['samples_seen']) / n['train']:.2f}": float(r["accuracy"]) for r in rows}
    lr_key = _lr_key(params.train.learning_rate)
    return score_encoder_row(
        corpus, params, name, seed, False, n, prepared, run_dir, run_dir, {lr_key: curve},
        prepro_seconds, {lr_key: train_seconds}, prepro_seconds + train_seconds, note,
    )  # fmt: skip


def summarize_encoder(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One encoder on one corpus: means over its runs (seeds).

    Returns:
        ``{"k", "test", "dev", "macro_f1", "prepro_train_seconds", "grid_seconds"}`` (a
        mean is None when a run lacks it: an older run without macro-F1) plus ``"chosen"``
        (each run's), ``"note"`` (the first run's, if any) and ``"params"`` (the first
        run's).
    """
    return {
        "k": len(runs),
        **{
            key: _mean_of(r.get(key) for r in runs)
            for key in ("test", "dev", "macro_f1", "prepro_train_seconds", "grid_seconds")
        },
        "chosen": [r.get("chosen") for r in runs],
        "params": runs[0].get("params"),
        **({"note": runs[0]["note"]} if runs[0].get("note") else {}),
    }


def _mean_of(values: Any) -> float | None:
    """Mean of ``values``, or None when any is missing."""
    values = list(values)
    return None if not values or None in values else statistics.fmean(values)
