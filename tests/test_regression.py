"""Regression on STS-B's real labels, its 0-5 similarity scores: prepro keeps them as numbers
(``prepro.label_type: score``), ``train.task: regression`` fits one output by squared error
(``xdpx.train.objectives.Regression``, no edit of the trainer), evaluate reports Pearson,
Spearman and MSE, predict writes a score column."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import pearsonr, spearmanr

from stages import evaluate, export, predict, prepro, train
from studies.corpora import materialize_stsb_scores
from xdpx.config import (
    EvaluateConfig,
    ExportConfig,
    PredictConfig,
    PreproConfig,
    TrainConfig,
    load_params,
)
from xdpx.data import DataError, load_split

pytestmark = pytest.mark.integration

PAIRS = {"text_column": "text1", "text2_column": "text2", "control_chars": "strip"}


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False, dtype=str)


@pytest.fixture(scope="module")
def stsb(tmp_path_factory):
    """STS-B with its scores: the first 2,000 train pairs, the first 500 of dev and test."""
    root = tmp_path_factory.mktemp("stsb-scores")
    full, raw = root / "full", root / "raw"
    materialize_stsb_scores(str(full))
    raw.mkdir()
    for split, n in (("train", 2000), ("dev", 500), ("test", 500)):
        _read(full / f"{split}.tsv").head(n).to_csv(
            raw / f"{split}.tsv", sep="\t", index=False, quoting=csv.QUOTE_NONE
        )
    data = root / "prepared"
    prepro.run(PreproConfig(data_source=str(raw), data_dir=str(data), label_type="score", **PAIRS))
    return raw, data


def test_prepro_keeps_the_scores_as_float32(stsb):
    raw, data = stsb
    meta = json.loads((data / "meta.json").read_text())
    assert meta["labels"] == ["score"] and meta["num_labels"] == 1
    assert meta["splits"]["train"]["label_counts"] == [2000] and meta["conflicts"] is None
    for split in ("train", "dev", "test"):
        gold = _read(raw / f"{split}.tsv")["label"].astype(float).to_numpy(np.float32)
        labels = load_split(str(data), split).labels
        assert labels.dtype == np.float32 and np.array_equal(labels, gold), split
    # dev and test hold scores that train never has (no target map to fall outside of)
    train_scores = set(_read(raw / "train.tsv")["label"])
    assert set(_read(raw / "dev.tsv")["label"]) - train_scores


def test_a_label_that_is_not_a_number_names_file_and_line(stsb, tmp_path):
    raw, _ = stsb
    bad = tmp_path / "raw"
    bad.mkdir()
    for split in ("train", "dev"):
        lines = (raw / f"{split}.tsv").read_text(encoding="utf-8").splitlines()
        if split == "dev":
            lines[7] = lines[7].rsplit("\t", 1)[0] + "\tvery similar"  # line 8
        (bad / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    cfg = dict(data_source=str(bad), data_files={"train": "train.tsv", "dev": "dev.tsv"}, **PAIRS)
    with pytest.raises(DataError, match=r"dev\.tsv:8: label 'very similar' .* not a finite number"):
        prepro.run(PreproConfig(data_dir=str(tmp_path / "out"), label_type="score", **cfg))
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_task_and_labels_must_agree(stsb, tmp_path):
    _, data = stsb
    with pytest.raises(ValueError, match="set train.task=regression"):
        train.run(TrainConfig(data_dir=str(data), save_dir=str(tmp_path / "a"), model="match_ngram"))  # fmt: skip
    with pytest.raises(Exception, match="major_metric=pearson"):
        load_params(None, ["train.task=regression"])
    with pytest.raises(Exception, match="target_map_file and special_targets apply to label_type=class"):  # fmt: skip
        PreproConfig(label_type="score", special_targets=["0"])


@pytest.fixture(scope="module")
def regression_run(stsb, tmp_path_factory):
    raw, data = stsb
    run = tmp_path_factory.mktemp("reg") / "run"
    result = train.run(
        TrainConfig(
            data_dir=str(data), save_dir=str(run), model="match_ngram", task="regression",
            major_metric="pearson", threads=1,
        )
    )  # fmt: skip
    return raw, data, run, result


def test_regression_trains_and_evaluate_and_predict_agree_with_the_raw_scores(
    regression_run, tmp_path
):
    raw, data, run, result = regression_run
    valid = pd.read_csv(run / "valid.log.tsv", sep="\t")
    assert list(valid.columns[3:6]) == ["pearson", "spearman", "mse"]
    assert result.best_score == pytest.approx(valid["pearson"].max(), abs=1e-6)
    train_log = pd.read_csv(run / "train.log.tsv", sep="\t")
    assert train_log["accuracy"].isna().all()  # no accuracy for scores
    assert train_log["loss"].iloc[-1] < train_log["loss"].iloc[0]
    metrics_file = tmp_path / "metrics.json"
    ev = evaluate.run(
        EvaluateConfig(
            checkpoint=f"{run}/<best>", data_dir=str(data), splits=["dev"],
            metrics_file=str(metrics_file), confusion_png=str(tmp_path / "c.png"),
            curve_png=str(tmp_path / "curve.png"),
        )
    )  # fmt: skip
    dev = json.loads(metrics_file.read_text())["dev"]
    assert set(dev) == {"pearson", "spearman", "mse"} and dev == ev.metrics["dev"]
    assert dev["pearson"] == pytest.approx(result.best_score, abs=1e-6)
    # 2,000 train pairs: clearly learned (the whole train split: 0.77, docs/trainer.md)
    assert dev["pearson"] > 0.5 and dev["spearman"] > 0.5
    assert not (tmp_path / "c.png").exists()  # no confusion matrix for scores
    # predict on the raw dev file: its score column against the raw scores, computed here
    out = tmp_path / "pred.tsv"
    predict.run(PredictConfig(checkpoint=f"{run}/<best>", data_file=str(raw / "dev.tsv"), out_file=str(out)))  # fmt: skip
    pred = pd.read_csv(out, sep="\t", quoting=csv.QUOTE_NONE)
    assert list(pred.columns)[-1] == "score" and "pred_label" not in pred.columns
    gold = _read(raw / "dev.tsv")["label"].astype(float)
    assert pearsonr(gold, pred["score"])[0] == pytest.approx(dev["pearson"], abs=1e-4)
    assert spearmanr(gold, pred["score"])[0] == pytest.approx(dev["spearman"], abs=1e-4)


def test_export_has_parity_and_serving_refuses_scores(regression_run, tmp_path):
    _, data, run, _ = regression_run
    out = tmp_path / "export"
    exported = export.run(
        ExportConfig(
            checkpoint=f"{run}/<best>",
            data_dir=str(data),
            out_dir=str(out),
            num_samples=64,
            latency_runs=1,
        )  # fmt: skip
    )
    assert exported.parity["num_samples"] == 64  # the one output, onnxruntime vs eager
    latency = json.loads((out / "latency.json").read_text())["onnx"]
    assert (latency["runs"], latency["warmup"]) == (1, 1)  # export.latency_runs
    with pytest.raises(ValueError, match="quantize=int8 reports a classifier"):
        export.run(ExportConfig(checkpoint=f"{run}/<best>", data_dir=str(data), out_dir=str(tmp_path / "q"), quantize="int8"))  # fmt: skip
    from xdpx.serving.repl import Predictor

    with pytest.raises(ValueError, match="regression model .* score texts with the predict stage"):
        Predictor(str(run))
