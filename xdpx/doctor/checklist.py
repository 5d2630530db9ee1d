"""The training checklists of ``xdpx doctor``, run on the user's own config, data and model.

When a model does not learn, experienced engineers go through a checklist by hand: the
Hugging Face course's "Debugging the training pipeline" (decode a batch back to text, check
the labels and ``num_labels``, look at the first loss, overfit one batch, check the learning
rate), self-check lists for non-converging models (data/label alignment, padding masks,
loss reduction under gradient accumulation, ``DistributedSampler.set_epoch``) and framework
FAQs (NaN loss, out-of-range labels). Each function here runs one item of those lists
through xdpx's own code paths (``stages.train``'s model building, the Trainer's data order,
micro-batching and update) and returns a :class:`Check`: OK, WARN or FAIL with one line
naming the cause and what to change, or SKIP saying why the check does not apply.

:func:`run_checklist` runs them all (seconds on 2 CPU cores for the demo);
``fast=True`` is the subset that ``train.preflight_doctor`` runs before training (all but
the two that train: overfitting one batch and the learning check). Every check works on a
fresh copy of the model built exactly as ``stages.train`` builds it (same seed, same
``prepare``: the probe, :mod:`xdpx.doctor.checks`); nothing is written.

The checks live in a module per family: :mod:`xdpx.doctor.data_checks` (the first batch,
``num_labels``, inputs, label alignment and split consistency),
:mod:`xdpx.doctor.optimization` (learning rate, schedule, initial loss),
:mod:`xdpx.doctor.gradients` (padding, gradient flow, data order, reduction) and
:mod:`xdpx.doctor.fitting` (overfitting one batch, the learning check); this module orders
and runs them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from typing import Any

import torch

from xdpx.config import TrainConfig
from xdpx.doctor.checks import LEARN_SECONDS, Check, Probe
from xdpx.doctor.data_checks import (
    check_alignment,
    check_first_batch,
    check_inputs,
    check_num_labels,
    check_split_consistency,
)
from xdpx.doctor.fitting import check_learning, check_overfit_batch
from xdpx.doctor.gradients import check_data_order, check_grad_flow, check_padding, check_reduction
from xdpx.doctor.label_checks import check_label_issues, check_shortcuts
from xdpx.doctor.optimization import (
    LR_RANGES,
    check_initial_loss,
    check_learning_rate,
    check_schedule,
)
from xdpx.errors import PreflightError
from xdpx.train.setup import TrainSetup

__all__ = [
    "Check",
    "FAST",
    "LR_RANGES",
    "Probe",
    "run_checklist",
    "preflight_doctor",
]


#: Checks in the fast subset (``train.preflight_doctor``, ``xdpx doctor --fast``).
FAST = (
    "first_batch",
    "num_labels",
    "inputs",
    "alignment",
    "split_consistency",
    "label_issues",
    "shortcuts",
    "learning_rate",
    "schedule",
    "initial_loss",
    "padding",
    "grad_flow",
    "data_order",
    "reduction",
)


#: Every check in run order: ``(name, function)``.
CHECKS: list[tuple[str, Callable[[Probe], Check]]] = [
    ("first_batch", check_first_batch),
    ("num_labels", check_num_labels),
    ("inputs", check_inputs),
    ("alignment", check_alignment),
    ("split_consistency", check_split_consistency),
    ("label_issues", check_label_issues),
    ("shortcuts", check_shortcuts),
    ("learning_rate", check_learning_rate),
    ("schedule", check_schedule),
    ("initial_loss", check_initial_loss),
    ("padding", check_padding),
    ("grad_flow", check_grad_flow),
    ("data_order", check_data_order),
    ("reduction", check_reduction),
    ("overfit_batch", check_overfit_batch),
    ("learning", check_learning),
]


#: Checks skipped after a FAIL of another: ``{failed check: checks that need it to pass}``
#: (sound labels and logits; gradients that reach the model).
_NEEDS = {
    "num_labels": {
        "initial_loss",
        "padding",
        "grad_flow",
        "reduction",
        "overfit_batch",
        "learning",
    },  # fmt: skip
    "inputs": {"initial_loss", "padding", "grad_flow", "reduction", "overfit_batch", "learning"},
    "grad_flow": {"reduction", "overfit_batch", "learning"},
}


def run_checklist(
    cfg: TrainConfig,
    fast: bool = False,
    on_check: Callable[[Check], None] | None = None,
    setup: TrainSetup | None = None,
    skip: Collection[str] = (),
    learning_seconds: float = LEARN_SECONDS,
) -> list[Check]:
    """Run the training checklist on the data and model of ``cfg``.

    Args:
        cfg: the ``train`` section (data_dir, model, batch_size, update_freq, ...).
        fast: only :data:`FAST` (no overfitting: what ``train.preflight_doctor`` runs).
        on_check: called with each finding as soon as it is made (progress output).
        setup: ``cfg`` resolved by :func:`xdpx.train.setup.resolve` when the caller has it.
        skip: names of :data:`CHECKS` not to run (e.g. ``learning``, the slowest).
        learning_seconds: the learning check's training budget in seconds of this machine
            (:func:`xdpx.doctor.fitting.check_learning`): the rows it trains on are what the
            budget affords, from 300 to 1,000, so a busy or slow machine judges on fewer rows;
            a large budget takes all the sample's training rows, up to 1,000 (same rows, same
            verdict on any machine).

    Returns:
        The findings in :data:`CHECKS` order. A check that raises becomes a FAIL naming the
        error; the checks that need sound labels and logits are SKIPped after a FAIL of
        ``num_labels`` or ``inputs``, those that need gradients after one of ``grad_flow``. ``task: mlm`` gets one SKIP: these checks are for
        classification.
    """
    out: list[Check] = []

    def emit(c: Check) -> None:
        out.append(c)
        if on_check is not None:
            on_check(c)

    if cfg.task != "classification":
        emit(Check("skip", "checklist", f"train.task={cfg.task}: the training checks are for classification (labels, logits); run them on the fine-tuning config"))  # fmt: skip
        return out
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    try:
        probe = Probe.open(cfg, setup)
        probe.learning_seconds = learning_seconds
    except Exception as e:  # noqa: BLE001 - reported, not raised: the doctor goes on
        emit(Check("fail", "model", f"cannot build {cfg.model} on {cfg.data_dir}: {e}"))
        return out
    emit(Check("ok", "model", f"{cfg.model}: {sum(t.numel() for t in probe.template.parameters()):,} parameters, {len(probe.data):,} training samples, built as stages.train does", seconds=time.perf_counter() - start))  # fmt: skip
    failed: list[str] = []
    try:
        for name, fn in CHECKS:
            if (fast and name not in FAST) or name in skip:
                continue
            t0 = time.perf_counter()
            blocked = [f for f in failed if name in _NEEDS.get(f, ())]
            if blocked:
                c = Check("skip", name, f"needs {' and '.join(blocked)} to pass (see its FAIL above)")  # fmt: skip
            else:
                try:
                    c = fn(probe)
                except Exception as e:  # noqa: BLE001
                    c = Check("fail", name, f"the check crashed: {type(e).__name__}: {e}")
            c.seconds = time.perf_counter() - t0
            if c.status == "fail":
                failed.append(name)
            emit(c)
    finally:
        probe.close()
    return out


def preflight_doctor(cfg: TrainConfig, setup: TrainSetup | None = None) -> None:
    """``train.preflight_doctor``: run the fast subset of ``xdpx doctor``'s training checks
    (:data:`xdpx.doctor.checklist.FAST`) before anything is written; log each finding.
    ``setup``: ``cfg`` resolved already (``stages.train``), so meta.json is not read again.

    Raises:
        PreflightError: a check failed; the message names each failed check and its fix.
    """

    def show(c: Any) -> None:
        level = {"fail": logging.ERROR, "warn": logging.WARNING}.get(c.status, logging.INFO)
        logging.getLogger("xdpx.train").log(level, "preflight_doctor %s", c.line())

    fails = [c for c in run_checklist(cfg, fast=True, on_check=show, setup=setup) if c.status == "fail"]  # fmt: skip
    if fails:
        raise PreflightError(
            f"train.preflight_doctor: {len(fails)} check(s) failed before training: "
            + " | ".join(f"{c.name}: {c.detail}" for c in fails)
            + " (`xdpx doctor` prints the full report; train.preflight_doctor=false skips it)"
        )
