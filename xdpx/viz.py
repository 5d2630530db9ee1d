"""Plots people would rather look at than read: confusion matrix, validation and learning curves.

All figures use the Agg backend and are written through ``xdpx.io`` (atomic).
``learning_curves_figure`` is XDPX's ``x-viz``: every logged metric of a run
against samples seen, optionally overlaid with other runs.
"""

from __future__ import annotations

import io as _bytes_io
import math
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from xdpx import io  # noqa: E402

__all__ = [
    "save_figure",
    "confusion_figure",
    "valid_curve_figure",
    "learning_curves_figure",
    "plot_learning_curves",
]


def save_figure(
    fig: plt.Figure, path: str, dpi: int = 120, metadata: dict[str, str | None] | None = None
) -> None:
    """Render ``fig`` to PNG and write it atomically to ``path``; closes the figure.

    Args:
        metadata: PNG text chunks (``fig.savefig``'s ``metadata``; a None value drops
            matplotlib's default of that key, e.g. ``Software``). The PNG has no timestamp
            either way: the same figure and matplotlib give the same bytes.
    """
    buf = _bytes_io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata=metadata)
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


#: Curve colours of the runs (tab10 without red and green: those mark epochs and the best).
RUN_COLORS = ["C0", "C1", "C4", "C5", "C6", "C7", "C8", "C9"]
#: ``train.log.tsv`` columns drawn as panels besides the ``add_summary`` ones.
TRAIN_PANELS = ("loss", "accuracy")


def _train_panels(train_log: pd.DataFrame) -> list[str]:
    """``train/loss``, ``train/accuracy``, then ``train/<name>`` for each ``add_summary`` column."""
    from xdpx.train.runlog import TIME_COLUMNS, TRAIN_COLUMNS

    # runs from before time.log.tsv carry wall_time in train.log.tsv: not a panel
    extra = [c for c in train_log.columns if c not in TRAIN_COLUMNS + TIME_COLUMNS]
    return [f"train/{c}" for c in (*TRAIN_PANELS, *extra) if c in train_log.columns]


def _valid_panels(valid_log: pd.DataFrame | None) -> list[str]:
    """``valid/<metric>`` for each metric column of ``valid.log.tsv`` (not positions, not ``best_*``)."""
    from xdpx.scripts import POSITION_COLUMNS

    if valid_log is None:
        return []
    return [
        f"valid/{c}"
        for c in valid_log.columns
        if c not in POSITION_COLUMNS and not c.startswith("best_")
    ]


def _epoch_boundaries(
    result: dict | None, train_log: pd.DataFrame, valid_log: pd.DataFrame | None
) -> list[float]:
    """Samples seen at the end of each epoch, up to the run's last samples seen.

    ``k * samples_per_epoch`` (``result.json``) for ``k = 1, 2, ...``; without
    it, the largest ``samples_seen`` logged in each epoch that a later epoch
    follows (exact for epoch-end evaluation, else the last logged row).
    """
    frames = [f[["epoch", "samples_seen"]] for f in (train_log, valid_log) if f is not None]
    rows = pd.concat(frames, ignore_index=True).dropna()
    if rows.empty:
        return []
    last = float(rows["samples_seen"].max())
    per_epoch = int((result or {}).get("samples_per_epoch") or 0)
    if per_epoch > 0:
        return [float(k * per_epoch) for k in range(1, int(last // per_epoch) + 1)]
    ends = rows.groupby("epoch")["samples_seen"].max().sort_index()
    return [float(x) for x in ends.iloc[:-1]]


def _run_labels(dirs: Sequence[str]) -> list[str]:
    """Base names of the run directories; a name shared by several runs is replaced by the full path."""
    names = [str(d).rstrip("/").rsplit("/", 1)[-1] for d in dirs]
    return [n if names.count(n) == 1 else str(d) for n, d in zip(names, dirs, strict=True)]


def learning_curves_figure(
    run_dir: str, ref_dirs: Sequence[str] = (), metrics: Sequence[str] | None = None
) -> plt.Figure:
    """Learning curves of a training run: one panel per logged metric against samples seen.

    Panels, in order: ``train/loss``, ``train/accuracy``, each
    ``xdpx.log.add_summary`` column of ``train.log.tsv`` (``train/<name>``),
    then each metric of ``valid.log.tsv`` (``valid/<metric>``), titled
    ``"train loss"``, ``"valid accuracy"`` ..., on a grid of up to 3 columns
    (unused grid cells are removed). The x axis of every panel is samples
    seen (``"samples seen"``), so runs with different batch sizes line up.

    Marks (main run only): red vertical lines at the epoch boundaries
    ``k * samples_per_epoch`` (``result.json``; fallback: the last logged
    samples seen of each finished epoch) up to the run's last samples seen,
    and in every valid panel a green dot at the best evaluation: the
    ``valid.log.tsv`` row of ``result.json`` ``best_update`` (fallback: best
    by the major metric and its direction), each panel showing that row's
    value of its own metric.

    Args:
        run_dir: training run directory (``train.save_dir``; local or fsspec URL).
        ref_dirs: other runs overlaid on the same panels (where they log the
            metric); every panel then gets a legend of run directory base names.
        metrics: panel keys to draw (e.g. ``["train/loss", "valid/accuracy"]``); None = all.

    Returns:
        The figure (close it, or pass it to ``save_figure``).

    Raises:
        FileNotFoundError: a run directory or its ``train.log.tsv`` is missing
            (the message names the path).
        ValueError: ``metrics`` names a panel the run does not have.
    """
    from xdpx.scripts import best_valid_row, read_log, read_result

    dirs = [run_dir, *ref_dirs]
    for d in dirs:
        if not io.isdir(d):
            raise FileNotFoundError(f"{d} not found: expected a training run directory")
    logs = [(read_log(d, "train"), read_log(d, "valid", required=False)) for d in dirs]
    train_log, valid_log = logs[0]
    panels = _train_panels(train_log) + _valid_panels(valid_log)
    if metrics is not None:
        unknown = [m for m in metrics if m not in panels]
        if unknown:
            raise ValueError(f"{run_dir} has no panel {unknown}; available: {panels}")
        panels = [p for p in panels if p in metrics]
    if not panels:
        raise ValueError(f"{run_dir}: train.log.tsv and valid.log.tsv hold no metric to plot")
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.4 * nrows), squeeze=False)
    flat = axes.ravel()
    for ax in flat[len(panels) :]:
        ax.remove()
    boundaries = _epoch_boundaries(read_result(run_dir), train_log, valid_log)
    best = best_valid_row(run_dir, valid_log) if valid_log is not None else None
    labels = _run_labels(dirs)
    for ax, panel in zip(flat, panels, strict=False):
        split, metric = panel.split("/", 1)
        for i, (label, (t_log, v_log)) in enumerate(zip(labels, logs, strict=True)):
            frame = t_log if split == "train" else v_log
            if frame is None or metric not in frame.columns:
                continue
            ax.plot(
                frame["samples_seen"].to_numpy(),
                frame[metric].to_numpy(dtype=float),
                marker="." if split == "valid" else None,
                color=RUN_COLORS[i % len(RUN_COLORS)],
                label=label,
            )
        for x in boundaries:
            ax.axvline(x, color="red", linewidth=0.8, alpha=0.6)
        if split == "valid" and best is not None:
            ax.plot(
                [float(best["samples_seen"])],
                [float(best[metric])],
                "o",
                color="green",
                markersize=7,
                zorder=5,
                label=f"best (update {int(best['update'])})" if ref_dirs else None,
            )
        ax.set_title(f"{split} {metric}")
        ax.set_xlabel("samples seen")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        if ref_dirs:
            ax.legend(loc="best", fontsize="small")
    fig.suptitle(labels[0])
    fig.tight_layout()
    return fig


def plot_learning_curves(run_dir: str, out_png: str, ref_dirs: Sequence[str] = ()) -> str:
    """Write ``learning_curves_figure(run_dir, ref_dirs)`` to ``out_png`` (PNG, atomic); returns ``out_png``.

    Raises:
        FileNotFoundError / ValueError: as ``learning_curves_figure``.
    """
    save_figure(learning_curves_figure(run_dir, ref_dirs), out_png)
    return out_png
