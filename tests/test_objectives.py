"""The trainer names no task: objectives plug a task in, callbacks plug a side effect in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import pearsonr

from xdpx.config import TrainConfig
from xdpx.data import load_split
from xdpx.models import build_model, model_config_from, with_model_defaults
from xdpx.train.callbacks import Callback
from xdpx.train.objectives import Classification, Objective, build_objective
from xdpx.train.trainer import StopTraining, Trainer

ROOT = Path(__file__).resolve().parents[1]

TASK_NAMES = ("mlm", "teacher", "distill", "freelb", "adv")


@pytest.mark.unit
def test_the_trainer_names_no_task():
    """Adding a task is an objective (xdpx/train/objectives.py), not an edit of the loop."""
    src = (ROOT / "xdpx" / "train" / "trainer.py").read_text(encoding="utf-8")
    found = [
        f"xdpx/train/trainer.py:{n}: {line.strip()}"
        for n, line in enumerate(src.splitlines(), 1)
        for name in TASK_NAMES
        if re.search(name, line, re.IGNORECASE)
    ]
    assert not found, "\n".join(found)
    assert len(src.splitlines()) <= 450


def _trainer(prepared: str, save_dir: Path, **kw) -> Trainer:
    objective = kw.pop("objective", None)
    callbacks = kw.pop("callbacks", ())
    num_labels = kw.pop("num_labels", None)
    cfg = with_model_defaults(
        TrainConfig(data_dir=prepared, save_dir=str(save_dir), threads=1, **kw)
    )
    meta = json.loads(Path(prepared, "meta.json").read_text())
    train, dev = load_split(prepared, "train"), load_split(prepared, "dev")
    torch.manual_seed(cfg.seed)
    config = model_config_from(cfg.model, cfg, meta["vocab_size"], num_labels or meta["num_labels"], 0)  # fmt: skip
    model = build_model(cfg.model, config)
    return Trainer(
        model, cfg, train.input_ids, train.labels, dev.input_ids, dev.labels, cfg.model,
        config, prepared, objective=objective, callbacks=callbacks,
    )  # fmt: skip


class Recorder(Callback):
    """Every event, in order; stops training at ``stop_at`` (an update) if given."""

    def __init__(self, stop_at: int | None = None) -> None:
        self.events: list[tuple] = []
        self.stop_at = stop_at

    def on_fit_start(self, trainer):
        self.events.append(("start", trainer.state.num_updates))

    def on_train_row(self, trainer, row, summaries):
        self.events.append(("row", row["update"]))

    def on_save(self, trainer, which, path):
        self.events.append(("save", str(which), Path(path).exists()))

    def on_eval(self, trainer, event):
        # the run log (the first callback) wrote this evaluation's row already
        valid = pd.read_csv(Path(trainer.save_dir) / "valid.log.tsv", sep="\t")
        self.events.append(("eval", event.update, int(valid["update"].iloc[-1])))
        if event.update == self.stop_at:
            raise StopTraining("recorder")

    def on_fit_end(self, trainer):
        self.events.append(("end", trainer.state.num_updates))


@pytest.mark.integration
def test_callbacks_see_the_events_in_order_and_one_can_stop_training(real_subset, tmp_path):
    _, prepared = real_subset
    kw = dict(max_update=12, eval_interval=6, log_interval=3, ngram_buckets=16384)
    rec = Recorder()
    _trainer(prepared, tmp_path / "a", callbacks=[rec], **kw).fit()
    e = rec.events
    assert e[0] == ("start", 0) and e[-1] == ("end", 12)
    assert [x[1] for x in e if x[0] == "row"] == [3, 6, 9, 12]
    assert [x[1:] for x in e if x[0] == "eval"] == [(6, 6), (12, 12)]
    saves = [x for x in e if x[0] == "save"]
    assert saves and all(exists for *_, exists in saves)
    # each evaluation comes before its checkpoints (best on improvement, then last)
    first_eval = e.index(("eval", 6, 6))
    assert e[first_eval + 1 : first_eval + 3] == [("save", "best", True), ("save", "last", True)]
    assert e.index(("row", 6)) < first_eval < e.index(("row", 9))

    stop = Recorder(stop_at=6)
    trainer = _trainer(prepared, tmp_path / "b", callbacks=[stop], **kw)
    result = trainer.fit()
    assert result.num_updates == 6 and trainer.stop_reason == "recorder"
    assert stop.events[-1] == ("end", 6)
    # stopped, and its checkpoints written all the same
    assert ("save", "last", True) in stop.events[stop.events.index(("eval", 6, 6)) :]


class ScoreRegression(Objective):
    """A task the trainer was not written for: one output fit to the label (0/1) as a score
    with squared error; dev metrics are Pearson's r and the mean squared error (``loss``)."""

    def loss(self, logits, y, idx):
        return ((logits.float().squeeze(-1) - y.float()) ** 2).sum()

    def correct(self, logits, y):
        return float(((logits.squeeze(-1) > 0.5).long() == y).sum())

    def evaluate(self, module, parts, batch_size, pad_id, device, rank, world_size):
        from xdpx.inference import pad_batch

        module.eval()
        scores, gold = [], []
        with torch.no_grad():
            for x, y in parts:
                for i in range(0, len(x), 256):
                    batch = pad_batch(list(x[i : i + 256]), pad_id, 1)
                    scores.append(module(batch).squeeze(-1).numpy())
                gold.append(np.asarray(y, dtype=np.float64))
        module.train()
        s, g = np.concatenate(scores), np.concatenate(gold)
        return {"pearson": float(pearsonr(s, g)[0]), "loss": float(((s - g) ** 2).mean())}


@pytest.mark.integration
def test_a_new_objective_trains_without_touching_the_trainer(real_subset, tmp_path):
    """ScoreRegression above, plugged in through Trainer(objective=...): the loop runs it,
    logs its loss, selects best/ by its dev loss and saves; the score it learns tracks the
    label on dev (Pearson > 0.3, where an untrained score gives ~0)."""
    _, prepared = real_subset
    run = tmp_path / "reg"
    trainer = _trainer(
        prepared, run, objective=ScoreRegression(), num_labels=1, max_epoch=5, learning_rate=0.03,
        eval_interval=-1, major_metric="loss", ngram_buckets=16384,
    )  # fmt: skip
    result = trainer.fit()
    valid = pd.read_csv(run / "valid.log.tsv", sep="\t")
    assert list(valid.columns[3:5]) == ["pearson", "loss"]
    assert result.best_score == pytest.approx(valid["loss"].min(), abs=1e-6)
    assert valid["pearson"].max() > 0.3
    train_log = pd.read_csv(run / "train.log.tsv", sep="\t")
    assert train_log["loss"].iloc[-1] < train_log["loss"].iloc[0]
    assert (run / "best" / "model.safetensors").exists()


@pytest.mark.integration
def test_build_objective_picks_the_task_from_the_config(real_subset, tmp_path):
    _, prepared = real_subset
    plain = _trainer(prepared, tmp_path / "p", max_update=1)
    assert type(plain.objective) is Classification and plain.objective.class_weight is None
    weighted = _trainer(prepared, tmp_path / "w", max_update=1, class_weight="balanced")
    assert weighted.objective.class_weight is not None
    cfg = TrainConfig(data_dir=prepared, model="textcnn", adv="freelb", adv_steps=3)
    data = load_split(prepared, "train")
    from xdpx.data.lazy import InMemoryData

    meta = json.loads(Path(prepared, "meta.json").read_text())
    model = build_model("textcnn", model_config_from("textcnn", cfg, meta["vocab_size"], 2, 0))
    wrapped = build_objective(cfg, model, InMemoryData(data.input_ids, data.labels, 1), 2)
    assert wrapped.num_passes == 3 and type(wrapped.inner) is Classification
    with pytest.raises(ValueError, match=r"teacher_logits must be \[\d+, num_labels\]"):
        build_objective(
            TrainConfig(data_dir=prepared), model, InMemoryData(data.input_ids, data.labels, 1),
            2, teacher_logits=np.zeros((3, 2)),
        )  # fmt: skip
