"""The training loss of a micro-batch: cross-entropy or squared hinge, class-weighted, or distilled."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xdpx import log as xlog
from xdpx.distill import distill_loss

#: ``class_weight: auto`` weights the classes when the largest train class has at least this
#: many times the samples of the smallest (chosen on the suite's dev splits:
#: docs/benchmark-suite.md).
IMBALANCE_RATIO = 3.0


def resolve_class_weight(setting: str | None, counts: np.ndarray) -> torch.Tensor | None:
    """The class weights of ``train.class_weight`` for train label ``counts``.

    ``balanced``: :func:`balanced_class_weight`; ``auto``: the same when
    ``max(counts) >= IMBALANCE_RATIO * min(counts)`` over the classes present, else None;
    None: None.

    Args:
        setting: ``balanced``, ``auto`` or None.
        counts: ``[num_labels]`` training samples per class.

    Returns:
        ``[num_labels]`` float32, or None (all samples weigh 1).
    """
    present = np.asarray(counts)[np.asarray(counts) > 0]
    if setting == "balanced" or (
        setting == "auto" and len(present) > 1 and present.max() >= IMBALANCE_RATIO * present.min()
    ):
        return balanced_class_weight(counts)
    return None


def balanced_class_weight(counts: np.ndarray) -> torch.Tensor:
    """``n / (num_labels * n_c)`` per class ``c`` with ``n_c`` training samples (0 for a class
    without any), scikit-learn's ``compute_class_weight("balanced")``: the weights of all
    samples sum to ``n``, so the loss keeps the scale of the unweighted one.

    Args:
        counts: ``[num_labels]`` training samples per class (``np.bincount`` of the labels).

    Returns:
        ``[num_labels]`` float32.
    """
    counts = np.asarray(counts, dtype=np.float64)
    weight = np.divide(
        counts.sum(), len(counts) * counts, out=np.zeros_like(counts), where=counts > 0
    )
    return torch.as_tensor(weight, dtype=torch.float32)


def squared_hinge(
    logits: torch.Tensor, y: torch.Tensor, class_weight: torch.Tensor | None = None
) -> torch.Tensor:
    """One-vs-rest squared hinge loss, summed over the batch: for each sample and class
    ``c``, ``max(0, 1 - t_c * logits_c) ** 2`` with ``t_c = +1`` for its class and ``-1``
    otherwise, summed over classes (the L2-loss of ``sklearn.svm.LinearSVC``, liblinear's
    default, Fan et al. 2008, without the regularisation term), each sample's term
    multiplied by its class's ``class_weight``.

    Args:
        logits: ``[batch, num_labels]`` margins; y: ``[batch]`` class indices;
        class_weight: ``[num_labels]`` or None.

    Returns:
        A 0-d float32 tensor.
    """
    logits = logits.float()
    sign = torch.full_like(logits, -1.0).scatter_(1, y.unsqueeze(1), 1.0)
    per_sample = F.relu(1.0 - sign * logits).square().sum(dim=1)
    if class_weight is not None:
        per_sample = per_sample * class_weight[y]
    return per_sample.sum()


def training_loss(
    logits: torch.Tensor,
    y: torch.Tensor,
    idx: np.ndarray,
    class_weight: torch.Tensor | None,
    teacher_logits: torch.Tensor | None,
    cfg: Any,
) -> torch.Tensor:
    """The loss of a micro-batch, *summed* over its samples (the trainer divides by the
    window's sample count, so accumulation over micro-batches is exact).

    Args:
        logits: ``[batch, num_labels]``; y: ``[batch]`` class indices.
        idx: ``[batch]`` sample ids (rows of ``teacher_logits``).
        class_weight: ``[num_labels]`` (``train.class_weight: balanced``) or None.
        teacher_logits: ``[n_train, num_labels]`` (``train.distill_from``) or None.
        cfg: the ``train`` section (``loss``, ``distill_alpha``, ``distill_temperature``).

    Cross-entropy, or :func:`squared_hinge` with ``cfg.loss == "squared_hinge"`` (each
    sample's loss weighted by its class with ``class_weight``); with teacher
    logits, Hinton et al.'s distillation loss (``xdpx.distill.distill_loss``), its parts
    sent to the ``distill_ce`` / ``distill_kl`` summaries (per-sample means).
    """
    if teacher_logits is None and getattr(cfg, "loss", "cross_entropy") == "squared_hinge":
        return squared_hinge(logits, y, class_weight)
    if teacher_logits is None:
        return F.cross_entropy(logits.float(), y, weight=class_weight, reduction="sum")
    teacher = teacher_logits[torch.from_numpy(idx).to(logits.device)]
    loss, ce, kl = distill_loss(logits, y, teacher, cfg.distill_alpha, cfg.distill_temperature)
    xlog.add_summary("distill_ce", ce / len(idx))
    xlog.add_summary("distill_kl", kl / len(idx))
    return loss
