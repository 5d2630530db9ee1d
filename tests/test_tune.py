"""`xdpx tune` (Optuna + Hyperband) on the real-corpus subset, and the trainer's on_eval hook."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import optuna
import pandas as pd
import pytest
import yaml
from optuna.trial import TrialState
from typer.testing import CliRunner

from studies.tune import default_resources, hide_password, load_tune_config
from xdpx.checkpoint import load_checkpoint
from xdpx.cli import app
from xdpx.config import ConfigError, TrainConfig, load_stage_configs
from xdpx.data import load_split
from xdpx.train.trainer import EvalEvent, StopTraining

ROOT = Path(__file__).resolve().parents[1]
runner = CliRunner()

#: Tiny budgets: 960 train texts, batch 32 -> 30 updates, a dev evaluation every 6 (5 rungs).
BASE_TRAIN = {
    "ngram_buckets": 16384,
    "batch_size": 32,
    "max_epoch": 1,
    "eval_interval": 6,
    "tolerance": 100,
    "lr_scheduler": "constant",
    "threads": 1,
}


def xdpx(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


# ------------------------------------------------------------------ the trainer hook
@pytest.mark.integration
def test_on_eval_sees_every_evaluation_and_stop_training_ends_cleanly(real_subset, tmp_path):
    from stages import train

    _, prepared = real_subset
    cfg = TrainConfig(data_dir=prepared, save_dir=str(tmp_path / "full"), **BASE_TRAIN)
    events: list[EvalEvent] = []
    full = train.run(cfg, on_eval=events.append)
    valid = pd.read_csv(tmp_path / "full" / "valid.log.tsv", sep="\t")
    assert [e.update for e in events] == valid["update"].tolist() == [6, 12, 18, 24, 30]
    assert [e.samples_seen for e in events] == valid["samples_seen"].tolist()
    assert [e.metrics["accuracy"] for e in events] == pytest.approx(valid["accuracy"].tolist())
    assert events[-1].best_score == full.best_score and events[-1].major_metric == "accuracy"
    # default_resources mirrors the trainer: first evaluation and whole budget, in samples
    assert default_resources(cfg, 960) == (events[0].samples_seen, events[-1].samples_seen)

    def stop_at_second(event: EvalEvent) -> None:
        if event.update == 12:
            raise StopTraining("enough")

    cut_cfg = cfg.model_copy(
        update={"save_dir": str(tmp_path / "cut"), "save_full_checkpoint": True}
    )
    cut = train.run(cut_cfg, on_eval=stop_at_second)
    assert cut.num_updates == 12 and not cut.stopped_early
    rows = pd.read_csv(tmp_path / "cut" / "valid.log.tsv", sep="\t")
    assert rows["update"].tolist() == [6, 12]
    assert rows["accuracy"].tolist() == pytest.approx(valid["accuracy"].tolist()[:2])
    last = load_checkpoint(str(tmp_path / "cut" / "<last>"))  # manifest checked on load
    assert last.info["update"] == 12
    state = json.loads((tmp_path / "cut" / "last" / "trainer_state.json").read_text())
    assert state["finished"] and state["num_updates"] == 12  # a resume would not train on
    assert json.loads((tmp_path / "cut" / "result.json").read_text())["num_updates"] == 12


# ------------------------------------------------------------------ xdpx tune
def write_project(root: Path, raw: str) -> None:
    params = {
        "prepro": {"data_source": raw, "max_len": 64},
        "train": BASE_TRAIN,
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    space = {
        "study": "lr",
        "n_trials": 8,
        "seed": 1,
        "space": {
            "train.learning_rate": {"type": "float", "values": ["1e-5", "1e-1"], "log": True},
            "ngram_dropout": {"type": "categorical", "values": [0.0, 0.3]},
        },
    }
    (root / "space.yaml").write_text(yaml.safe_dump(space))


@pytest.mark.integration
def test_tune_prunes_writes_outputs_and_resumes_numbering(real_subset, tmp_path, monkeypatch):
    raw, _ = real_subset
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, raw)
    result = xdpx("tune", "space.yaml")
    assert result.exit_code == 0, result.output
    storage = f"sqlite:///{tmp_path}/reports/tune/lr/study.db"
    study = optuna.load_study(study_name="lr", storage=storage)
    trials = study.trials
    states = [t.state for t in trials]
    assert [t.number for t in trials] == list(range(8))
    assert TrialState.PRUNED in states and TrialState.COMPLETE in states, states
    assert study.direction == optuna.study.StudyDirection.MAXIMIZE  # accuracy
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    # every complete trial reported all 5 evaluations, by samples seen; a pruned one stopped early
    assert all(sorted(t.intermediate_values) == [192, 384, 576, 768, 960] for t in complete)
    for t in pruned:
        assert t.last_step < 960
        valid = pd.read_csv(tmp_path / f"models/tune/lr/trial-{t.number}/valid.log.tsv", sep="\t")
        assert valid["samples_seen"].tolist()[-1] == t.last_step  # training really stopped there
    # the value is the best dev score of the run
    for t in complete:
        assert t.value == pytest.approx(max(t.intermediate_values.values()))
    # learning rates over 4 decades: the best trial is not the slowest learner
    lrs = {t.number: t.params["train.learning_rate"] for t in trials}
    assert study.best_trial.params["train.learning_rate"] > min(lrs.values())

    out = tmp_path / "reports/tune/lr"
    with open(out / "trials.tsv", newline="") as f:
        table = list(csv.DictReader(f, delimiter="\t"))
    assert [int(r["number"]) for r in table] == list(range(8))
    assert [r["state"] for r in table] == [s.name for s in states]
    assert float(table[study.best_trial.number]["train.learning_rate"]) == pytest.approx(
        study.best_trial.params["train.learning_rate"]
    )
    # best_params.yaml is a params file: extends the base, holds the best trial's values
    best_cfg = load_stage_configs("train", str(out / "best_params.yaml"))[0][1]
    assert best_cfg.learning_rate == pytest.approx(study.best_trial.params["train.learning_rate"])
    assert best_cfg.ngram_dropout == study.best_trial.params["train.ngram_dropout"]
    assert best_cfg.ngram_buckets == 16384  # from the base params it extends
    for png in ("history.png", "intermediate.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "models/tune/lr/prepared/meta.json").exists()  # prepro ran once
    assert not (tmp_path / "models/tune/lr/trial-0/prepared").exists()

    # the same command against the same SQLite file continues the study
    again = xdpx("tune", "space.yaml", "--n-trials", "2")
    assert again.exit_code == 0, again.output
    study = optuna.load_study(study_name="lr", storage=storage)
    assert [t.number for t in study.trials] == list(range(10))
    with open(out / "trials.tsv", newline="") as f:
        assert [int(r["number"]) for r in csv.DictReader(f, delimiter="\t")] == list(range(10))
    assert (tmp_path / "models/tune/lr/trial-9/valid.log.tsv").exists()

    # the stored study maximises accuracy: continuing it on loss is refused, nothing runs
    wrong = xdpx("tune", "space.yaml", "-n", "1", "train.major_metric=loss")
    assert wrong.exit_code == 2
    assert "created to maximize" in wrong.output and "minimize" in wrong.output
    assert len(optuna.load_study(study_name="lr", storage=storage).trials) == 10
    # the trials' set-up step runs once before the study: a pair model on single texts
    misfit = xdpx("tune", "space.yaml", "-n", "1", "train.model=match_ngram")
    assert misfit.exit_code == 2 and "is a pair model" in misfit.output, misfit.output
    assert len(optuna.load_study(study_name="lr", storage=storage).trials) == 10


@pytest.mark.integration
def test_best_params_keep_every_override_so_training_from_them_reads_the_tuned_data(
    real_subset, tmp_path, monkeypatch
):
    """`xdpx tune ... prepro.data_source=X`: best_params.yaml holds the data source and the
    prepared data of the study, so its own "train it" line trains on X, not on params.yaml's
    data/raw (which does not exist here)."""
    raw, _ = real_subset
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, raw)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["prepro"]["data_source"] = "data/raw"  # the default: not the data tuned on
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    result = xdpx("tune", "space.yaml", "-n", "2", "--study", "mine", f"prepro.data_source={raw}", "prepro.max_len=48")  # fmt: skip
    assert result.exit_code == 0, result.output
    best = yaml.safe_load((tmp_path / "reports/tune/mine/best_params.yaml").read_text())
    assert best["prepro"] == {"data_source": raw, "max_len": 48, "data_dir": "models/tune/mine/prepared"}  # fmt: skip
    trained = xdpx("train", "reports/tune/mine/best_params.yaml", "train.save_dir=models/best")
    assert trained.exit_code == 0, trained.output
    run = yaml.safe_load((tmp_path / "models/best/params.yaml").read_text())
    assert run["train"]["data_dir"] == "models/tune/mine/prepared"
    assert run["prepro"]["data_source"] == raw and run["prepro"]["max_len"] == 48
    assert not (tmp_path / "data").exists()


@pytest.mark.integration
def test_tuning_prepro_keys_prepares_data_per_trial(real_subset, tmp_path, monkeypatch):
    raw, _ = real_subset
    monkeypatch.chdir(tmp_path)
    write_project(tmp_path, raw)
    space = {
        "study": "maxlen",
        "n_trials": 2,
        "space": {"prepro.max_len": {"type": "categorical", "values": [16, 48]}},
    }
    (tmp_path / "maxlen.yaml").write_text(yaml.safe_dump(space))
    # epoch-end evaluations and an unknown train size: Hyperband's first rung must be given
    refused = xdpx("tune", "maxlen.yaml", "train.eval_interval=-1")
    assert refused.exit_code == 2 and "set pruner.min_resource" in refused.output
    assert not (tmp_path / "models").exists() and not (tmp_path / "reports").exists()

    result = xdpx("tune", "maxlen.yaml", "train.max_update=12")
    assert result.exit_code == 0, result.output
    study = optuna.load_study(
        study_name="maxlen", storage=f"sqlite:///{tmp_path}/reports/tune/maxlen/study.db"
    )
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 2  # 2 trials: no pruning
    for t in study.trials:
        meta = json.loads(
            (tmp_path / f"models/tune/maxlen/trial-{t.number}/prepared/meta.json").read_text()
        )
        assert meta["max_len"] == t.params["prepro.max_len"]
        train = load_split(str(tmp_path / f"models/tune/maxlen/trial-{t.number}/prepared"), "train")
        assert max(len(x) for x in train.input_ids) == t.params["prepro.max_len"]  # truncated
    assert not (tmp_path / "models/tune/maxlen/prepared").exists()
    best = yaml.safe_load((tmp_path / "reports/tune/maxlen/best_params.yaml").read_text())
    assert best["prepro"]["data_dir"] == f"models/tune/maxlen/trial-{study.best_trial.number}/prepared"  # fmt: skip


def bad_space(tmp_path: Path, space: dict, **top) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({"space": space, **top}))
    return str(path)


@pytest.mark.parametrize(
    ("space", "top", "expected"),
    [
        (
            {"train.lerning_rate": {"type": "float", "values": [1e-4, 1e-2]}},
            {},
            "bad.yaml: space: unknown key train.lerning_rate; did you mean 'learning_rate'?",
        ),
        (
            {"learning_rate": {"type": "float", "values": [1e-2, 1e-4], "log": True}},
            {},
            "bad.yaml: space.train.learning_rate: range needs low < high, got [0.01, 0.0001]",
        ),
        (
            {"learning_rate": {"type": "float", "values": [0, 1e-2], "log": True}},
            {},
            "bad.yaml: space.train.learning_rate: log: true needs low > 0",
        ),
        (
            {"dropout": {"type": "float", "values": [0.0, 1.5]}},
            {},
            "bad.yaml: space.train.dropout: invalid train.dropout=1.5",
        ),
        (
            {"batch_size": {"type": "float", "values": [16, 64]}},
            {},
            "bad.yaml: space.train.batch_size: invalid train.batch_size=",
        ),
        (
            {"batch_size": {"type": "int", "values": [16, 64], "stepp": 16}},
            {},
            "bad.yaml: unknown key space.train.batch_size.stepp; did you mean 'step'?",
        ),
        (
            {"model": {"type": "categorical", "values": ["textcnn", "cnn"]}},
            {},
            "bad.yaml: space.train.model: invalid train.model='cnn'",
        ),
        (
            {"save_dir": {"type": "categorical", "values": ["a", "b"]}},
            {},
            "bad.yaml: space.train.save_dir: set by xdpx tune itself",
        ),
        (
            {"evaluate.batch_size": {"type": "int", "values": [1, 8]}},
            {},
            "bad.yaml: space.evaluate.batch_size: only train and prepro keys can be tuned",
        ),
        (
            {"learning_rate": {"type": "float", "values": [1e-4, 1e-2]}},
            {"n_trial": 3},
            "bad.yaml: unknown key 'n_trial'; did you mean 'n_trials'?",
        ),
        ({}, {}, "bad.yaml: space must map params keys to ranges"),
        (  # the base's model (ngram_lr, the default) never reads dropout: every trial would fail
            {"dropout": {"type": "categorical", "values": [0.3, 0.5]}},
            {},
            "bad.yaml: space.train.dropout=0.5 on the base params: params.yaml + overrides: "
            "invalid train: train.dropout=0.5 does nothing for model=ngram_lr",
        ),
        (
            {"learning_rate": {"type": "float", "values": [1e-4, 1e-2]}},
            {"params": "no/such/params.yaml"},
            "bad.yaml: params: base params file no/such/params.yaml not found",
        ),
    ],
)
@pytest.mark.unit
def test_bad_tune_file_names_file_and_key(tmp_path, space, top, expected):
    path = bad_space(tmp_path, space, **top)
    with pytest.raises(ConfigError) as e:
        load_tune_config(path)
    assert str(e.value).startswith(f"{path}: ")
    assert expected.removeprefix("bad.yaml: ") in str(e.value)


@pytest.mark.unit
def test_bad_tune_file_on_the_command_line_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = bad_space(tmp_path, {"learning_rate": {"type": "float", "values": [1e-2, 1e-4]}})
    result = runner.invoke(app, ["tune", path])
    assert result.exit_code == 2
    assert "error: " in result.output and "space.train.learning_rate: range needs low < high" in (
        result.output
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.unit
def test_tune_help_has_examples():
    result = xdpx("tune", "--help")
    assert result.exit_code == 0 and "Examples" in result.output
    assert "xdpx tune tune/space-ngram.yaml" in result.output


@pytest.mark.unit
def test_shipped_space_file_is_valid():
    cfg = load_tune_config(str(ROOT / "tune" / "space-ngram.yaml"))
    assert cfg.study == "ngram-lr" and cfg.space["train.learning_rate"].log
    assert cfg.space["train.batch_size"].values == [32, 128]
    assert cfg.space["train.ngram_orders"].values[0] == [1, 2]


@pytest.mark.unit
def test_storage_password_is_hidden():
    url = "postgresql://xdpx:s3cret@db.example:5432/optuna"
    shown = hide_password(url)
    assert "s3cret" not in shown and "xdpx" in shown and "db.example" in shown
