"""Checks of the optimisation settings: the learning rate against the family's usual
range, the schedule against the budget, the loss at initialisation."""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

from xdpx.config import TrainConfig
from xdpx.doctor.checks import Check, Probe, fmt
from xdpx.inference import call_model

#: Usual peak learning rates of AdamW per model family: ``(low, high, source)``. Outside
#: ``[low, high]`` the ``learning_rate`` check warns.
LR_RANGES: dict[str, tuple[float, float, str]] = {
    "ngram_lr": (1e-3, 1e-1, "AdamW on a linear model; xdpx's default 1e-2 was chosen on dev over 10 splits (docs/benchmark-suite.md)"),
    "match_ngram": (1e-3, 1e-1, "AdamW on a linear model; xdpx's default 1e-2 (docs/benchmark-suite.md)"),
    "textcnn": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015), used for TextCNN/BiLSTM classifiers"),
    "bilstm": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015)"),
    "match_esim": (1e-4, 1e-2, "ESIM trains with Adam at 4e-4 (Chen et al. 2017)"),
    "siamese": (1e-4, 1e-2, "Adam's default 1e-3 (Kingma & Ba 2015)"),
    "hf_classifier": (1e-5, 2e-4, "BERT fine-tuning uses 2e-5..5e-5 (Devlin et al. 2019, A.3), compact BERTs up to 1e-4 (Turc et al. 2019)"),
}  # fmt: skip


def schedule_multipliers(cfg: TrainConfig, total: int) -> np.ndarray:
    """``[total]`` the learning rate of updates 1..``total`` as a share of its peak, from
    the scheduler the trainer builds (:func:`xdpx.train.optim.build_scheduler`: update ``k``
    runs at ``peak * lr_lambda(k - 1)``)."""
    from xdpx.train.optim import build_scheduler

    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    sched = build_scheduler(opt, cfg, total)
    fn = sched.lr_lambdas[0]
    return np.array([fn(k) for k in range(total)], dtype=np.float64)


def schedule_findings(cfg: TrainConfig, multipliers: np.ndarray, first_eval: int) -> tuple[str, str]:  # fmt: skip
    """``(status, detail)`` of a run's lr schedule (:func:`check_schedule`'s rules)."""
    from xdpx.train.optim import warmup_updates

    total = len(multipliers)
    warmup = warmup_updates(cfg, total)
    peak = float(multipliers.max()) if total else 0.0
    what = f"{cfg.lr_scheduler} over {total:,} updates, {warmup:,} of warmup; the lr peaks at {100 * peak:.3g}% of learning_rate, first evaluation at update {first_eval:,}"  # fmt: skip
    if warmup > total:
        return "fail", f"{what}: train.warmup_steps/warmup_ratio gives {warmup:,} updates of warmup, longer than the run's whole budget of {total:,} (max_epoch, max_update, max_samples): the lr never leaves the warmup; shorten the warmup or raise the budget"  # fmt: skip
    if peak < 0.1:
        return "fail", f"{what}: the lr never reaches 10% of its peak; check lr_scheduler and warmup against the budget"  # fmt: skip
    before = multipliers[warmup : max(first_eval - 1, warmup)]
    if len(before) and (before < 0.01).mean() > 0.1:
        dead = int(np.argmax(multipliers[warmup:] < 0.01)) + warmup + 1
        return "warn", f"{what}: the lr is below 1% of its peak from update {dead:,}, long before the first evaluation: those updates barely train; evaluate earlier (train.eval_interval) or lengthen the schedule"  # fmt: skip
    return "ok", what


def check_schedule(p: Probe) -> Check:
    """The learning rate of every update of the run, from the config and the train size as
    the trainer computes them (budget: :func:`xdpx.train.sampling.total_updates` of one process;
    schedule: :func:`schedule_multipliers`; first evaluation: ``eval_interval`` updates
    after ``eval_interval_warmup``, or the first epoch end). FAIL: the warmup is longer
    than the budget (the lr never leaves it), or the lr never reaches 10% of its peak.
    WARN: after the warmup, more than a tenth of the updates before the first evaluation
    run below 1% of the peak (a schedule that decays to ~0 long before anything is
    evaluated)."""
    from xdpx.train.sampling import total_updates

    cfg = p.cfg
    window = cfg.batch_size * cfg.update_freq
    total = total_updates(len(p.data), window, cfg)
    if total < 1:
        return Check("skip", "schedule", "the budget allows no update")
    per_epoch = math.ceil(len(p.data) / window)
    if cfg.eval_interval > 0:
        first = max(cfg.eval_interval, math.ceil(cfg.eval_interval_warmup / cfg.eval_interval) * cfg.eval_interval)  # fmt: skip
    else:
        first = max(per_epoch, math.ceil(cfg.eval_interval_warmup / per_epoch) * per_epoch)
    status, detail = schedule_findings(cfg, schedule_multipliers(cfg, total), min(first, total))
    return Check(status, "schedule", detail)


def check_learning_rate(p: Probe) -> Check:
    """``learning_rate`` (and ``head_learning_rate``) against :data:`LR_RANGES`, the usual
    peak learning rates of the model family with their source."""
    rng = LR_RANGES.get(p.cfg.model)
    if rng is None:
        return Check("skip", "learning_rate", f"no usual range known for model {p.cfg.model}")
    low, high, source = rng
    out = []
    for key, lr in (("learning_rate", p.cfg.learning_rate), ("head_learning_rate", p.cfg.head_learning_rate)):  # fmt: skip
        if lr is None or (key == "head_learning_rate" and p.cfg.model != "hf_classifier"):
            continue
        lo, hi = (low, high) if key == "learning_rate" else (low, 1e-2)
        if not lo <= lr <= hi:
            side = "above" if lr > hi else "below"
            risk = "updates overshoot: the loss jumps or diverges" if lr > hi else "training barely moves in the budget"  # fmt: skip
            out.append(f"train.{key}={fmt(lr)} is {side} the usual range {fmt(lo)}..{fmt(hi)} for {p.cfg.model} ({source}): {risk}; try {fmt(math.sqrt(lo * hi))} or train.learning_rate=null (the model's default)")  # fmt: skip
    if out:
        return Check("warn", "learning_rate", "; ".join(out))
    return Check("ok", "learning_rate", f"{fmt(p.cfg.learning_rate)} within the usual {fmt(low)}..{fmt(high)} for {p.cfg.model} ({source})")  # fmt: skip


def check_initial_loss(p: Probe) -> Check:
    """Cross-entropy of the untrained model on the first 256 samples of epoch 1 against
    ``ln(num_labels)``, the loss of a uniform guess (Karpathy 2019, "A Recipe for Training
    Neural Networks": verify loss @ init). Far above: the initial logits are large (bad init
    or a scale bug) or confidently wrong (labels mismatched to logits); far below: the
    labels leak into the inputs, or the head is already trained."""
    ids = p.first_ids(256)
    model = p.model()
    losses = []
    with torch.no_grad():
        for i in range(0, len(ids), 64):
            x, y = p.batch(ids[i : i + 64])
            losses.append(F.cross_entropy(call_model(model, x).float(), y, reduction="sum"))
    loss = float(sum(losses)) / len(ids)
    expect = math.log(p.num_labels)
    what = f"{loss:.3f} at init vs ln({p.num_labels}) = {expect:.3f} for a uniform guess"
    if not math.isfinite(loss):
        return Check("fail", "initial_loss", f"{what}: see the inputs check")
    if loss > expect + 1.0:
        return Check("warn", "initial_loss", f"{what}: the untrained model is confidently wrong: initial logits too large (bad init or a scale bug) or labels mismatched to logits (check num_labels and the target map)")  # fmt: skip
    if loss < 0.5 * expect:
        return Check("warn", "initial_loss", f"{what}: far below a guess before training: the labels leak into the inputs, or the head is already trained (a pretrained model with its classifier?)")  # fmt: skip
    return Check("ok", "initial_loss", what)
