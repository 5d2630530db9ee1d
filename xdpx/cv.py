"""k-fold cross-validation, the data half: stratified folds of the prepared train split, one
prepared data directory per fold, and the summary over folds.

``xdpx cv`` (``flows/cv.py``: it runs the stages, which a core module may not import) does,
for ``cv.folds`` = K:

1. :func:`fold_assignment`: scikit-learn's ``StratifiedKFold(K, shuffle=True,
   random_state=cv.seed)`` over the rows of ``train.train_subset`` (``train``) of
   ``train.data_dir``: every row is held out exactly once, and each fold holds, per class,
   ``floor`` or ``ceil`` of (class rows / K).
2. :func:`prepare_folds`: for each fold k (0-based), ``<cv.save_dir>/fold-<k>/data``, a
   prepared data directory with the splits ``train`` (the train rows outside fold k),
   ``dev`` (``train.valid_subset``, unchanged) and ``heldout`` (the train rows in fold k),
   the source's vocab and target map, and ``meta.json`` written last (the directory is
   swapped in whole, as prepro does).
3. per fold, ``stages.train`` on that directory (early stopping and the best checkpoint on
   ``dev``) and ``stages.evaluate`` of its best checkpoint on ``heldout``;
4. :func:`summarize`: for each metric, the mean over folds, its standard error
   (sample standard deviation / sqrt(K)) and a Student-t 95% interval; :func:`format_table`
   prints it.

Why folds of train only, with dev kept whole: training picks its best checkpoint and stops
early on the valid split, so that split must be independent of what is scored. Folding
train + dev together would leave no split for that (or make the held-out fold steer its own
model's selection); here the held-out fold is touched only by the final evaluation. The
vocabulary and the target map are those of the whole train split (prepro builds them once):
token identities only, no labels, so a fold's model sees no held-out label; token ids stay
the same in every fold, and the held-out rows are byte for byte the prepared rows. The
test split is not copied: cross-validation never looks at it.

The K held-out scores are not independent (the training sets overlap by (K-2)/(K-1)),
so the t interval is the usual approximation and tends to be narrow (Bengio & Grandvalet
2004, "No unbiased estimator of the variance of K-fold cross-validation").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xdpx import io
from xdpx.config import ConfigError, Params
from xdpx.data import META_FILE, PreparedMeta, SplitData, SplitMeta, load_split, write_split
from xdpx.data.readers import DataError
from xdpx.data.shards import split_shards

__all__ = [
    "HELDOUT",
    "FoldPaths",
    "FoldData",
    "fold_paths",
    "check_params",
    "check_save_dir",
    "fold_assignment",
    "prepare_folds",
    "write_fold_data",
    "summarize",
    "format_table",
    "build_report",
    "write_report",
]

#: The split of a fold's data directory holding its held-out train rows.
HELDOUT = "heldout"
#: Metrics shown first in the table (the rest follow in the order evaluate writes them).
HEADLINE = ("accuracy", "macro_f1")


@dataclass(frozen=True)
class FoldPaths:
    """The layout of ``<cv.save_dir>/fold-<k>/``.

    Attributes:
        root: the fold directory.
    """

    root: str

    @property
    def data(self) -> str:
        """Prepared data: splits ``train``, ``dev``, ``heldout``."""
        return io.join(self.root, "data")

    @property
    def model(self) -> str:
        """The fold's training run directory (``train.save_dir``)."""
        return io.join(self.root, "model")

    @property
    def metrics_file(self) -> str:
        """evaluate's metrics on ``heldout`` (``{"heldout": {metric: value}}``)."""
        return io.join(self.root, "metrics.json")

    @property
    def confusion_png(self) -> str:
        """evaluate's confusion matrix of ``heldout`` (its curve PNG goes beside it)."""
        return io.join(self.root, "confusion.png")

    @property
    def result(self) -> str:
        """The fold's summary, written when it finished (``fold.json``)."""
        return io.join(self.root, "fold.json")

    @property
    def log(self) -> str:
        """The output of a fold run in its own process (the Prefect flow)."""
        return io.join(self.root, "fold.log")


def fold_paths(save_dir: str, fold: int) -> FoldPaths:
    """``<save_dir>/fold-<fold>`` (``fold`` 0-based)."""
    return FoldPaths(io.join(save_dir, f"fold-{fold}"))


@dataclass(frozen=True)
class FoldData:
    """One fold's prepared data.

    Attributes:
        fold: 0-based fold index.
        data_dir: the fold's prepared data directory.
        n_train: rows of its ``train`` split (the other folds).
        n_heldout: rows of its ``heldout`` split.
        heldout_label_counts: ``[num_labels]`` held-out rows per class index.
    """

    fold: int
    data_dir: str
    n_train: int
    n_heldout: int
    heldout_label_counts: list[int]


def check_params(params: Params) -> None:
    """Reject train settings that a cross-validation run cannot honour, before any work.

    Raises:
        ConfigError: ``train.task`` is not classification, ``train.valid_subset`` equals ``train.train_subset`` (the held-out rows
            would pick the checkpoint), ``train.distill_from`` is set (teacher logits are
            aligned with the whole train split's rows), or ``train.resume``/``resume_from``
            is set (every fold trains from scratch).
    """
    t = params.train
    task = getattr(t, "task", "classification")
    if task != "classification":
        raise ConfigError(f"cv: folds are stratified by label; train.task={task!r} has none")
    if t.valid_subset == t.train_subset:
        raise ConfigError(
            f"cv: train.valid_subset={t.valid_subset!r} is the split being folded; the "
            "held-out rows would choose their own checkpoint (use a separate dev split)"
        )
    if t.distill_from:
        raise ConfigError(
            "cv: train.distill_from aligns teacher logits with every row of the train split; "
            "a fold trains on a subset (set train.distill_from=null)"
        )
    if t.resume or t.resume_from:
        raise ConfigError("cv: every fold trains from scratch; unset train.resume/resume_from")


def check_save_dir(save_dir: str, overwrite: bool) -> None:
    """Make ``save_dir`` ready for a new CV run: refuse one that holds files, or (with
    ``overwrite``) remove it.

    Raises:
        FileExistsError: ``save_dir`` is not empty and ``overwrite`` is false.
    """
    if not io.exists(save_dir):
        return
    entries = [e.rstrip("/").rsplit("/", 1)[-1] for e in io.ls(save_dir)]
    if not entries:
        return
    if not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise FileExistsError(
            f"cv.save_dir: {save_dir} is not empty ({shown}); set cv.overwrite=true to "
            "replace it or pick another cv.save_dir"
        )
    io.rm(save_dir, recursive=True)


def fold_assignment(
    labels: np.ndarray, folds: int, seed: int, label_names: Sequence[str] | None = None
) -> np.ndarray:
    """The held-out fold of every row: stratified, shuffled by ``seed``.

    scikit-learn's ``StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)``:
    each class's rows are spread over the folds so that fold k holds ``floor`` or ``ceil``
    of (class rows / folds) of them.

    Args:
        labels: ``[n]`` int class indices (>= 0).
        folds: K >= 2.
        seed: shuffle seed.
        label_names: class names by index, for the error message.

    Returns:
        ``[n]`` int64 fold index (0..K-1) of each row.

    Raises:
        DataError: a row has no label, or the rarest class present has fewer than K rows
            (some fold would hold none of it); the message names the class and its count.
        ValueError: ``folds < 2``.
    """
    from sklearn.model_selection import StratifiedKFold

    if folds < 2:
        raise ValueError(f"folds must be >= 2, got {folds}")
    labels = np.asarray(labels, dtype=np.int64)
    if len(labels) and labels.min() < 0:
        raise DataError(
            f"{int((labels < 0).sum())} rows have no label; stratified folds need labels"
        )
    counts = np.bincount(labels) if len(labels) else np.zeros(0, dtype=np.int64)
    present = np.flatnonzero(counts)
    if not len(present):
        raise DataError(f"no rows to fold into {folds} folds")
    rare = int(present[np.argmin(counts[present])])
    if counts[rare] < folds:
        name = label_names[rare] if label_names is not None and rare < len(label_names) else rare
        raise DataError(
            f"cv.folds={folds} but class {name!r} has only {int(counts[rare])} rows in the "
            f"split: each of the {folds} held-out folds needs at least one row of every "
            f"class (lower cv.folds to at most {int(counts[rare])})"
        )
    skf = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed)
    out = np.empty(len(labels), dtype=np.int64)
    for k, (_, held) in enumerate(skf.split(np.zeros((len(labels), 1)), labels)):
        out[held] = k
    return out


def _subset(data: SplitData, rows: np.ndarray) -> SplitData:
    return SplitData(
        ids=data.ids[rows],
        input_ids=[data.input_ids[i] for i in rows],
        labels=data.labels[rows],
        input_ids2=[data.input_ids2[i] for i in rows] if data.input_ids2 is not None else None,
    )


def _split_meta(
    data: SplitData, paths: list[str], shard_size: int, source: SplitMeta, meta: PreparedMeta
) -> SplitMeta:
    lengths = data.lengths
    at_max = int((lengths >= meta.max_len).sum()) if source.truncated else 0
    longest = int(lengths.max()) if len(lengths) else 0
    return SplitMeta(
        rows=len(data),
        source=source.source,
        max_length_seen=source.max_length_seen if at_max else longest,
        truncated=at_max,
        has_labels=True,
        shards=len(paths),
        shard_rows={  # write_split: shard i holds rows [i * shard_size, (i + 1) * shard_size)
            p.rsplit("/", 1)[-1]: max(0, min(shard_size, len(data) - i * shard_size))
            for i, p in enumerate(paths)
        },
        label_counts=np.bincount(data.labels, minlength=meta.num_labels).tolist(),
    )


def write_fold_data(
    fold: int,
    src_dir: str,
    meta: PreparedMeta,
    train: SplitData,
    held: np.ndarray,
    out_dir: str,
    train_split: str = "train",
    valid_split: str = "dev",
) -> FoldData:
    """Write one fold's prepared data directory, atomically (swapped in whole).

    Splits: ``train`` (rows of ``train`` where ``held`` is false, in their order),
    :data:`HELDOUT` (rows where it is true) and ``valid_split`` (its shards copied as they
    are, when ``src_dir`` has it); every other top-level file or directory of ``src_dir``
    but the splits (vocab, target map) is copied; ``meta.json`` (the source's, with these
    splits) is written last.

    Args:
        fold: the fold's 0-based index (recorded in the result).
        src_dir: the prepared data directory being folded.
        meta: its meta.json.
        train: its ``train_split`` split, ``[n]`` rows.
        held: ``[n]`` bool, True for the held-out rows.
        out_dir: the fold's data directory (replaced if present).
        train_split: name of the folded split in ``src_dir`` (written as ``train``).
        valid_split: the split kept for early stopping.

    Returns:
        The fold's :class:`FoldData`.

    Raises:
        ValueError: ``held`` is not ``[n]`` or selects no row / every row.
    """
    held = np.asarray(held, dtype=bool)
    if held.shape != (len(train),) or not held.any() or held.all():
        raise ValueError(
            f"held must be a [{len(train)}] mask selecting some but not all rows, got "
            f"shape {held.shape} with {int(held.sum())} selected"
        )
    shard_size = int(meta.prepro.get("shard_size", 50_000))
    tmp = io.tmp_sibling(out_dir.rstrip("/"))
    io.makedirs(tmp)
    try:
        source = meta.split(train_split)
        splits: dict[str, SplitMeta] = {}
        for name, rows in (("train", np.flatnonzero(~held)), (HELDOUT, np.flatnonzero(held))):
            part = _subset(train, rows)
            paths = write_split(
                tmp, name, part.ids, part.input_ids, part.labels, part.input_ids2, shard_size
            )
            splits[name] = _split_meta(part, paths, shard_size, source, meta)
        if valid_split in meta.splits:
            for path, _ in split_shards(src_dir, valid_split):
                io.copy(path, io.join(tmp, valid_split, path.rstrip("/").rsplit("/", 1)[-1]))
            splits[valid_split] = meta.splits[valid_split]
        for entry in io.ls(src_dir):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name in meta.splits or name == META_FILE or name.startswith("."):
                continue
            if io.isdir(entry):
                io.copytree(entry, io.join(tmp, name))
            else:
                io.copy(entry, io.join(tmp, name))
        meta.model_copy(update={"splits": splits}).write(tmp)
        io.replace_dir(tmp, out_dir.rstrip("/"), marker=META_FILE)
    except BaseException:
        io.rm(tmp, recursive=True)
        raise
    counts = splits[HELDOUT].label_counts or []
    return FoldData(fold, out_dir, splits["train"].rows, splits[HELDOUT].rows, list(counts))


def prepare_folds(params: Params) -> list[FoldData]:
    """Fold ``train.train_subset`` of ``train.data_dir`` into ``cv.folds`` data directories
    ``<cv.save_dir>/fold-<k>/data`` (see the module docstring).

    The split is read into memory once (``[n]`` rows); each fold's directory is written
    with the source's ``prepro.shard_size``.

    Returns:
        One :class:`FoldData` per fold, k = 0..K-1.

    Raises:
        FileNotFoundError: ``train.data_dir`` has no meta.json (run prepro first).
        DataError: the split is missing, has unlabelled rows, or a class has fewer than K
            rows.
        FileExistsError: ``cv.save_dir`` is not empty and ``cv.overwrite`` is false
            (:func:`check_save_dir`; with ``cv.overwrite`` it is emptied first). Nothing is
            written before these checks pass.
    """
    src = params.train.data_dir
    meta = PreparedMeta.read(src)
    split = params.train.train_subset
    meta.split(split)  # DataError naming the splits there are
    train = load_split(src, split)
    assignment = fold_assignment(train.labels, params.cv.folds, params.cv.seed, meta.labels)
    check_save_dir(params.cv.save_dir, params.cv.overwrite)  # all checks passed: now write
    valid = params.train.valid_subset
    return [
        write_fold_data(
            k,
            src,
            meta,
            train,
            assignment == k,
            fold_paths(params.cv.save_dir, k).data,
            split,
            valid,
        )
        for k in range(params.cv.folds)
    ]


def summarize(per_fold: Sequence[Mapping[str, float]]) -> dict[str, dict[str, Any]]:
    """Mean, standard error and Student-t 95% interval of each metric over K folds.

    ``se`` = sample standard deviation (ddof=1) / sqrt(K); the interval is ``mean -+
    t_{0.975, K-1} * se`` with the t quantile from ``scipy.stats.t.ppf`` (the usual small-
    sample interval for a mean; the folds share training rows, so it is approximate).

    Args:
        per_fold: K >= 2 mappings metric -> value (the held-out metrics of each fold); a
            metric missing from some fold (``roc_auc`` with one class held out) is left out.

    Returns:
        metric -> ``{"mean", "std", "se", "ci95": [low, high], "t": t quantile, "values":
        [K values in fold order]}``, metrics in the order of the first fold.

    Raises:
        ValueError: fewer than 2 folds.
    """
    from scipy import stats

    k = len(per_fold)
    if k < 2:
        raise ValueError(f"summarize needs at least 2 folds, got {k}")
    names = [m for m in per_fold[0] if all(m in f for f in per_fold)]
    t = float(stats.t.ppf(0.975, k - 1))
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        values = np.array([float(f[name]) for f in per_fold], dtype=np.float64)
        mean = float(values.mean())
        std = float(values.std(ddof=1))
        se = std / math.sqrt(k)
        out[name] = {
            "mean": mean,
            "std": std,
            "se": se,
            "ci95": [mean - t * se, mean + t * se],
            "t": t,
            "values": values.tolist(),
        }
    return out


def format_table(summary: Mapping[str, Mapping[str, Any]]) -> str:
    """The summary as a plain-text table: one row per metric (accuracy, macro_f1 first),
    mean ± SE, the 95% interval and each fold's value."""
    names = [m for m in HEADLINE if m in summary] + [m for m in summary if m not in HEADLINE]
    if not names:
        return ""
    k = len(next(iter(summary.values()))["values"])
    head = ["metric", "mean ± SE", "95% CI"] + [f"fold {i}" for i in range(k)]
    rows = [head]
    for name in names:
        s = summary[name]
        lo, hi = s["ci95"]
        rows.append(
            [name, f"{s['mean']:.4f} ± {s['se']:.4f}", f"[{lo:.4f}, {hi:.4f}]"]
            + [f"{v:.4f}" for v in s["values"]]
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def build_report(
    params: Params, folds: Sequence[Mapping[str, Any]], seconds: float
) -> dict[str, Any]:
    """The content of ``cv.report``.

    Args:
        params: the run's params.
        folds: each fold's result (``fold.json``: ``fold``, ``heldout`` metrics, ...), in
            fold order.
        seconds: wall time of the whole run (seconds).

    Returns:
        ``{"folds", "seed", "data_dir", "split", "valid_split", "save_dir", "seconds",
        "per_fold": [...], "summary": {metric: {...}} (:func:`summarize`), "table"}``.
    """
    summary = summarize([f["heldout"] for f in folds])
    return {
        "folds": params.cv.folds,
        "seed": params.cv.seed,
        "data_dir": params.train.data_dir,
        "split": params.train.train_subset,
        "valid_split": params.train.valid_subset,
        "save_dir": params.cv.save_dir,
        "seconds": round(seconds, 1),
        "per_fold": list(folds),
        "summary": summary,
        "table": format_table(summary),
    }


def write_report(path: str, report: Mapping[str, Any]) -> str:
    """Write the report as JSON, atomically; returns ``path``."""
    io.write_text(path, json.dumps(report, indent=2) + "\n")
    return path
