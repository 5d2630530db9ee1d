"""The training loss of a micro-batch: cross-entropy, class-weighted or distilled."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from xdpx import log as xlog
from xdpx.distill import distill_loss


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
        cfg: the ``train`` section (``distill_alpha``, ``distill_temperature``).

    Cross-entropy (each sample's weighted by its class with ``class_weight``); with teacher
    logits, Hinton et al.'s distillation loss (``xdpx.distill.distill_loss``), its parts
    sent to the ``distill_ce`` / ``distill_kl`` summaries (per-sample means).
    """
    if teacher_logits is None:
        return F.cross_entropy(logits.float(), y, weight=class_weight, reduction="sum")
    teacher = teacher_logits[torch.from_numpy(idx).to(logits.device)]
    loss, ce, kl = distill_loss(logits, y, teacher, cfg.distill_alpha, cfg.distill_temperature)
    xlog.add_summary("distill_ce", ce / len(idx))
    xlog.add_summary("distill_kl", kl / len(idx))
    return loss
