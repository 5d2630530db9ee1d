"""Checks that train: overfitting one fixed batch (:func:`check_overfit_batch`, the Hugging
Face course's test), and the learning check of the configuration as it will train
(:func:`check_learning`).

The learning check asks: does the configuration, trained as ``xdpx train`` trains it, learn
what a simple model learns from the same rows?

The other checks each test one known cause (labels, padding, reduction, ...). This one is
the general check the debugging checklists imply ("Does your model learn what a linear
baseline learns?": Karpathy 2019, "A Recipe for Training Neural Networks", *set up the
end-to-end training/evaluation skeleton + get dumb baselines*): a copy of the model is trained
with the config's own optimizer, learning rate and schedule, regularisation (dropout, weight
decay, n-gram dropout), loss, class weights, clipping, accumulation and precision (the
Trainer's update, nothing turned off) on two thirds of the rows the alignment check scored,
then scored on the other third, next to the alignment check's bag-of-tokens classifier fit on
the same two thirds. A configuration that ends far below it has a setting that keeps it from
learning (a dropout of 0.95, a learning rate 100x off, a weight decay that pins the weights),
which no single-cause check sees.
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch

from xdpx.config import TrainConfig
from xdpx.doctor.checks import Check, Probe, fmt
from xdpx.doctor.data_checks import bag_classifier
from xdpx.errors import DivergenceError
from xdpx.inference import call_model, predict_logits
from xdpx.models import with_model_defaults
from xdpx.train.losses import training_loss


def check_overfit_batch(p: Probe, max_updates: int = 150, max_seconds: float = 120.0) -> Check:
    """Overfit one fixed batch (the Hugging Face course's test): train the fresh model on the
    first batch (at most 32 samples) with the config's optimizer and peak learning rate
    (constant schedule, no dropout) through the Trainer's own update, until the config's own
    loss (per sample, unweighted: cross-entropy, or ``squared_hinge``'s margins, which stop
    pushing at 1 and so never make a softmax near one-hot over many classes) is below 0.05
    and every sample is right, for at most ``max_updates`` updates or ``max_seconds``. A model that cannot fit 32 samples will not fit the data: the message
    names the suspect part from the loss curve."""
    ids = p.first_ids(min(p.cfg.batch_size, 32))
    model = p.model()
    trainer = p.trainer(
        model, np.asarray(ids), batch_size=len(ids), update_freq=1, lr_scheduler="constant",
        warmup_steps=0, warmup_ratio=0.0, adv=None, distill_from=None, max_update=max_updates,
        max_loss=None,
    )  # fmt: skip
    window = np.arange(len(ids))
    x, y = p.batch(ids)
    start, losses = time.perf_counter(), []
    loss_of = lambda logits: float(training_loss(logits, y, None, p.cfg)) / len(y)  # noqa: E731
    with torch.no_grad():
        losses.append(loss_of(call_model(model, x)))
    try:
        for u in range(max_updates):
            trainer._update(window)
            with torch.no_grad():
                logits = call_model(model, x)
            losses.append(loss_of(logits))
            if losses[-1] < 0.05 and bool((logits.argmax(-1) == y).all()):
                what = f"loss {losses[0]:.3f} -> {losses[-1]:.4f} in {u + 1} updates on a fixed batch of {len(ids)} (lr {fmt(p.cfg.learning_rate)})"  # fmt: skip
                return Check("ok", "overfit_batch", what)
            if time.perf_counter() - start > max_seconds:
                break
    except DivergenceError as e:
        return Check("fail", "overfit_batch", f"the loss became NaN/Inf after {len(losses)} updates on one batch ({e}): learning rate {fmt(p.cfg.learning_rate)} too high, or a numerically unstable layer (see the inputs check)")  # fmt: skip
    first, last, best = losses[0], losses[-1], min(losses)
    budget = f" (the {max_seconds:g} s budget)" if len(losses) - 1 < max_updates else ""
    what = f"loss {first:.3f} -> {last:.3f} (best {best:.3f}) in {len(losses) - 1} updates{budget} on a fixed batch of {len(ids)}"  # fmt: skip
    if last > first or last > 2 * best + 0.05:
        cause = f"it rises or jumps: learning rate {fmt(p.cfg.learning_rate)} too high (lower it 10x)"  # fmt: skip
    elif last > 0.9 * first:
        cause = "it barely moves: learning rate too low, frozen or detached parameters (see grad_flow), or labels the model cannot see"  # fmt: skip
    else:
        cause = "it falls but not to ~0: too little capacity or information for these samples (max_len cuts them? [UNK]s? duplicate texts with different labels?) or a too low learning rate"  # fmt: skip
    return Check("fail", "overfit_batch", f"{what}: {cause}")


#: The ``train`` keys that change how a model learns, named as suspects when they differ
#: from the model's defaults (and the model reads them: ``xdpx.model_configs.reads``).
LEARNING_KEYS = (
    "learning_rate", "dropout", "ngram_dropout", "weight_decay", "batch_size", "update_freq",
    "lr_scheduler", "warmup_steps", "warmup_ratio", "clip_norm", "loss", "optimizer",
    "class_weight", "precision", "head_learning_rate", "layerwise_lr_decay",
    "freeze_embeddings", "adam_betas", "adam_eps", "embedding_dim", "hidden_size",
    "num_filters", "ngram_buckets", "ngram_min_df", "ngram_weighting", "ngram_norm",
    "max_epoch", "adv",
)  # fmt: skip

#: Held-out rows below which the learning check has too little to judge.
MIN_HELD_OUT = 100
#: Held-out rows of the learning check (at most; a third of the sample when smaller): an
#: accuracy's standard error is then <= 0.022.
HELD_OUT_ROWS = 500
#: The learning check's training rows: at most (more data mostly favours the model: the
#: reference is fit on the same rows), and at least when the budget allows fewer.
LEARN_MAX_ROWS = 1000
MIN_FIT_ROWS = 300


def model_defaults(model: str) -> TrainConfig:
    """The ``train`` section at every default for ``model``, with ``learning_rate``, ``loss``
    and ``optimizer`` as ``null``/``auto`` resolve for it
    (:func:`xdpx.models.with_model_defaults`); not validated (no data_dir)."""
    base = TrainConfig.model_construct(model=model, learning_rate=None, loss="auto", optimizer="auto")  # fmt: skip
    return with_model_defaults(base)


def suspect_settings(cfg: TrainConfig) -> list[str]:
    """``key=value`` of the :data:`LEARNING_KEYS` the model reads whose value differs from
    the model's default (:func:`model_defaults`)."""
    from xdpx.model_configs import reads

    default = model_defaults(cfg.model)
    return [
        f"{key}={getattr(cfg, key)}"
        for key in LEARNING_KEYS
        if getattr(cfg, key) != getattr(default, key) and reads(cfg.model, key, cfg)
    ]


def _accuracy(model: torch.nn.Module, p: Probe, ids: np.ndarray, device: Any) -> float:
    logits = predict_logits(model, p.data.samples(ids), 256, p.pad_id, device)
    return float((logits.argmax(-1) == p.data.labels(ids)).mean())


#: Learning settings the control run resets to the model's defaults (the others shape the
#: model's tables, or are the budget, ``max_epoch``, and stay the user's in the control).
CONTROL_KEYS = (
    "learning_rate", "dropout", "ngram_dropout", "weight_decay", "batch_size", "update_freq",
    "lr_scheduler", "warmup_steps", "warmup_ratio", "clip_norm", "loss", "optimizer",
    "class_weight", "precision", "head_learning_rate", "layerwise_lr_decay",
    "freeze_embeddings", "adam_betas", "adam_eps", "adv",
)  # fmt: skip


def _train_and_score(
    p: Probe, model: torch.nn.Module, fit: np.ndarray, held: np.ndarray, **updates: Any
) -> tuple[float, int, float]:
    """Train ``model`` on the rows ``fit`` with the Trainer's own update over its full
    schedule (``cfg`` with ``updates``); returns (held-out accuracy, updates, seconds)."""
    trainer = p.trainer(model, fit, max_loss=None, distill_from=None, **updates)
    st, start = trainer.state, time.perf_counter()
    while st.num_updates < trainer.total_updates:
        trainer.data.set_epoch(st.epoch)
        pos = 0
        while pos < len(trainer.data) and st.num_updates < trainer.total_updates:
            window = trainer.data.window(pos, trainer.window_size)
            trainer._update(window)  # the trainer's own update: it counts num_updates
            pos += len(window)
        st.epoch += 1
    seconds = time.perf_counter() - start
    return _accuracy(trainer.module, p, held, trainer.device), st.num_updates, seconds


def _control_model(p: Probe, defaults: dict[str, Any]) -> torch.nn.Module:
    """The probe's model rebuilt with ``defaults`` for its constructor's learning settings
    (dropout, n-gram dropout), with the template's weights and tables."""
    from xdpx.models import build_model, model_config_from

    cfg = p.cfg.model_copy(update=defaults)
    args = model_config_from(p.cfg.model, cfg, p.meta.vocab_size, p.meta.num_labels, p.pad_id, p.meta)  # fmt: skip
    model = build_model(p.cfg.model, {**p.model_config, **{k: v for k, v in args.items() if k in defaults}})  # fmt: skip
    model.load_state_dict(p.template.state_dict())
    return model.train()


def check_learning(p: Probe) -> Check:
    """Train the config as ``xdpx train`` would on rows of the alignment check's sample and
    score held-out rows of it against the bag-of-tokens reference (LinearSVC on TF-IDF
    1-2-grams of the token ids) fit on the same training rows.

    Sizes: up to :data:`HELD_OUT_ROWS` rows are held out (a third of the sample when
    smaller); the model trains on as many of the others (:data:`MIN_FIT_ROWS` to
    :data:`LEARN_MAX_ROWS`) as its full schedule (``max_epoch`` epochs, or ``max_update``)
    allows in ``p.learning_seconds`` (8 by default), timed by one update of a throwaway copy; the reference sees
    the same rows. With ``m`` the majority-class rate of the held-out rows, ``r`` the
    reference's accuracy, ``a`` the config's and ``se`` the binomial standard error of an
    accuracy on them, the config *keeps up* when ``a - m >= (r - m) / 2`` or ``r - a <= 3
    se``: OK. Otherwise a neural model may just need more rows than the budget gave it, so a
    *control* decides: the same model and rows with the settings that differ from the
    model's defaults (:data:`CONTROL_KEYS`) put back to those defaults, score ``c``:

    * FAIL: ``a <= m + 2 se`` while ``c`` is above that: the configuration ends at the
      majority class where the defaults learn;
    * WARN: ``a - m < (c - m) / 2`` and ``c - a > 3 se``: it keeps less than half of what
      the defaults learn, by more than noise;
    * OK when the control does no better (the settings are not the cause); SKIP when
      nothing differs from the defaults (no suspect: a slow learner on few rows), with
      fewer than :data:`MIN_HELD_OUT` held-out rows, without the reference (alignment not
      OK), or when :data:`MIN_FIT_ROWS` rows would take over twice the budget (a pretrained
      transformer on CPU: run the doctor where it trains).

    The bag-of-tokens reference alone is not the rule: on the demo, textcnn and bilstm at
    their defaults on 300 rows scored 0.606 and 0.538 against 0.72 (docs/doctor.md). The
    settings that differ are named as the suspects (:func:`suspect_settings`).
    """
    max_seconds = p.learning_seconds
    bag = p.shared.get("bag")
    if bag is None or bag["pvalue"] >= 1e-3:
        return Check("skip", "learning", "needs the alignment check's reference (alignment OK)")  # fmt: skip
    ids, y, x = bag["ids"], np.asarray(bag["y"]), bag["x"]
    order = np.random.default_rng(p.cfg.seed).permutation(len(ids))
    n_held = min(HELD_OUT_ROWS, len(ids) // 3)
    if n_held < MIN_HELD_OUT:
        return Check("skip", "learning", f"needs >= {MIN_HELD_OUT} held-out rows (has {n_held} of {len(ids)})")  # fmt: skip
    held, pool = np.sort(order[:n_held]), order[n_held:]
    # one update of a throwaway copy times the config on this machine
    window = p.cfg.batch_size * p.cfg.update_freq
    timing = p.trainer(p.model(dropout=True), ids[pool[:window]], max_loss=None, distill_from=None)  # fmt: skip
    tick = time.perf_counter()
    timing._update(np.arange(min(len(pool), window)))
    per_update = time.perf_counter() - tick
    affordable = int(max_seconds / max(per_update, 1e-6) / max(p.cfg.max_epoch, 1)) * window
    n_fit = min(len(pool), LEARN_MAX_ROWS, max(MIN_FIT_ROWS, affordable))
    fit = np.sort(pool[:n_fit])
    need = math.ceil(n_fit / window) * p.cfg.max_epoch * per_update
    if need > 2 * max_seconds:
        return Check("skip", "learning", f"one update takes {per_update:.2f} s here: {p.cfg.max_epoch} epochs of {n_fit} rows would take ~{need:.0f} s, over the {max_seconds:g} s budget; run the doctor on the machine that trains")  # fmt: skip
    reference = float((bag_classifier().fit(x[fit], y[fit]).predict(x[held]) == y[held]).mean())
    majority = float(np.bincount(y[held]).max() / len(held))
    se = math.sqrt(max(reference * (1 - reference), 0.01) / len(held))
    acc, updates, seconds = _train_and_score(p, p.model(dropout=True), ids[fit], ids[held])
    what = (
        f"trained as configured on {len(fit)} training rows ({updates} updates, "
        f"{seconds:.1f} s), it scores {acc:.3f} on {len(held)} held-out training rows vs "
        f"{reference:.3f} for a bag-of-tokens classifier fit on the same rows (majority "
        f"class {majority:.3f})"
    )
    if acc - majority >= (reference - majority) / 2 or reference - acc <= 3 * se:
        return Check("ok", "learning", what)
    suspects = suspect_settings(p.cfg)
    default = model_defaults(p.cfg.model)
    reset = {k: getattr(default, k) for k in CONTROL_KEYS if getattr(p.cfg, k) != getattr(default, k)}  # fmt: skip
    if not reset:
        return Check("skip", "learning", f"{what}: below the reference, but every learning setting is {p.cfg.model}'s default (a model that needs more rows than the doctor's budget gives it; no suspect to name)")  # fmt: skip
    control, _, _ = _train_and_score(p, _control_model(p, reset), ids[fit], ids[held], **reset)
    what += f"; with {p.cfg.model}'s defaults for {', '.join(reset)} it scores {control:.3f}"
    named = ", ".join(suspects)
    if acc <= majority + 2 * se < control:
        return Check("fail", "learning", f"{what}: it ends at the majority class where the defaults learn; suspects: {named}")  # fmt: skip
    if acc - majority < (control - majority) / 2 and control - acc > 3 * se:
        return Check("warn", "learning", f"{what}: it learns less than half of what the defaults learn; suspects: {named}")  # fmt: skip
    return Check("ok", "learning", f"{what}: the defaults do no better")
