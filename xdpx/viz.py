"""Plots people would rather look at than read: confusion matrix, validation curve.

All figures use the Agg backend and are written through ``xdpx.io`` (atomic).
"""

from __future__ import annotations

import io as _bytes_io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from xdpx import io  # noqa: E402

__all__ = ["save_figure", "confusion_figure", "valid_curve_figure"]


def save_figure(fig: plt.Figure, path: str, dpi: int = 120) -> None:
    """Render ``fig`` to PNG and write it atomically to ``path``; closes the figure."""
    buf = _bytes_io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    io.write_bytes(path, buf.getvalue())


def confusion_figure(cm: np.ndarray, labels: list[str], title: str) -> plt.Figure:
    """Confusion matrix ``[num_labels, num_labels]`` (rows = true, columns = predicted) with counts."""
    fig, ax = plt.subplots(figsize=(1.2 * len(labels) + 2.5, 1.2 * len(labels) + 2))
    im = ax.imshow(cm, cmap="Blues")
    ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_title(title)
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            color = "white" if cm[i, j] > cm.max() / 2 else "black"
            ax.text(j, i, str(int(cm[i, j])), ha="center", va="center", color=color)
    fig.colorbar(im, ax=ax)
    return fig


def valid_curve_figure(valid_log: pd.DataFrame, metric: str, direction: int) -> plt.Figure:
    """Validation ``metric`` against samples seen, red lines at epoch boundaries, green dot at the best.

    Args:
        valid_log: rows of ``valid.log.tsv`` (columns ``samples_seen``, ``epoch``, ``metric``).
        metric: column to plot.
        direction: +1 if higher is better, -1 if lower is better.
    """
    fig, ax = plt.subplots(figsize=(7, 4))
    x, y = valid_log["samples_seen"].to_numpy(), valid_log[metric].to_numpy()
    ax.plot(x, y, marker=".", label=f"valid {metric}")
    epochs = valid_log["epoch"].to_numpy()
    for k in range(1, len(epochs)):
        if epochs[k] != epochs[k - 1]:
            ax.axvline(x[k - 1], color="red", linewidth=0.8, alpha=0.6)
    best = int(np.argmax(y * direction))
    ax.plot([x[best]], [y[best]], "o", color="green", label=f"best {y[best]:.4f}")
    ax.set_xlabel("samples seen")
    ax.set_ylabel(metric)
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    return fig
