"""Classification metrics (scikit-learn) and each metric's direction.

scikit-learn is imported by the functions that use it, not with the module: the configs
check metric names against :data:`METRIC_DIRECTIONS`, and a process that only reads configs
(``xdpx --help``, prepro, ``stages.distill configs``) need not load it (1-2 s).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "METRIC_DIRECTIONS",
    "is_better",
    "classification_metrics",
    "confusion_matrix",
    "regression_metrics",
]

#: +1 = higher is better, -1 = lower is better. ``loss`` is the mean cross-entropy (nats/sample).
METRIC_DIRECTIONS: dict[str, int] = {
    "accuracy": 1,
    "macro_precision": 1,
    "macro_recall": 1,
    "macro_f1": 1,
    "roc_auc": 1,
    "loss": -1,
    "perplexity": -1,  # task=mlm: exp(loss)
    "pearson": 1,  # task=regression (regression_metrics)
    "spearman": 1,
    "mse": -1,
}


def is_better(metric: str, new: float, best: float | None) -> bool:
    """True when ``new`` beats ``best`` for ``metric`` (strictly); any value beats None."""
    if best is None:
        return True
    return new * METRIC_DIRECTIONS[metric] > best * METRIC_DIRECTIONS[metric]


def confusion_matrix(*args: Any, **kwargs: Any) -> np.ndarray:
    """:func:`sklearn.metrics.confusion_matrix` (same arguments)."""
    from sklearn.metrics import confusion_matrix as cm

    return cm(*args, **kwargs)


def classification_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """Accuracy, macro P/R/F1, ROC-AUC (binary only) and mean cross-entropy.

    Args:
        labels: ``[n]`` int class indices.
        probs: ``[n, num_labels]`` class probabilities (rows sum to 1).

    Returns:
        metric name -> value; ``roc_auc`` only when ``num_labels == 2`` and both
        classes occur in ``labels``.
    """
    from sklearn.metrics import (
        accuracy_score,
        log_loss,
        precision_recall_fscore_support,
        roc_auc_score,
    )

    labels = np.asarray(labels)
    probs = np.asarray(probs, dtype=np.float64)
    num_labels = probs.shape[1]
    preds = probs.argmax(axis=1)
    p, r, f, _ = precision_recall_fscore_support(
        labels, preds, labels=list(range(num_labels)), average="macro", zero_division=0
    )
    out = {
        "accuracy": float(accuracy_score(labels, preds)),
        "macro_precision": float(p),
        "macro_recall": float(r),
        "macro_f1": float(f),
        "loss": float(log_loss(labels, np.clip(probs, 1e-12, 1.0), labels=list(range(num_labels)))),
    }
    if num_labels == 2 and len(np.unique(labels)) == 2:
        out["roc_auc"] = float(roc_auc_score(labels, probs[:, 1]))
    return out


def regression_metrics(scores: np.ndarray, predicted: np.ndarray) -> dict[str, float]:
    """Pearson's and Spearman's correlation of ``predicted`` with the gold ``scores`` (the
    STS-B measures: Cer et al. 2017) and the mean squared error.

    Args:
        scores: ``[n]`` gold scores; predicted: ``[n]`` the model's scores.

    Returns:
        ``{"pearson", "spearman", "mse"}``; a correlation is NaN when either side is
        constant (scipy's definition).
    """
    from scipy.stats import pearsonr, spearmanr

    y, p = np.asarray(scores, np.float64), np.asarray(predicted, np.float64)
    constant = len(y) < 2 or np.ptp(y) == 0 or np.ptp(p) == 0
    return {
        "pearson": float("nan") if constant else float(pearsonr(y, p)[0]),
        "spearman": float("nan") if constant else float(spearmanr(y, p)[0]),
        "mse": float(((y - p) ** 2).mean()) if len(y) else float("nan"),
    }
