"""Integration: every stage on a stratified subset of the real corpus, in a temp dir."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
from onnx_check import onnx_vs_eager

from stages import evaluate, export, predict, train
from xdpx.checkpoint import CheckpointError
from xdpx.config import EvaluateConfig, ExportConfig, PredictConfig, TrainConfig

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def trained(real_subset, tmp_path_factory):
    raw, prepared = real_subset
    run_dir = str(tmp_path_factory.mktemp("runs") / "cnn")
    cfg = TrainConfig(
        data_dir=prepared,
        save_dir=run_dir,
        model="textcnn",
        max_epoch=3,
        eval_interval=10,
        embedding_dim=64,
        num_filters=32,
    )
    result = train.run(cfg)
    return raw, prepared, run_dir, result


def test_train_writes_run_directory(trained):
    _, _, run_dir, result = trained
    for name in (
        "best/model.safetensors",
        "best/config.json",
        "best/vocab.txt",
        "best/target_map.txt",
        "best/meta.json",
        "last/model.safetensors",
        "train.log.tsv",
        "valid.log.tsv",
        "params.yaml",
        "starter.yaml",
        "repro.json",
        "result.json",
        "run.json",
        "time.log.tsv",
        "dvclive/metrics.json",
    ):
        assert (pd.io.common.Path(run_dir) / name).exists(), name
    starter = (pd.io.common.Path(run_dir) / "starter.yaml").read_text()
    assert "model: textcnn" in starter and "learning_rate" not in starter  # only non-defaults
    assert result.best_update is not None


def test_train_refuses_to_overwrite_a_run(trained):
    _, prepared, run_dir, _ = trained
    with pytest.raises(FileExistsError, match="already holds a run"):
        train.run(TrainConfig(data_dir=prepared, save_dir=run_dir, max_update=1))


def test_evaluate_dev_score_equals_best_logged(trained, tmp_path):
    _, prepared, run_dir, result = trained
    cfg = EvaluateConfig(
        checkpoint=f"{run_dir}/<best>",
        data_dir=prepared,
        metrics_file=str(tmp_path / "m.json"),
        confusion_png=str(tmp_path / "cm.png"),
    )
    out = evaluate.run(cfg)
    assert out.metrics["dev"]["accuracy"] == result.best_score
    valid_log = pd.read_csv(f"{run_dir}/valid.log.tsv", sep="\t")
    assert out.metrics["dev"]["accuracy"] == pytest.approx(valid_log["accuracy"].max(), abs=1e-6)
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert set(metrics) == {"dev", "test"}
    assert {"accuracy", "macro_f1", "macro_precision", "macro_recall", "roc_auc"} <= set(
        metrics["test"]
    )
    assert (tmp_path / "cm.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "valid_curve.png").exists()
    # a config copied with curve_png None (model_copy skips validators): beside the confusion
    # matrix, not a file named "None" in the working directory
    sub = tmp_path / "copied"
    copied = cfg.model_copy(update={"confusion_png": str(sub / "cm.png"), "curve_png": None})
    evaluate.run(copied)
    assert (sub / "valid_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_missing_checkpoint_is_clear(trained, tmp_path):
    _, prepared, _, _ = trained
    with pytest.raises(CheckpointError, match="nope/last"):
        evaluate.run(
            EvaluateConfig(checkpoint=str(tmp_path / "nope" / "<last>"), data_dir=prepared)
        )


@pytest.mark.parametrize("concat_origin,header", [(True, True), (False, False)])
def test_predict_writes_labels_and_probabilities(trained, tmp_path, concat_origin, header):
    raw, _, run_dir, _ = trained
    out_file = tmp_path / "pred.tsv"
    result = predict.run(
        PredictConfig(
            checkpoint=f"{run_dir}/<best>",
            data_file=f"{raw}/test.tsv",
            out_file=str(out_file),
            concat_origin=concat_origin,
            header=header,
        )
    )
    src = pd.read_csv(f"{raw}/test.tsv", sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    df = pd.read_csv(
        out_file,
        sep="\t",
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
        header=0 if header else None,
    )
    assert len(df) == len(src) == result.rows
    if header:
        # target map is ordered by train frequency: neg (52%) before pos
        assert list(df.columns) == ["text", "label", "pred_label", "prob_neg", "prob_pos"]
        assert (df["text"] == src["text"]).all()
        probs = df[[c for c in df.columns if c.startswith("prob_")]].to_numpy()
        assert np.allclose(probs.sum(1), 1.0, atol=1e-5)
        assert (df["pred_label"] == src["label"]).mean() > 0.6
    else:
        assert df.shape[1] == 3  # pred_label + 2 probabilities, no input columns
        assert set(df[0]) <= {"neg", "pos"}  # first row is data, not a header


def test_predict_matches_evaluate_accuracy(trained, tmp_path):
    raw, prepared, run_dir, _ = trained
    predict.run(
        PredictConfig(
            checkpoint=f"{run_dir}/<best>",
            data_file=f"{raw}/test.tsv",
            out_file=str(tmp_path / "p.tsv"),
        )
    )
    ev = evaluate.run(
        EvaluateConfig(
            checkpoint=f"{run_dir}/<best>",
            data_dir=prepared,
            splits=["test"],
            metrics_file=str(tmp_path / "m.json"),
            confusion_png=str(tmp_path / "c.png"),
        )
    )
    df = pd.read_csv(tmp_path / "p.tsv", sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    assert (df["pred_label"] == df["label"]).mean() == pytest.approx(ev.metrics["test"]["accuracy"])


def test_export_parity_on_real_checkpoint(trained, tmp_path):
    raw, prepared, run_dir, _ = trained
    result = export.run(
        ExportConfig(
            checkpoint=f"{run_dir}/<best>",
            data_dir=prepared,
            out_dir=str(tmp_path / "export"),
            num_samples=120,
        )
    )
    assert result.parity["num_samples"] == 120
    dev = pd.read_csv(f"{raw}/dev.tsv", sep="\t", quoting=csv.QUOTE_NONE, keep_default_na=False)
    assert onnx_vs_eager(str(tmp_path / "export"), run_dir, dev["text"][:80].tolist()) < 1e-4
    latency = json.loads((tmp_path / "export" / "latency.json").read_text())
    assert set(latency["onnx"]["batches"]) == {"1", "64"}


def test_the_own_data_recipe_writes_next_to_its_model_and_leaves_the_demo_alone(
    trained, tmp_path, monkeypatch, capsys
):
    """README's own-data recipe, `xdpx eval checkpoint='models/mine/<best>' data_dir=...`
    (and `xdpx pred` likewise), in a project whose params.yaml is the shipped one: the
    demo's reports (the pipeline's outputs, DVC outs) are left as they were and the files
    land under models/mine/; an output given on the command line is kept; the pipeline's
    own checkpoint (no override) still writes reports/."""
    import shutil
    from pathlib import Path

    import yaml

    raw, prepared, run_dir, _ = trained
    root = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    shutil.copytree(run_dir, tmp_path / "models/mine")
    shipped = yaml.safe_load((root / "params.yaml").read_text())
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(shipped))
    demo = {name: f"demo {name}\n" for name in ("metrics.json", "confusion.png", "valid_curve.png")}
    (tmp_path / "reports").mkdir()
    for name, text in demo.items():
        (tmp_path / "reports" / name).write_text(text)

    result = evaluate.main(["checkpoint=models/mine/<best>", f"data_dir={prepared}"])
    mine = tmp_path / "models/mine"
    assert result.metrics_file == "models/mine/eval/metrics.json"
    assert set(json.loads((mine / "eval/metrics.json").read_text())) == {"dev", "test"}
    for name in ("confusion.png", "valid_curve.png"):
        assert (mine / "eval" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pred = predict.main(["checkpoint=models/mine/<best>", f"data_file={raw}/test.tsv"])
    assert pred.out_file == "models/mine/predict/test.pred.tsv" and pred.rows > 0
    assert len((mine / "predict/test.pred.tsv").read_text().splitlines()) == pred.rows + 1
    given = evaluate.main(["checkpoint=models/mine/<last>", f"data_dir={prepared}", "metrics_file=mine.json"])  # fmt: skip
    assert given.metrics_file == "mine.json" and given.confusion_png == "models/mine/eval/confusion.png"  # fmt: skip
    # the demo's files: untouched, nothing new beside them
    assert {p.name: p.read_text() for p in (tmp_path / "reports").iterdir()} == demo
    # the pipeline's own checkpoint (params.yaml's train.save_dir) still writes reports/
    shipped["train"]["save_dir"] = "models/mine"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(shipped))
    own = evaluate.main([f"data_dir={prepared}"])
    assert own.metrics_file == "reports/metrics.json"
    assert set(json.loads((tmp_path / "reports/metrics.json").read_text())) == {"dev", "test"}
    capsys.readouterr()
