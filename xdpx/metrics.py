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
    "paired_comparison",
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


def paired_comparison(
    labels: np.ndarray,
    pred_a: np.ndarray,
    pred_b: np.ndarray,
    metric: str = "accuracy",
    probs_a: np.ndarray | None = None,
    probs_b: np.ndarray | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> dict[str, float | int | str]:
    """Model A against model B on the same texts: the difference of ``metric`` with its
    paired standard error, and a paired significance test.

    For ``accuracy`` the difference is the mean of ``d_i = [a_i right] - [b_i right]`` and its
    standard error ``sd(d) / sqrt(n)`` (ddof 1); the test is McNemar's exact test on the
    discordant texts (``a_right_b_wrong`` vs ``a_wrong_b_right``, a two-sided binomial test
    at 1/2: McNemar 1947; Dietterich 1998, "Approximate Statistical Tests for Comparing
    Supervised Classification Learning Algorithms", sec. 3.1). For another metric (macro-F1,
    ...) the standard error and the two-sided p are from a paired bootstrap over the texts
    (``resamples`` draws of n texts with replacement, both models on the same draw; Efron &
    Tibshirani 1993, ch. 16; the p is twice the smaller share of draws on either side of 0).

    Args:
        labels: ``[n]`` int gold classes.
        pred_a, pred_b: ``[n]`` int predicted classes of A and B, row-aligned with ``labels``.
        metric: a :func:`classification_metrics` key (higher is better).
        probs_a, probs_b: ``[n, num_labels]`` probabilities (needed for ``roc_auc`` and
            ``loss``; otherwise one-hot from the predictions).
        resamples, seed: the bootstrap's draws and RNG seed (unused for accuracy).

    Returns:
        ``{"metric", "n", "a", "b", "diff", "se", "z", "p", "method", "a_only", "b_only"}``:
        scores of A and B, ``diff = a - b``, its paired ``se`` (0 when the models agree
        everywhere), ``z = diff / se`` (0 when se is 0), the two-sided ``p``, the test's
        name, and the discordant counts (A right where B is wrong and the reverse).

    Raises:
        ValueError: the arrays are not of one length, or empty.
    """
    y = np.asarray(labels)
    a, b = np.asarray(pred_a), np.asarray(pred_b)
    n = len(y)
    if n == 0 or len(a) != n or len(b) != n:
        raise ValueError(
            f"paired_comparison: lengths {n}, {len(a)}, {len(b)} must be equal and > 0"
        )
    ra, rb = (a == y), (b == y)
    a_only, b_only = int((ra & ~rb).sum()), int((~ra & rb).sum())
    if metric == "accuracy":
        from scipy.stats import binomtest

        d = ra.astype(np.float64) - rb.astype(np.float64)
        sa, sb = float(ra.mean()), float(rb.mean())
        se = float(d.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0
        discordant = a_only + b_only
        p = float(binomtest(a_only, discordant, 0.5).pvalue) if discordant else 1.0
        method = "McNemar exact"
    else:
        k = int(max(y.max(), a.max(), b.max())) + 1

        def onehot(pred: np.ndarray) -> np.ndarray:
            return np.eye(k)[pred]

        pa = onehot(a) if probs_a is None else np.asarray(probs_a)
        pb = onehot(b) if probs_b is None else np.asarray(probs_b)
        sa = classification_metrics(y, pa)[metric]
        sb = classification_metrics(y, pb)[metric]
        rng = np.random.default_rng(seed)
        diffs = np.empty(resamples)
        for i in range(resamples):
            idx = rng.integers(0, n, n)
            diffs[i] = classification_metrics(y[idx], pa[idx]).get(
                metric, np.nan
            ) - classification_metrics(y[idx], pb[idx]).get(metric, np.nan)
        diffs = diffs[np.isfinite(diffs)]
        se = float(diffs.std(ddof=1)) if len(diffs) > 1 else 0.0
        p = (
            float(min(1.0, 2 * min((diffs <= 0).mean(), (diffs >= 0).mean())))
            if len(diffs)
            else 1.0
        )
        method = f"paired bootstrap ({resamples})"
    diff = float(sa - sb)
    return {
        "metric": metric,
        "n": n,
        "a": float(sa),
        "b": float(sb),
        "diff": diff,
        "se": se,
        "z": diff / se if se > 0 else 0.0,
        "p": p,
        "method": method,
        "a_only": a_only,
        "b_only": b_only,
    }
