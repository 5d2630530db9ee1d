"""Trainer: learning on real data, exact gradient accumulation, seeding, logs, checkpoints."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from xdpx.checkpoint import load_checkpoint
from xdpx.data import load_split
from xdpx.errors import DivergenceError, NonFiniteLossError
from xdpx.models.contract import ModelContract
from xdpx.train.sampling import epoch_order, length_grouped
from xdpx.train.setup import in_memory_trainer
from xdpx.train.trainer import Trainer


def make_trainer(prepared: str, save_dir: str, **overrides) -> Trainer:
    """The trainer on ``prepared`` in memory (the package's helper, bench/gpu_check.py's too)."""
    return in_memory_trainer(prepared, save_dir, **overrides)


def params_of(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


@pytest.mark.integration
def test_loss_decreases_and_beats_majority_on_real_subset(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(
        prepared,
        str(tmp_path / "run"),
        model="textcnn",
        max_epoch=4,
        log_interval=5,
        eval_interval=10,
    )
    result = trainer.fit()
    log = pd.read_csv(tmp_path / "run" / "train.log.tsv", sep="\t")
    assert log["loss"].iloc[-3:].mean() < log["loss"].iloc[:3].mean() - 0.1
    dev_labels = load_split(prepared, "dev").labels
    majority = np.bincount(dev_labels).max() / len(dev_labels)
    assert result.best_score > majority + 0.05
    valid = pd.read_csv(tmp_path / "run" / "valid.log.tsv", sep="\t")
    assert list(valid.columns[:3]) == ["update", "epoch", "samples_seen"]
    assert valid["accuracy"].max() == pytest.approx(result.best_score)
    assert int(valid.loc[valid["accuracy"].idxmax(), "update"]) == result.best_update
    # best checkpoint holds the best update; last holds the final one
    best, last = (
        load_checkpoint(str(tmp_path / "run" / "<best>")),
        load_checkpoint(str(tmp_path / "run" / "<last>")),
    )
    assert best.info["update"] == result.best_update
    assert last.info["update"] == result.num_updates
    assert (tmp_path / "run" / "dvclive" / "metrics.json").exists()


@pytest.mark.parametrize(
    ("model", "extra"),
    [
        ("textcnn", {"dropout": 0.0, "embedding_dim": 32, "num_filters": 16}),
        ("ngram_lr", {"ngram_buckets": 5003}),
        # sparse gradients accumulated over micro-batches, then LazyAdamW
        ("ngram_lr", {"ngram_buckets": 5003, "loss": "squared_hinge", "optimizer": "lazy_adamw"}),
    ],
)
@pytest.mark.integration
def test_update_freq_equals_larger_batch(real_subset, tmp_path, model, extra):
    """update_freq=4 x batch 8 == batch 32 (dropout off, fp32): same parameters within 1e-5
    (each model's own keys in ``extra``: another model's would be refused)."""
    _, prepared = real_subset
    common = dict(
        **extra,
        model=model,
        max_update=6,
        eval_interval=1000,
        log_interval=1,
        learning_rate=1e-3,
        # Adam divides by sqrt(v): a rounding-sized gradient (~1e-12) on a row the batch barely
        # touches would become a full lr-sized step of either sign; a larger eps bounds that.
        adam_eps=1e-6,
    )
    a = make_trainer(prepared, str(tmp_path / "a"), batch_size=8, update_freq=4, **common)
    b = make_trainer(prepared, str(tmp_path / "b"), batch_size=32, update_freq=1, **common)
    init = params_of(b)
    torch.testing.assert_close(params_of(a), init, atol=0, rtol=0)  # same init
    a.fit(), b.fit()
    pa, pb = params_of(a), params_of(b)
    assert (
        max((pb[k] - init[k]).abs().max().item() for k in init) > 1e-3
    )  # training moved the weights
    for k in pa:
        torch.testing.assert_close(pa[k], pb[k], atol=1e-5, rtol=0, msg=k)
    # Adam is blind to a uniform gradient scale, so also check the normalised loss and the
    # gradient norm of every update: a window not divided by its sample count shows here.
    la, lb = (pd.read_csv(tmp_path / r / "train.log.tsv", sep="\t") for r in ("a", "b"))
    assert len(la) == len(lb) == 6
    np.testing.assert_allclose(la["loss"], lb["loss"], rtol=1e-5)
    np.testing.assert_allclose(la["grad_norm"], lb["grad_norm"], rtol=1e-4)
    assert (
        la["samples_seen"].tolist() == lb["samples_seen"].tolist() == [32 * i for i in range(1, 7)]
    )


@pytest.mark.integration
def test_same_seed_same_parameters_different_seed_differs(real_subset, tmp_path):
    _, prepared = real_subset
    common = dict(
        model="textcnn", max_update=5, eval_interval=1000, embedding_dim=32, num_filters=16
    )
    a = make_trainer(prepared, str(tmp_path / "a"), **common)
    b = make_trainer(prepared, str(tmp_path / "b"), **common)
    c = make_trainer(prepared, str(tmp_path / "c"), seed=2, **common)
    for t in (a, b, c):
        t.fit()
    pa, pb, pc = params_of(a), params_of(b), params_of(c)
    for k in pa:
        assert torch.equal(pa[k], pb[k]), k
    assert any(not torch.equal(pa[k], pc[k]) for k in pa)


@pytest.mark.unit
def test_epoch_order_depends_only_on_seed_and_epoch():
    assert np.array_equal(epoch_order(100, 1, 3), epoch_order(100, 1, 3))
    assert not np.array_equal(epoch_order(100, 1, 3), epoch_order(100, 1, 4))
    assert sorted(epoch_order(100, 1, 3)) == list(range(100))


@pytest.mark.unit
def test_length_grouped_sorts_each_megabatch_and_keeps_the_epoch(real_subset):
    """group_by_length on real token lengths: the same ids, each run of `megabatch` sorted
    longest first, and batches cut from it pad far less than random ones."""
    _, prepared = real_subset
    lengths = np.array([len(s) for s in load_split(prepared, "train").input_ids])
    order = epoch_order(len(lengths), 1, 1)
    grouped = length_grouped(order, lengths, 50 * 8)
    assert sorted(grouped) == sorted(order)
    for i in range(0, len(order), 400):
        assert set(grouped[i : i + 400]) == set(order[i : i + 400])  # only within a run
        assert np.all(np.diff(lengths[grouped[i : i + 400]]) <= 0)

    def padded(o):
        return sum(lengths[o[i : i + 8]].max() * len(o[i : i + 8]) for i in range(0, len(o), 8))

    assert padded(grouped) < 0.8 * padded(order)
    assert np.array_equal(length_grouped(order, lengths, 1), order)


@pytest.mark.integration
def test_max_update_budget_and_early_stop(real_subset, tmp_path):
    _, prepared = real_subset
    result = make_trainer(
        prepared, str(tmp_path / "a"), model="ngram_lr", max_update=7, eval_interval=3
    ).fit()
    assert result.num_updates == 7
    # a validation score that never improves stops after exactly `tolerance` further evals
    trainer = make_trainer(
        prepared, str(tmp_path / "b"), model="ngram_lr", eval_interval=2, tolerance=2
    )
    trainer.evaluate = lambda: {"accuracy": 0.5, "loss": 0.7}
    result = trainer.fit()
    assert result.stopped_early
    assert result.num_updates == 6 and result.best_update == 2


@pytest.mark.integration
def test_nan_loss_stops_with_clear_error(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(prepared, str(tmp_path / "a"), model="ngram_lr", max_update=3)
    with torch.no_grad():
        trainer.model.bias.fill_(float("nan"))
    with pytest.raises(NonFiniteLossError, match="non-finite loss at update 1"):
        trainer.fit()


@pytest.mark.integration
def test_bf16_trains_on_cpu(real_subset, tmp_path):
    _, prepared = real_subset
    result = make_trainer(
        prepared,
        str(tmp_path / "a"),
        model="ngram_lr",
        precision="bf16",
        max_update=4,
        eval_interval=4,
        ngram_buckets=1009,
    ).fit()
    assert result.num_updates == 4 and np.isfinite(result.best_score)


@pytest.mark.integration
def test_nan_injected_into_one_module_output_is_named(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(prepared, str(tmp_path / "a"), model="textcnn", max_update=3)
    trainer.model.convs[1].register_forward_hook(lambda m, i, out: out * float("nan"))
    with pytest.raises(NonFiniteLossError) as e:
        trainer.fit()
    assert "output of module 'convs.1' (Conv1d)" in str(e.value)
    assert "at update 1" in str(e.value)


@pytest.mark.integration
def test_nan_injected_into_one_gradient_is_named(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(prepared, str(tmp_path / "a"), model="textcnn", max_update=3)
    trainer.model.convs[2].weight.register_hook(lambda g: g * float("nan"))
    with pytest.raises(NonFiniteLossError, match="non-finite gradient norm") as e:
        trainer.fit()
    assert "gradient of parameter 'convs.2.weight' (module 'convs.2')" in str(e.value)


@pytest.mark.integration
def test_max_loss_stops_training(real_subset, tmp_path):
    _, prepared = real_subset
    trainer = make_trainer(prepared, str(tmp_path / "a"), model="ngram_lr", max_loss=0.01)
    with pytest.raises(DivergenceError, match=r"loss 0\.69\d+ > max_loss 0\.01 at update 1"):
        trainer.fit()


@pytest.mark.integration
def test_update_freq_change_keeps_data_order(real_subset, tmp_path):
    """batch 32 x 1 and batch 8 x 4 read the same samples in the same updates (two epochs)."""
    _, prepared = real_subset
    common = dict(model="ngram_lr", ngram_buckets=1009, max_update=40, log_sample_ids=True)
    make_trainer(prepared, str(tmp_path / "a"), batch_size=32, **common).fit()
    make_trainer(prepared, str(tmp_path / "b"), batch_size=8, update_freq=4, **common).fit()
    a, b = (pd.read_csv(tmp_path / r / "samples.log.tsv", sep="\t") for r in ("a", "b"))
    assert len(a) == 40 and a["epoch"].max() == 2
    pd.testing.assert_frame_equal(a, b)
    first = [int(i) for i in a["sample_ids"].iloc[0].split(",")]
    n = len(load_split(prepared, "train").labels)
    assert first == epoch_order(n, 1, 1)[:32].tolist()


@pytest.mark.integration
def test_auto_ga_halves_micro_batch_on_oom_and_keeps_the_update(real_subset, tmp_path, caplog):
    """A (simulated) CUDA OOM above 8 samples: the update is redone in micro-batches of 8."""
    _, prepared = real_subset
    common = dict(
        model="textcnn",
        dropout=0.0,
        max_update=4,
        eval_interval=1000,
        log_interval=1,
        learning_rate=1e-3,
        adam_eps=1e-6,
        embedding_dim=32,
        num_filters=16,
        batch_size=32,
    )

    class OOMAbove8(ModelContract):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.min_len = inner, inner.min_len

        def forward(self, x):
            if self.training and x.shape[0] > 8:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
            return self.inner(x)

    ref = make_trainer(prepared, str(tmp_path / "ref"), **common)
    ga = make_trainer(prepared, str(tmp_path / "ga"), auto_ga=True, **common)
    ga.model = ga.module = OOMAbove8(ga.model)
    with caplog.at_level("WARNING", logger="xdpx.train.trainer"):
        ga.fit()
    ref.fit()
    assert ga.state.micro_batch_size == 8
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "auto_ga" in caplog.records[0].message and "micro-batch 16" in caplog.records[0].message
    pr = params_of(ref)
    for k, v in ga.model.inner.state_dict().items():
        torch.testing.assert_close(v, pr[k], atol=1e-5, rtol=0, msg=k)
    no_ga = make_trainer(prepared, str(tmp_path / "no"), **common)
    no_ga.model = no_ga.module = OOMAbove8(no_ga.model)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        no_ga.fit()


@pytest.mark.integration
def test_inspect_grad_summaries_profile_and_max_samples(real_subset, tmp_path):
    from xdpx import log as xlog
    from xdpx.models.textcnn import TextCNN

    class Reporting(TextCNN):
        def forward(self, input_ids):
            logits = super().forward(input_ids)
            xlog.add_summary("logit_spread", (logits[:, 1] - logits[:, 0]).abs().mean())
            return logits

    _, prepared = real_subset
    run = tmp_path / "a"
    trainer = make_trainer(
        prepared,
        str(run),
        model="textcnn",
        embedding_dim=16,
        num_filters=8,
        batch_size=32,
        max_samples=300,
        log_interval=2,
        inspect_grad=True,
        profile=True,
        profile_steps=2,
    )
    reporting = Reporting(**trainer.model_config)
    reporting.load_state_dict(trainer.model.state_dict())
    trainer.model = trainer.module = reporting
    trainer.optimizer.param_groups[0]["params"] = list(reporting.parameters())
    result = trainer.fit()
    assert result.num_updates == 10 and result.samples_seen == 320  # ceil(300 / 32) updates
    train_log = pd.read_csv(run / "train.log.tsv", sep="\t")
    assert train_log["logit_spread"].notna().all() and train_log["logit_spread"].iloc[-1] > 0
    assert (run / "dvclive" / "plots" / "metrics" / "train" / "logit_spread.tsv").exists()
    grads = pd.read_csv(run / "grad.log.tsv", sep="\t")
    groups = [c for c in grads.columns if c.startswith("grad_norm/")]
    assert sorted(groups) == ["grad_norm/classifier", "grad_norm/convs", "grad_norm/embedding"]
    # the group norms compose to the total (pre-clip) norm logged in train.log.tsv
    total = np.sqrt((grads[groups] ** 2).sum(axis=1))
    np.testing.assert_allclose(total, train_log["grad_norm"], rtol=1e-4)
    trace = json.loads((run / "profile" / "trace.json").read_text())
    assert any("aten::" in str(e.get("name", "")) for e in trace["traceEvents"])
