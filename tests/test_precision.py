"""Precision: bf16 on CPU tracks fp32; fp16 GradScaler paths on CUDA (skipped without CUDA)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from tests.test_trainer import make_trainer
from xdpx.data import load_split
from xdpx.errors import LossScaleError

pytestmark = pytest.mark.integration

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def bigger_dev(tmp_path_factory):
    """3,000 real reviews split 50/45/5, truncated to 32 chars: a dev set of 1,350 (1 point = 13 reviews)."""
    from stages import fetch, prepro
    from xdpx.config import FetchConfig, PreproConfig

    root = tmp_path_factory.mktemp("bf16")
    raw, prepared = str(root / "raw"), str(root / "prepared")
    fetch.run(FetchConfig(out_dir=raw, limit=3000, seed=1, ratios=[0.5, 0.45, 0.05]))
    prepro.run(PreproConfig(data_source=raw, data_dir=prepared, max_len=32))
    return prepared


def test_bf16_textcnn_within_one_point_of_fp32_on_cpu(bigger_dev, tmp_path):
    common = dict(
        model="textcnn",
        embedding_dim=32,
        num_filters=32,
        batch_size=32,
        learning_rate=3e-3,
        max_epoch=4,
        device="cpu",
    )
    fp32 = make_trainer(bigger_dev, str(tmp_path / "fp32"), precision="fp32", **common).fit()
    bf16 = make_trainer(bigger_dev, str(tmp_path / "bf16"), precision="bf16", **common).fit()
    dev = load_split(bigger_dev, "dev").labels
    assert fp32.best_score > np.bincount(dev).max() / len(dev) + 0.1  # it learned something real
    assert abs(bf16.best_score - fp32.best_score) <= 0.01, (bf16.best_score, fp32.best_score)


@cuda
def test_fp16_gradscaler_starts_at_128_and_logs_the_scale(real_subset, tmp_path):
    _, prepared = real_subset
    result = make_trainer(
        prepared,
        str(tmp_path / "a"),
        model="textcnn",
        precision="fp16",
        device="cuda",
        max_update=6,
        log_interval=1,
    ).fit()
    log = pd.read_csv(tmp_path / "a" / "train.log.tsv", sep="\t")
    assert result.num_updates == 6
    assert log["loss_scale"].iloc[0] == 128.0
    assert log["loss_scale"].notna().all()


@cuda
def test_fp16_min_loss_scale_stops_with_clear_error(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(
        prepared,
        str(tmp_path / "a"),
        model="textcnn",
        precision="fp16",
        device="cuda",
        min_loss_scale=1.0,
        max_update=50,
    )
    lr0 = trainer.optimizer.param_groups[0]["lr"]
    trainer.model.classifier.weight.register_hook(
        lambda g: g * float("inf")
    )  # every step overflows
    with pytest.raises(LossScaleError, match="loss scale fell to 0.5 < min_loss_scale 1"):
        trainer.fit()
    # 128 -> 64 -> ... -> 1 -> 0.5: eight skipped steps, none advanced the scheduler
    assert trainer.scheduler.last_epoch == 0 and trainer.optimizer.param_groups[0]["lr"] == lr0


@cuda
def test_auto_ga_on_real_cuda_oom(real_subset, tmp_path):
    """A micro-batch too large for the GPU is halved until it fits; the run finishes.

    The GPU is made too small by capping this process's CUDA memory between what the full
    micro-batch of 256 and half of it need, measured first (``forced_oom_auto_ga`` in
    bench/gpu_check.py). An embedding sized from free GPU memory would not do: its
    vocab x dim weights (tens of TB for a GPU's worth of activations) fail on the CPU
    before the model reaches the GPU.
    """
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.gpu_check import forced_oom_auto_ga

    _, prepared = real_subset
    result = forced_oom_auto_ga(prepared, str(tmp_path / "a"))
    assert result["ok"], result
