"""Full checkpoints: SIGKILL mid-epoch + resume == uninterrupted; corrupt and interrupted saves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file

from xdpx import io
from xdpx.checkpoint import CheckpointError, load_checkpoint, load_training_state

ROOT = Path(__file__).resolve().parents[1]


def train_cli(capsys: pytest.CaptureFixture, params: Path, *args: str) -> tuple[int, str]:
    """``python -m stages.train --params PARAMS ARGS``'s entry point, in this process (a
    subprocess would add ~3 s of imports): its exit status and what it wrote to stderr."""
    capsys.readouterr()
    try:
        train_here(params, *args)
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def train_here(params: Path, *overrides: str) -> None:
    """What :func:`start_train` runs, in this process and to the end (a subprocess adds ~3 s
    of imports): for runs that nothing kills."""
    from stages import train

    train.main(["--params", str(params), *overrides])


def train_params(tmp_path: Path, prepared: str, save_dir: Path, **train) -> Path:
    """A params file with only a train section (every other key default): a textcnn unless
    ``train`` names another model (then textcnn's own keys are left out: refused there)."""
    textcnn = {
        "embedding_dim": 64,
        "num_filters": 64,
        "dropout": 0.3,  # dropout on: its per-update seeding must survive the resume
    }
    cfg = {
        "data_dir": prepared,
        "save_dir": str(save_dir),
        "model": "textcnn",
        **(textcnn if train.get("model", "textcnn") == "textcnn" else {}),
        "learning_rate": 1e-3,
        "batch_size": 8,
        "max_epoch": 2,
        "eval_interval": 10,
        "log_interval": 5,
        "save_full_checkpoint": True,
        "threads": 1,
        **train,
    }
    path = tmp_path / f"{save_dir.name}.yaml"
    path.write_text(yaml.safe_dump({"train": cfg}))
    return path


def start_train(params: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "stages.train", "--params", str(params), *overrides],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_after_checkpoint(proc: subprocess.Popen, state_file: Path, updates: int) -> None:
    """SIGKILL ``proc`` once its full checkpoint (``state_file``) is at ``updates`` or more."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            state = json.loads(state_file.read_text()) if state_file.exists() else None
        except ValueError:  # caught between the two renames of a save: try again
            state = None
        if state and state["num_updates"] >= updates:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed; make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def weights(run: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(run / name / "model.safetensors"))


@pytest.mark.e2e
def test_sigkill_mid_epoch_then_resume_is_bit_identical(real_subset, tmp_path):
    _, prepared = real_subset
    full_dir, killed_dir = tmp_path / "full", tmp_path / "killed"
    full = start_train(train_params(tmp_path, prepared, full_dir))
    killed = start_train(train_params(tmp_path, prepared, killed_dir))
    state_file = killed_dir / "last" / "trainer_state.json"
    kill_after_checkpoint(killed, state_file, 20)
    assert not (killed_dir / "result.json").exists()
    state = json.loads(state_file.read_text())
    assert state["epoch"] == 1 and 0 < state["epoch_pos"], "checkpoint must be mid-epoch"

    resumed = start_train(train_params(tmp_path, prepared, killed_dir), "train.resume=true")
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    _, err = full.communicate(timeout=600)
    assert full.returncode == 0, err

    for name in ("best", "last"):
        a, b = weights(full_dir, name), weights(killed_dir, name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), f"{name}/{k} differs after resume"
    assert (full_dir / "valid.log.tsv").read_bytes() == (killed_dir / "valid.log.tsv").read_bytes()
    # wall times live in time.log.tsv, so the train log is byte-identical too
    assert (full_dir / "train.log.tsv").read_bytes() == (killed_dir / "train.log.tsv").read_bytes()
    ta, tb = (pd.read_csv(d / "time.log.tsv", sep="\t") for d in (full_dir, killed_dir))
    assert list(ta["update"]) == list(tb["update"]) and (ta["wall_time"] > 0).all()
    repro = json.loads((killed_dir / "repro.json").read_text())
    assert repro["resumed_from"].endswith("last")


@pytest.mark.integration
def test_truncated_checkpoint_clear_error_previous_survives_failed_save(
    real_subset, tmp_path, monkeypatch
):
    from tests.test_trainer import make_trainer

    _, prepared = real_subset
    run = tmp_path / "run"
    trainer = make_trainer(
        prepared,
        str(run),
        model="ngram_lr",
        ngram_buckets=1009,
        max_update=4,
        eval_interval=2,
        save_full_checkpoint=True,
    )
    trainer.fit()
    good = load_training_state(str(run / "<last>"))
    assert good["trainer_state"]["num_updates"] == 4 and good["trainer_state"]["finished"]

    # a save that dies half-way leaves the previous complete checkpoint in place
    real_write = io.write_bytes
    calls = {"n": 0}

    def dying_write(path, data):
        calls["n"] += 1
        if calls["n"] == 3:
            raise OSError("disk full (simulated)")
        return real_write(path, data)

    monkeypatch.setattr(io, "write_bytes", dying_write)
    with pytest.raises(OSError, match="disk full"):
        trainer._save("last", {"update": 99}, full=True)
    monkeypatch.setattr(io, "write_bytes", real_write)
    assert load_checkpoint(str(run / "last")).info["update"] == 4
    assert not [p for p in os.listdir(run) if ".tmp-" in p], "temp directory left behind"

    # a truncated file is named in the error
    opt = run / "last" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"optimizer\.pt is truncated"):
        load_training_state(str(run / "last"))


@pytest.mark.integration  # the CLI's entry point, in-process
def test_resume_rules(real_subset, tmp_path, capsys):
    """resume=true on an empty dir starts fresh; a changed batch size or a model-only run is refused."""
    _, prepared = real_subset
    common = ["train.model=ngram_lr", "train.ngram_buckets=1009", "train.max_update=3"]
    params = train_params(tmp_path, prepared, tmp_path / "run", model="ngram_lr")
    code, err = train_cli(capsys, params, "train.resume=true", *common)
    assert code == 0, err
    code, err = train_cli(capsys, params, "train.resume=true", "train.batch_size=16", *common)
    assert code == 2 and "batch_size: 8 -> 16" in err, err
    code, err = train_cli(capsys, params, "train.overwrite=true", "train.save_full_checkpoint=false", *common)  # fmt: skip
    assert code == 0, err
    code, err = train_cli(capsys, params, "train.resume=true", *common)
    assert code == 2 and "no full checkpoint" in err, err


@pytest.mark.integration
def test_resume_after_a_kill_before_the_first_save_and_after_one_during_a_save(
    real_subset, tmp_path
):
    """A run killed before its first checkpoint is told so (not 'trained without
    save_full_checkpoint'); a resumed run removes the temp dir a save killed half-way left."""
    from stages import train
    from xdpx.config import TrainConfig
    from xdpx.rundir import RunDir

    _, prepared = real_subset
    early = RunDir(str(tmp_path / "early"))
    os.makedirs(early.path)
    Path(early.params).write_text("train: {}\n")  # what the bundle writes before any update
    Path(early.train_log).write_text("update\tepoch\n")
    common = dict(data_dir=prepared, model="ngram_lr", ngram_buckets=1009, max_update=4)
    common.update(save_full_checkpoint=True, eval_interval=2, threads=1)
    with pytest.raises(CheckpointError, match="never saved a checkpoint.*overwrite=true"):
        train.run(TrainConfig(save_dir=early.path, resume=True, **common))

    run = RunDir(str(tmp_path / "run"))
    train.run(TrainConfig(save_dir=run.path, **{**common, "max_update": 2}))
    partial = Path(run.path) / ".last.tmp-deadbeef"  # a save killed after it made its temp dir
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    result = train.run(TrainConfig(save_dir=run.path, resume=True, **{**common, "max_update": 2}))
    assert result.num_updates == 2 and not partial.exists()
    assert load_checkpoint(run.last).info["update"] == 2
