"""Stage ``evaluate``: metrics of a checkpoint on prepared splits.

Writes ``metrics_file`` (DVC metrics: ``{split: {accuracy, macro_f1, ...}}``; a regression
checkpoint, ``prepro.label_type: score``: ``{split: {pearson, spearman, mse}}``), a
confusion-matrix PNG of the last split (classification) and, when the checkpoint sits in a
run directory with a ``valid.log.tsv``, its validation curve (``curve_png``).
Scores come from ``xdpx.inference.predict_logits``, the code the trainer
validates with, so the dev score equals the best one logged in training.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from xdpx import io
from xdpx.checkpoint import beside_checkpoint, check_reader, load_checkpoint
from xdpx.config import EvaluateConfig
from xdpx.data import TARGET_MAP_FILE, PreparedMeta
from xdpx.data.lazy import LazySplit
from xdpx.inference import as_samples, predict_logits, probs_from_logits
from xdpx.metrics import (
    METRIC_DIRECTIONS,
    classification_metrics,
    confusion_matrix,
    regression_metrics,
)
from xdpx.rundir import RunDir, of_checkpoint, unalias
from xdpx.stage import stage_main
from xdpx.viz import confusion_figure, save_figure, valid_curve_figure

log = logging.getLogger("xdpx.evaluate")


class EvaluateResult(BaseModel):
    """Metrics per split and the files written.

    ``rows`` (not serialised: ``model_dump`` leaves it out) holds, per classification split,
    the row-aligned ``labels [n]`` and ``probs [n, num_labels]`` the metrics came from and the
    label ``names [num_labels]`` of their indices (the target map: its order is the data's), for a
    paired comparison of two checkpoints on the same texts
    (:func:`xdpx.metrics.paired_comparison`; the distillation ship rule).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    checkpoint: str
    metrics: dict[str, dict[str, float]]
    metrics_file: str
    confusion_png: str
    rows: dict[str, dict[str, np.ndarray]] = Field(default_factory=dict, exclude=True)


def check(cfg: EvaluateConfig) -> EvaluateConfig:
    """Pre-flight checks (``xdpx.checkpoint.check_reader``), before any work."""
    return check_reader("evaluate", cfg)


@io.stage("evaluate")
def run(cfg: EvaluateConfig) -> EvaluateResult:
    """Score ``cfg.checkpoint`` on ``cfg.splits`` of ``cfg.data_dir``.

    Raises:
        CheckpointError: missing/incomplete checkpoint or alias.
        ValueError: the data's target map differs from the checkpoint's.
    """
    cfg = check(cfg)
    ckpt = load_checkpoint(cfg.checkpoint)
    data_labels = io.read_text(io.join(cfg.data_dir, TARGET_MAP_FILE)).split()
    ckpt_labels = io.read_text(io.join(ckpt.path, TARGET_MAP_FILE)).split()
    if data_labels != ckpt_labels:
        raise ValueError(
            f"evaluate.data_dir {cfg.data_dir} has labels {data_labels} but checkpoint {ckpt.path} was trained on {ckpt_labels}"
        )
    pad_id = ckpt.model_config.get("pad_id", 0)
    score = PreparedMeta.read(ckpt.path).prepro.get("label_type", "class") == "score"
    metrics: dict[str, dict[str, float]] = {}
    rows: dict[str, dict[str, np.ndarray]] = {}
    cm = None
    bs = cfg.batch_size
    for split in cfg.splits:  # shard by shard: memory holds one shard's inputs
        shards = LazySplit(cfg.data_dir, split)
        parts = [
            (
                predict_logits(ckpt.model, as_samples(d.input_ids, d.input_ids2), bs, pad_id),
                d.labels,
            )
            for d in shards.iter_shards()
        ]
        shards.close()
        logits = np.concatenate([p for p, _ in parts])
        y = np.concatenate([y for _, y in parts])
        if score:  # regression: the one output is the score
            metrics[split] = regression_metrics(y, logits[:, 0])
        else:
            probs = probs_from_logits(logits)
            metrics[split] = classification_metrics(y, probs)
            rows[split] = {"labels": y, "probs": probs, "names": np.asarray(ckpt_labels)}
            cm = confusion_matrix(y, probs.argmax(1), labels=list(range(len(ckpt_labels))))
        log.info("%s: %s", split, {k: round(v, 4) for k, v in metrics[split].items()})
    io.write_text(cfg.metrics_file, json.dumps(metrics, indent=2) + "\n")
    if cm is not None:
        title = f"{cfg.splits[-1]}: accuracy {metrics[cfg.splits[-1]]['accuracy']:.4f}"
        save_figure(confusion_figure(cm, ckpt_labels, title), cfg.confusion_png)
    run_dir = of_checkpoint(ckpt.path)
    valid_log = run_dir.valid_log
    if io.exists(valid_log):
        df = pd.read_csv(io.open(valid_log), sep="\t")
        major = _major_metric(run_dir)
        if major in df.columns and len(df):
            # a config made by model_copy(update={"curve_png": None}) skipped the validator
            # that puts it beside confusion_png: not a file named "None" in the cwd
            curve = cfg.curve_png or io.join(io.dirname(cfg.confusion_png), "valid_curve.png")
            save_figure(valid_curve_figure(df, major, METRIC_DIRECTIONS[major]), curve)
    return EvaluateResult(
        checkpoint=ckpt.path,
        metrics=metrics,
        metrics_file=cfg.metrics_file,
        confusion_png=cfg.confusion_png,
        rows=rows,
    )


def beside(cfg: EvaluateConfig) -> dict[str, str]:
    """The outputs of an ad-hoc evaluation of ``cfg.checkpoint`` (not the pipeline's):
    ``<its run dir>/eval/{metrics.json, confusion.png, valid_curve.png}``
    (``xdpx.stage.beside_checkpoint``)."""
    out = of_checkpoint(unalias(cfg.checkpoint)).eval_dir
    return {
        "metrics_file": io.join(out, "metrics.json"),
        "confusion_png": io.join(out, "confusion.png"),
        "curve_png": io.join(out, "valid_curve.png"),
    }


def _major_metric(run_dir: RunDir) -> str:
    import yaml

    params = run_dir.params
    if io.exists(params):
        return (
            (yaml.safe_load(io.read_text(params)) or {})
            .get("train", {})
            .get("major_metric", "accuracy")
        )
    return "accuracy"


def main(argv: list[str] | None = None) -> EvaluateResult:
    """``python -m stages.evaluate [--params params.yaml] [evaluate.key=value ...]``.

    With a checkpoint other than the params' (the pipeline's), the outputs not given on the
    command line go under that checkpoint's run directory (:func:`beside`).
    """
    return stage_main(
        "evaluate",
        run,
        lambda r: "\n".join(
            f"{split}: " + "  ".join(f"{k}={v:.4f}" for k, v in m.items())
            for split, m in r.metrics.items()
        ),
        argv,
        check,
        lambda configs, args: beside_checkpoint("evaluate", configs, args, beside),
    )


if __name__ == "__main__":
    main()
