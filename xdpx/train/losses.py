"""The classification loss of a micro-batch: cross-entropy or squared hinge, class-weighted."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

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
    logits: torch.Tensor, y: torch.Tensor, class_weight: torch.Tensor | None, cfg: Any
) -> torch.Tensor:
    """The classification loss of a micro-batch, *summed* over its samples (the trainer
    divides by the window's sample count, so accumulation over micro-batches is exact).

    Args:
        logits: ``[batch, num_labels]``; y: ``[batch]`` class indices.
        class_weight: ``[num_labels]`` (``train.class_weight: balanced``) or None.
        cfg: the ``train`` section (``loss``).

    Cross-entropy, or :func:`squared_hinge` with ``cfg.loss == "squared_hinge"`` (each
    sample's loss weighted by its class with ``class_weight``). Distillation's loss is
    :class:`xdpx.train.objectives.Distillation`'s.
    """
    if getattr(cfg, "loss", "cross_entropy") == "squared_hinge":
        return squared_hinge(logits, y, class_weight)
    return F.cross_entropy(logits.float(), y, weight=class_weight, reduction="sum")
