"""The `xdpx` command line, driven through its entry point on the real-corpus subset."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from xdpx.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]


def xdpx(*args: str, stdin: str | None = None):
    return runner.invoke(app, list(args), input=stdin, catch_exceptions=False)


def snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A project dir whose params.yaml runs fetch -> export on 600 real reviews, via the CLI."""
    root = tmp_path_factory.mktemp("cli")
    params = {
        "fetch": {"out_dir": "data/raw", "limit": 600},
        "prepro": {"data_source": "data/raw", "data_dir": "data/prepared", "max_len": 64},
        "train": {
            "data_dir": "data/prepared",
            "save_dir": "models/run",
            "ngram_buckets": 65536,
            "max_epoch": 2,
            "keep_checkpoints": True,
        },
        "evaluate": {"checkpoint": "models/run/<best>", "data_dir": "data/prepared"},
        "predict": {"checkpoint": "models/run/<best>", "data_file": "data/raw/test.tsv"},
        "export": {
            "checkpoint": "models/run/<best>",
            "data_dir": "data/prepared",
            "out_dir": "models/run/export",
            "num_samples": 16,
        },
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    old = os.getcwd()
    os.chdir(root)  # the commands' relative paths; back before the tests (in_project sets it)
    try:
        outputs = {}
        for command in ("fetch", "prepro", "train", "eval", "pred", "export"):
            result = xdpx(command)
            assert result.exit_code == 0, (command, result.output)
            outputs[command] = result.stdout
    finally:
        os.chdir(old)
    return root, outputs


@pytest.fixture
def in_project(project, monkeypatch):
    root, _ = project
    monkeypatch.chdir(root)
    return root


@pytest.mark.unit
def test_every_subcommand_has_help_with_examples():
    commands = ["fetch", "prepro", "train", "eval", "pred", "export", "viz", "serve", "doctor"]
    commands += [f"io {c}" for c in ("copy", "copytree", "md5", "ls")]
    commands += [f"script {c}" for c in ("aggregate_results", "diff_params", "clean_checkpoints")]
    for command in commands:
        result = xdpx(*command.split(), "--help")
        assert result.exit_code == 0, command
        assert "Example" in result.stdout, command
    top = xdpx("--help").stdout
    for name in ("fetch", "prepro", "train", "eval", "pred", "export", "viz", "io", "script"):
        assert name in top


@pytest.mark.integration
def test_stage_commands_ran_the_pipeline(in_project, project):
    _, outputs = project
    assert "best valid accuracy" in outputs["train"] and "parity" in outputs["export"]
    metrics = yaml.safe_load((in_project / "reports/metrics.json").read_text())
    assert metrics["test"]["accuracy"] > 0.6
    assert (in_project / "models/run/export/model.onnx").exists()
    preds = pd.read_csv(
        in_project / "reports/predictions.tsv",
        sep="\t",
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
    )
    assert len(preds) == 60 and {"pred_label", "prob_neg", "prob_pos"} <= set(preds.columns)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "lerning_rate=3e-4"], ["train.lerning_rate", "did you mean 'learning_rate'"]),
        (["train", "train.modle=cnn"], ["train.modle", "did you mean 'model'"]),
        (["train", "batch_size=abc"], ["train.batch_size", "'abc'"]),
        (["train", "model=transformer"], ["train.model", "'transformer'"]),
        (
            ["train", "overwrite=true", "resume=true", "save_full_checkpoint=true"],
            ["resume and overwrite"],
        ),
        (["train", "overwrite=true", "auto_suffix=true"], ["auto_suffix and overwrite"]),
        (["train", "data_dir=nowhere"], ["train.data_dir", "nowhere/meta.json not found"]),
        (
            ["train", "save_dir=models/run"],
            ["train.save_dir", "already holds a run", "auto_suffix"],
        ),
        (["pred", "data_file=missing.tsv"], ["predict.data_file", "missing.tsv not found"]),
        (["eval", "checkpoint=models/nope/<best>"], ["models/nope/best", "missing"]),
        (["prepro", "data_source=raw_missing"], ["prepro.data_source", "raw_missing not found"]),
        (["train", "missing.yaml"], ["config file missing.yaml not found"]),
    ],
)
@pytest.mark.integration
def test_bad_input_one_line_error_and_nothing_written(in_project, args, expected):
    before = snapshot(in_project)
    result = xdpx(*args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("error: "), err
    for word in expected:
        assert word in err, (word, err)
    assert snapshot(in_project) == before


@pytest.mark.integration
def test_dry_marks_exactly_the_non_default_keys(in_project):
    (in_project / "two.yaml").write_text("learning_rate: 0.003\nmodel: textcnn\n")
    before = snapshot(in_project)
    result = xdpx("train", "two.yaml", "--dry")
    assert result.exit_code == 0, result.output
    marked = [
        line.split()[1] for line in result.stdout.splitlines() if line.strip().startswith("*")
    ]
    assert marked == ["model:", "learning_rate:"]
    assert "    max_epoch: 5" in result.stdout  # defaults listed, unmarked
    assert snapshot(in_project) == before


@pytest.mark.integration
def test_config_file_extends_references_and_grid(in_project):
    (in_project / "base.yaml").write_text(
        "train:\n  data_dir: data/prepared\n  save_dir: models/grid\n  ngram_buckets: 4096\n"
        "  max_update: 3\n  eval_interval: 3\n"
    )
    (in_project / "sweep.yaml").write_text(
        "extends: base.yaml\ntrain:\n  seed: 7\n  valid_subset: ${train.train_subset}\n"
        "grid:\n  learning_rate: [0.01, 0.03]\n"
    )
    dry = xdpx("train", "sweep.yaml", "--dry").stdout
    assert "valid_subset: train" in dry and "ngram_buckets: 4096" in dry
    result = xdpx("train", "sweep.yaml")
    assert result.exit_code == 0, result.output
    runs = sorted(p.name for p in (in_project / "models/grid").iterdir())
    assert runs == ["learning_rate-0.01", "learning_rate-0.03"]
    for run in runs:
        params = yaml.safe_load((in_project / "models/grid" / run / "params.yaml").read_text())
        assert params["train"]["seed"] == 7
        assert params["train"]["learning_rate"] == float(run.split("-")[1])


@pytest.mark.integration
def test_auto_suffix_picks_a_fresh_run_dir(in_project):
    result = xdpx("train", "auto_suffix=true", "max_update=2", "eval_interval=2")
    assert result.exit_code == 0, result.output
    assert (in_project / "models/run-2/best/model.safetensors").exists()
    assert (in_project / "models/run/best/model.safetensors").exists()


@pytest.mark.integration
def test_serve_answers_like_predict(in_project):
    preds = pd.read_csv(
        in_project / "reports/predictions.tsv", sep="\t", quoting=csv.QUOTE_NONE,
        keep_default_na=False, dtype=str,
    )  # fmt: skip
    rows = preds.head(3)
    result = xdpx("serve", "models/run", stdin="\n".join(rows["text"]) + "\n")
    assert result.exit_code == 0, result.output
    answers = [line.split("\t") for line in result.stdout.strip().splitlines()]
    expected = rows[["pred_label", "prob_neg", "prob_pos"]].values.tolist()
    assert answers == expected
    batch = in_project / "batch.txt"
    batch.write_text(rows["text"].iloc[0] + "\n")
    result = xdpx("serve", "models/run/<best>", "--batch-file", str(batch))
    assert result.stdout.strip().split("\t") == expected[0]


@pytest.mark.integration
def test_io_commands_local_and_memory(in_project):
    src = in_project / "data/raw/train.tsv"
    digest = hashlib.md5(src.read_bytes()).hexdigest()
    assert xdpx("io", "md5", str(src)).stdout.strip() == digest
    assert xdpx("io", "size", str(src)).stdout.strip() == str(src.stat().st_size)
    assert xdpx("io", "copy", str(src), "memory://bucket/a/train.tsv").exit_code == 0
    assert xdpx("io", "md5", "memory://bucket/a/train.tsv").stdout.strip() == digest
    assert xdpx("io", "exists", "memory://bucket/a/train.tsv").exit_code == 0
    assert xdpx("io", "isfile", "memory://bucket/a/train.tsv").stdout.strip() == "true"
    assert xdpx("io", "exists", "memory://bucket/nothing").exit_code == 1
    assert xdpx("io", "copytree", "data/raw", "memory://bucket/raw").exit_code == 0
    listing = xdpx("io", "ls", "memory://bucket/raw").stdout.split()
    assert sorted(p.rsplit("/", 1)[1] for p in listing) == ["dev.tsv", "test.tsv", "train.tsv"]
    assert xdpx("io", "isdir", "memory://bucket/raw").exit_code == 0
    assert xdpx("io", "move", "memory://bucket/raw", "copy_of_raw").exit_code == 0
    assert hashlib.md5((in_project / "copy_of_raw/train.tsv").read_bytes()).hexdigest() == digest
    assert xdpx("io", "exists", "memory://bucket/raw").exit_code == 1
    assert (
        xdpx("io", "makedirs", "made/here").exit_code == 0 and (in_project / "made/here").is_dir()
    )
    assert xdpx("io", "rm", "copy_of_raw").exit_code == 2  # a directory: rmtree
    assert xdpx("io", "rmtree", "copy_of_raw").exit_code == 0
    assert not (in_project / "copy_of_raw").exists()
    missing = xdpx("io", "md5", "nope.tsv")
    assert missing.exit_code == 2 and "nope.tsv not found" in missing.stderr


@pytest.mark.integration
def test_doctor_reports_labels_leakage_and_truncation(in_project):
    result = xdpx("doctor")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "majority-class rate" in out and "leakage[test]" in out and "max_len[train]" in out
    bad = xdpx("doctor", "train.lerning_rate=1")
    assert bad.exit_code == 1 and "FAIL  config" in bad.stdout


@pytest.mark.e2e
def test_aliases_are_the_same_commands(in_project, monkeypatch):
    from xdpx import cli

    monkeypatch.setattr(sys, "argv", ["x-train", "--dry", "seed=3"])
    with pytest.raises(SystemExit) as done:
        cli.x_train()
    assert done.value.code in (0, None)
    out = subprocess.run(
        [sys.executable, "-m", "xdpx.cli", "train", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and "--nproc" in out.stdout
    text = (ROOT / "pyproject.toml").read_text()
    for alias in ("x-prepro", "x-train", "x-eval", "x-pred", "x-viz", "x-io", "x-script"):
        assert f'{alias} = "xdpx.cli:x_{alias[2:]}"' in text


@pytest.mark.integration
def test_viz_and_scripts_through_the_cli(in_project):
    result = xdpx("viz", "models/run", "-o", "reports/curves.png")
    assert result.exit_code == 0, result.output
    assert (in_project / "reports/curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    missing = xdpx("viz", "models/nothing")
    assert missing.exit_code == 2 and "models/nothing not found" in missing.stderr
    table = xdpx("script", "aggregate_results", "models", "-include", "run")
    assert table.exit_code == 0, table.output
    rows = table.stdout.strip().splitlines()
    assert rows[0].startswith("run\tbest_update") and any(r.startswith("run\t") for r in rows[1:])
    same = xdpx("script", "diff_params", "models/run", "models/run/starter.yaml")
    assert same.exit_code == 0 and same.stdout == ""
    starter = yaml.safe_load((in_project / "models/run/starter.yaml").read_text())
    starter["train"]["learning_rate"] = 0.5
    (in_project / "other.yaml").write_text(yaml.safe_dump(starter))
    diff = xdpx("script", "diff_params", "models/run", "other.yaml")
    assert diff.stdout.splitlines() == ["learning_rate\t0.01\t0.5"]
    checkpoints = sorted(p.name for p in (in_project / "models/run").glob("checkpoint-*"))
    assert len(checkpoints) == 2  # keep_checkpoints: one per epoch
    kept = {
        f"checkpoint-{json.loads((in_project / 'models/run' / d / 'config.json').read_text())['update']}"
        for d in ("best", "last")
    }
    dry = xdpx("script", "clean_checkpoints", "models", "--dry")
    removed = {line.rsplit("/", 1)[-1] for line in dry.stdout.splitlines() if "checkpoint-" in line}
    assert dry.exit_code == 0 and removed == set(checkpoints) - kept  # best and last are kept
